"""Diagnostics: the finding type, ignore comments, and output renderers.

Codes are stable: once published a code keeps its meaning and is never reused, so that
``# plangen: ignore[PG101]`` comments and CI filters keep working. Ranges: PG0xx file structure,
PG1xx styles and their arguments (level 1, from the source), PG2xx the plan against the model
(level 2, meta device), PG3xx the plan run on CPU (level 3, ``--run``). Each code is a rule class
that carries its own story (:mod:`plangen.check.rule`); :mod:`plangen.check.codes` collects them
into the registry and ``docs/diagnostics.md``.

Severity: most codes are errors (exit status 1). A warning (PG209, PG210) reports something that
is right but likely not what was meant; it is shown with ``warning:`` before its message and
changes the exit status only under ``--strict``. The rule that emits a finding gives its severity.

This module imports nothing heavy: the CLI uses it to render results.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping

from plangen.check.rule import Severity


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding; ``line`` and ``col`` are 1-based, as editors and CI annotations expect."""

    path: str
    line: int
    col: int
    code: str
    message: str
    # The emitting rule's: a code always has one severity.
    severity: Severity = field(default="error", compare=False)


# --- ignore comments -------------------------------------------------------------------------

IGNORE_ALL: frozenset[str] = frozenset({"*"})
_IGNORE = re.compile(r"plangen:\s*ignore(?:\[(?P<codes>[^\]]*)\])?")


def parse_ignore_comment(comment: str) -> frozenset[str] | None:
    """The codes a ``# plangen: ignore[...]`` comment silences, :data:`IGNORE_ALL`, or None."""
    match = _IGNORE.search(comment)
    if match is None:
        return None
    if match.group("codes") is None:
        return IGNORE_ALL
    return frozenset(code.strip().upper() for code in match.group("codes").split(",") if code.strip())


# Findings that mean nothing could be checked (the file does not parse, or cannot be imported): a
# bare ``# plangen: ignore`` would turn them into a clean verdict, so only naming the code silences them.
NOTHING_CHECKED = frozenset({"PG001", "PG201"})


def drop_ignored(diagnostics: Iterable[Diagnostic], ignores: Mapping[int, frozenset[str]]) -> list[Diagnostic]:
    """Drop the diagnostics silenced by an ignore comment on their line."""
    kept = []
    for diagnostic in diagnostics:
        codes = ignores.get(diagnostic.line)
        blanket = codes is not None and "*" in codes and diagnostic.code not in NOTHING_CHECKED
        if codes is not None and (blanket or diagnostic.code in codes):
            continue
        kept.append(diagnostic)
    return kept


# --- renderers -------------------------------------------------------------------------------


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    github = "github"


def _prefix(diagnostic: Diagnostic) -> str:
    return "warning: " if diagnostic.severity == "warning" else ""


def render_text(diagnostics: Iterable[Diagnostic]) -> str:
    return "".join(f"{d.path}:{d.line}:{d.col}: {d.code} {_prefix(d)}{d.message}\n" for d in diagnostics)


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps([asdict(d) for d in diagnostics], indent=2) + "\n"


def _escape_github_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_github_property(text: str) -> str:
    return _escape_github_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(diagnostics: Iterable[Diagnostic]) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on the file."""
    return "".join(
        f"::{'warning' if d.severity == 'warning' else 'error'} file={_escape_github_property(d.path)},"
        f"line={d.line},col={d.col},"
        f"title={d.code}::{_escape_github_data(d.message)}\n"
        for d in diagnostics
    )


RENDERERS: dict[OutputFormat, Callable[[Iterable[Diagnostic]], str]] = {
    OutputFormat.text: render_text,
    OutputFormat.json: render_json,
    OutputFormat.github: render_github,
}


def render(diagnostics: Iterable[Diagnostic], output_format: OutputFormat | str = OutputFormat.text) -> str:
    return RENDERERS[OutputFormat(output_format)](sorted(diagnostics))

"""The registry of diagnostic codes, collected from the rules that emit them, and its docs.

Each code's story (title, explanation, wrong and right examples, severity) is declared on its rule
class, beside the code that emits it (:class:`plangen.check.rule.Rule`): level 1 in
:mod:`plangen.check.rules.static`, level 2 in :mod:`plangen.check.rules.model`, the loader's PG201 in
:mod:`plangen.check.model`, level 3 in :mod:`plangen.check.rules.run`. This module only collects them
(:func:`plangen.check.rules.discover_all`): :data:`CODES` and
``docs/diagnostics.md`` (``python -m plangen.check.codes > docs/diagnostics.md``; a test keeps the
committed file equal to it).

Importing this module imports the level-2 rules, hence torch: the CLI never does (findings carry
their severity from the rule that emitted them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from plangen.check.rule import CodeInfo, Rule
from plangen.check.rules import discover_all

# Every rule of every level, in code order.
RULE_CLASSES: tuple[type[Rule], ...] = discover_all()


def build_codes(rules: tuple[type[Rule], ...] = RULE_CLASSES) -> dict[str, CodeInfo]:
    """Code -> story, in code order; a code owned by two rules is a programming error."""
    codes: dict[str, CodeInfo] = {}
    for rule in sorted(rules, key=lambda r: r.code):
        if rule.code in codes:
            raise ValueError(f"{rule.code} is declared by two rules")
        codes[rule.code] = rule.info()
    return codes


CODES: dict[str, CodeInfo] = build_codes()

# How far verify's "clean" held over generated, edited plans run for real: measured and written by
# scripts/confusion_matrix.py (tests/test_verify_property.py checks it), rendered below.
CONFUSION_PATH = Path(__file__).with_name("confusion.json")


def severity_of(code: str) -> str:
    info = CODES.get(code)
    return info.severity if info is not None else "error"


def render_diagnostics_doc(codes: Mapping[str, CodeInfo] | None = None) -> str:
    """The text of ``docs/diagnostics.md``: every code's story, from its rule."""
    codes = CODES if codes is None else codes
    lines = [
        "# plangen diagnostics",
        "",
        "<!-- Generated from the rules in plangen/check/ by"
        " `python -m plangen.check.codes > docs/diagnostics.md`; do not edit by hand. -->",
        "",
        "`plangen verify` reports findings as `path:line:col: CODE message`. Codes are stable and never"
        " reused: PG0xx concern the file's structure and PG1xx the styles and their arguments (level 1,"
        " read from the source, never run); PG2xx the plan against its model on the meta device (level 2,"
        " the default with level 1: the file is imported as the runtime imports it, its prints go to"
        " stderr), and, where those find no error, on a shrunk model of the same architecture (PG214,"
        " PG215); PG3xx the plan run on CPU (level 3, `--run`). A level runs on a file only when the"
        " levels before it found no error there.",
        "",
        "Examples of levels 2 and 3 name their model as generated files do (`PLANGEN_MODEL`,"
        " `PLANGEN_TP_SIZE`, `PLANGEN_SEQUENCE_PARALLEL`), which is what verify uses when `--model`,"
        " `--tp-size` and `--sequence-parallel` are not given.",
        "",
        "Errors set the exit status to 1. Warnings are printed with `warning:` before the message and set"
        " it only under `--strict`.",
        "",
        "A trailing comment silences findings on its line: `# plangen: ignore[PG101]`,"
        " `# plangen: ignore[PG101,PG107]`, or `# plangen: ignore` for every code except those that mean"
        " nothing could be checked (PG001, PG201): a blanket ignore would make such a file verify clean, so"
        " only naming the code silences them.",
        "",
        "Adding a code: each code is a rule class declared beside the code that emits it, carrying its"
        " title, explanation, wrong and right examples and severity (`plangen/check/rule.py`). A level-1"
        " rule is a `StaticRule` in a module of `plangen/check/rules/static/`, with its `check` and"
        " valid/invalid examples of its own; a level-2 rule a `ModelRule` in a module of"
        " `plangen/check/rules/model/`. Defining the class is enough: each level finds its rules there"
        " (`plangen/check/rules/__init__.py`). Then regenerate this page; the tests run every example.",
        "",
        "| Code | Title | Severity |",
        "| --- | --- | --- |",
        *(f"| [{c.code}](#{c.code.lower()}) | {c.title} | {c.severity} |" for c in codes.values()),
        "",
    ]
    for info in codes.values():
        severity = " (warning)" if info.severity == "warning" else ""
        lines += [
            f"## {info.code}",
            "",
            f"**{info.title}{severity}.** {info.explanation}",
            "",
            "Wrong:",
            "",
            "```python",
            info.wrong.rstrip("\n"),
            "```",
            "",
            "Right:",
            "",
            "```python",
            info.right.rstrip("\n"),
            "```",
            "",
        ]
    lines += render_confusion_section(json.loads(CONFUSION_PATH.read_text()) if CONFUSION_PATH.exists() else None)
    return "\n".join(lines)


def render_confusion_section(record: Mapping[str, Any] | None) -> list[str]:
    """The doc's last section: verify's verdicts against real runs (plangen/check/confusion.json)."""
    if record is None:
        return []
    cells = ("clean_right", "clean_wrong", "flagged_wrong", "flagged_right")
    lines = [
        '## How far "clean" holds',
        "",
        f"Measured over {record['cases']} generated cases (`{record['command']}`, written to"
        " `plangen/check/confusion.json`; `tests/test_verify_property.py` draws the same cases,"
        f" {record['default_run']} of them in the default run, and checks the figures below): a small config of "
        + ", ".join(f"`{f}`" for f in record["families"])
        + " (heads, KV heads, head size, hidden, intermediate and vocabulary sizes, 1-2 layers, tied or"
        " not), the plan `plangen init` writes for it at TP 2, and one edit of it. Each file is checked by"
        ' levels 1+2 ("clean": no error) and applied by the runtime to the model of that config,'
        f' DP=1 x TP (TP {", ".join(str(t) for t in record["tp_sizes"])}) over gloo: "right" when the logits'
        f" and every gradient match the unsharded model's (within {record['rtol']:g} of each tensor's largest value), \"wrong\""
        " when one does not or the run raises.",
        "",
        "| Edit | Cases | Clean, run right | Clean, run wrong | Flagged, run wrong | Flagged, run right |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, counts in record["matrix"].items():
        name = "**all**" if kind == "all" else record["kinds"].get(kind, kind)
        lines.append(f"| {name} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in cells) + " |")
    for key, title in (("false_clean", "Clean, run wrong"), ("false_alarm", "Flagged, run right (false alarms)")):
        found = record[key]
        lines += ["", f"{title}: " + ("none." if not found else f"{len(found)}."), ""]
        lines += [f"- {line}" for line in found]
    return lines + [""]


if __name__ == "__main__":
    print(render_diagnostics_doc(), end="")

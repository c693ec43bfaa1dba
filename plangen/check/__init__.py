"""Checks of custom parallel plan files: the levels of ``plangen verify``.

Level 1 (:mod:`plangen.check.static`) reads the file's source and never imports or runs it. Later
levels check the plan against a model and run it. :func:`verify_plan_files` runs the levels the
options ask for; it returns findings and notes, and never prints or exits.

Importing this package is cheap (the CLI imports it for ``--help``): each level is imported when it
runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from plangen.check.diagnostics import Diagnostic


@dataclass(frozen=True)
class VerifyOptions:
    model: str | None = None
    tp_size: int | None = None
    sequence_parallel: bool = False
    static_only: bool = False
    run: bool = False


@dataclass
class VerifyReport:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not checked, and why


def verify_plan_files(paths: Sequence[str | Path], options: VerifyOptions = VerifyOptions()) -> VerifyReport:
    """Check each plan file with the levels ``options`` ask for; raises OSError for an unreadable file."""
    from plangen.check.static import check_static

    report = VerifyReport()
    for path in dict.fromkeys(str(p) for p in paths):  # each file once, in the order given
        report.diagnostics += check_static(path)
    # Level 2 (against the model) and level 3 (a run on CPU workers) each add one call here.
    if options.model is not None and not options.static_only:
        report.notes.append("level 2 (checks against --model) is not available yet; ran level 1 (static) only")
    if options.run:
        report.notes.append("level 3 (--run) is not available yet; ran level 1 (static) only")
    report.diagnostics.sort()
    return report

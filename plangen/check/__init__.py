"""Checks of custom parallel plan files: the levels of ``plangen verify``.

Level 1 (:mod:`plangen.check.static`) reads the file's source and never imports or runs it. Level 2
(:mod:`plangen.check.model`) imports the plan and checks it against the model on the meta device.
Level 3 (:mod:`plangen.check.run`) applies it for real on CPU worker processes. Each level runs
only on files the levels before it found no errors in. The model, TP size and sequence parallelism
come from the options, else from the ``PLANGEN_*`` constants a generated file records.
:func:`verify_plan_files` returns findings and notes, and never prints or exits. Every code is a
rule class carrying its own story beside the check that emits it; :mod:`plangen.check.codes`
collects them into the registry and ``docs/diagnostics.md``.

Importing this package is cheap (the CLI imports it for ``--help``): each level is imported when it
runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from plangen.check.diagnostics import Diagnostic
    from plangen.check.run import RunTarget

DEFAULT_TP_SIZE = 2
DEFAULT_RUN_TIMEOUT = 600.0


class VerifyUsageError(ValueError):
    """The options (or a file's recorded model) cannot be used: a usage error, not a finding."""


@dataclass(frozen=True)
class VerifyOptions:
    model: str | None = None
    tp_size: int | None = None
    sequence_parallel: bool | None = None  # None: as the file records it, else inferred from the plan
    static_only: bool = False
    run: bool = False
    timeout: float = DEFAULT_RUN_TIMEOUT  # level 3, all files together; each file's import (at most 60 s)
    compile: bool = False  # level 3's parity at TP=2 with each decoder layer compiled (fullgraph)
    target: str | None = None  # None: as the file records it (PLANGEN_TARGET), else plangen's runtime


@dataclass
class VerifyReport:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    # Files only imported (no model known): their model-dependent checks were skipped.
    without_model: list[str] = field(default_factory=list)

    def failed(self, strict: bool = False) -> bool:
        """Errors fail a check; warnings, and checks skipped for want of a model, only when ``strict``."""
        if strict and self.without_model:
            return True
        return any(strict or d.severity == "error" for d in self.diagnostics)


@dataclass(frozen=True)
class PlanSettings:
    """What one file is checked against: from the options, else from its ``PLANGEN_*`` constants."""

    model: str | None
    tp_size: int
    sequence_parallel: bool | None
    tp_size_given: bool
    target: str = "plangen"


def plan_settings(path: str | Path, options: VerifyOptions) -> PlanSettings:
    from plangen.check.static import read_plan_metadata

    metadata = read_plan_metadata(path)
    recorded = _typed(metadata.get("PLANGEN_MODEL"), str)
    if recorded is not None and not options.model:
        from plangen.model.resolve import resolve_recorded_spec

        recorded = resolve_recorded_spec(recorded, path)
    model = options.model or recorded
    tp_size = options.tp_size or _typed(metadata.get("PLANGEN_TP_SIZE"), int)
    sequence_parallel = options.sequence_parallel
    if sequence_parallel is None:
        sequence_parallel = _typed(metadata.get("PLANGEN_SEQUENCE_PARALLEL"), bool)
    from plangen.plan.targets import DEFAULT_TARGET, TARGETS

    recorded_target = _typed(metadata.get("PLANGEN_TARGET"), str)
    target = options.target or (recorded_target if recorded_target in TARGETS else DEFAULT_TARGET)
    return PlanSettings(model, tp_size or DEFAULT_TP_SIZE, sequence_parallel, tp_size is not None, target)


def _typed(value: object, kind: type) -> object:
    if kind is int and isinstance(value, bool):
        return None
    return value if isinstance(value, kind) else None


def verify_plan_files(
    paths: Sequence[str | Path],
    options: VerifyOptions = VerifyOptions(),
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Check each plan file with the levels ``options`` ask for.

    Raises OSError for an unreadable file and :class:`VerifyUsageError` for a model spec that names
    no model. ``progress`` hears how level 3 advances.
    """
    from plangen.check.static import check_static

    report = VerifyReport()
    to_run: dict[str, RunTarget] = {}  # shown path -> target
    for path in dict.fromkeys(str(p) for p in paths):  # each file once, in the order given
        found = check_static(path)
        report.diagnostics += found
        if options.static_only:
            continue
        if _has_errors(found):
            report.notes.append(f"{path}: not checked against the model: fix its static findings first")
            continue
        found = _check_model(path, options, report, to_run)
        report.diagnostics += found
    if to_run:
        report.diagnostics += _check_run(to_run, options, report, progress)
    report.diagnostics.sort()
    return report


def _has_errors(diagnostics: Sequence[Diagnostic]) -> bool:
    return any(d.severity == "error" for d in diagnostics)


def _check_model(
    path: str, options: VerifyOptions, report: VerifyReport, to_run: dict[str, RunTarget]
) -> list[Diagnostic]:
    """Level 2 for one file; queues it for level 3 when asked and clean."""
    from plangen.check.import_probe import IMPORT_TIMEOUT, check_import
    from plangen.check.model import check_import_only, check_model
    from plangen.model.resolve import ModelSpecError

    settings = plan_settings(path, options)
    probe = partial(check_import, timeout=min(options.timeout, IMPORT_TIMEOUT))
    if settings.model is None:
        # The import needs no model: a file that cannot be imported is never clean.
        report.without_model.append(path)
        report.notes.append(
            f"{path}: only imported, not checked against a model: pass --model (generated files record"
            " PLANGEN_MODEL); --strict fails such a file"
        )
        return check_import_only(path, probe)
    if not settings.tp_size_given:
        report.notes.append(f"{path}: no --tp-size and no PLANGEN_TP_SIZE: checked at TP size {settings.tp_size}")
    try:
        found = check_model(path, settings.model, settings.tp_size, settings.sequence_parallel, probe, settings.target)
    except ModelSpecError as error:
        if options.model:
            raise VerifyUsageError(f"--model: {error}") from None
        # The file's own PLANGEN_MODEL: a finding on that file, and the other files still checked.
        return [_bad_recorded_model(path, error)]
    if options.run:
        if _has_errors(found):
            report.notes.append(f"{path}: not run (--run): fix its findings against the model first")
        else:
            from plangen.check.run import RunTarget

            resolved = str(Path(path).resolve())
            to_run[path] = RunTarget(
                resolved, settings.model, settings.tp_size, bool(settings.sequence_parallel), compile=options.compile
            )
    return found


def _bad_recorded_model(path: str, error: Exception) -> Diagnostic:
    from plangen.check.diagnostics import Diagnostic
    from plangen.check.rules.static.structure import PlanConstantRule
    from plangen.check.static import read_constant_position

    line, col = read_constant_position(path, "PLANGEN_MODEL")
    rule = PlanConstantRule
    return Diagnostic(path, line, col, rule.code, f"PLANGEN_MODEL names no model: {error}", rule.severity)


def _check_run(
    to_run: dict[str, RunTarget],
    options: VerifyOptions,
    report: VerifyReport,
    progress: Callable[[str], None] | None,
) -> list[Diagnostic]:
    """Level 3 for every queued file at once (one launch per stage), findings placed on their keys."""
    from plangen.check.model import diagnostics_for, read_plan_positions
    from plangen.check.run import check_run
    from plangen.check.static import decode_source

    shown = {target.path: path for path, target in to_run.items()}  # workers get absolute paths
    outcome = check_run(list(to_run.values()), options.timeout, progress)
    for note in outcome.notes:
        path, _, rest = note.partition(": ")
        report.notes.append(f"{shown.get(path, path)}: {rest}")
    diagnostics: list[Diagnostic] = []
    for path, findings in outcome.findings.items():
        if findings:
            positions = read_plan_positions(decode_source(Path(path).read_bytes()))
            diagnostics += diagnostics_for(shown[path], iter(findings), positions)
    return diagnostics

"""Level 2 of ``plangen verify``: a plan file checked against the model it is for, on the meta device.

The plan file is imported with the runtime's own loader (:func:`plangen.plan.source.load_custom_plan`),
so level 2 sees exactly the styles training will get, including plans built by helper functions.
Importing runs the file's top level: that is the user's plan code, which the runtime runs anyway.
Its prints go to stderr (``--format json`` stays parseable) and anything it raises, ``SystemExit``
included, becomes a PG201 finding. Positions come from the libcst parse that level 1 made: each
finding sits on the key (or value) it concerns; a key built at run time (an f-string, ``**base``)
has no position of its own and is reported on the plan's opening line.

The model is built on the meta device (no weights, no memory), once per model spec in a process.
What the rules read is in :mod:`plangen.check.model_plan`; the rules, each with its code's story,
in :mod:`plangen.check.rules.model.shapes` and :mod:`plangen.check.rules.model.regions`; PG201's story is
declared here, where it is emitted.
"""

from __future__ import annotations

import contextlib
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

import libcst as cst

from plangen.check.diagnostics import Diagnostic, drop_ignored
from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule
from plangen.check.plan_file import PlanFile, find_comments, string_value
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT
from plangen.check.rules import discover
from plangen.check.static import decode_source
from plangen.output.errors import one_line

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

    from plangen.model.resolve import ResolvedModel

# A plan file's import in a child process first: None, or why it failed and where in the file.
Probe = Callable[[str], "tuple[str, tuple[int, int] | None] | None"]


# --- positions from the parse -------------------------------------------------------------------

# A commented-out entry in the plan dict marks a module left replicated on purpose (generated
# files write them so): ``# "model.layers.*.input_layernorm": 32 × LlamaRMSNorm [4096]``.
_COMMENTED_KEY = re.compile(r"""^#\s*(?P<quote>["'])(?P<key>[^"']+)(?P=quote)\s*:""")


@dataclass
class PlanPositions:
    """Where each key of the plan is written, and the lines level 2 reads besides the plan itself.

    Positions come from the parse only when a finding asks for one: libcst's position pass costs
    twice the parse, and most files are clean."""

    file: PlanFile | None = None
    nodes: dict[str, tuple[cst.CSTNode, cst.CSTNode]] = field(default_factory=dict)  # key -> (key, value)
    plan_node: cst.CSTNode | None = None
    replicated_on_purpose: list[str] = field(default_factory=list)
    ignores: dict[int, frozenset[str]] = field(default_factory=dict)

    @property
    def plan(self) -> tuple[int, int]:
        return self.file.position(self.plan_node) if self.file is not None else (1, 1)

    def of(self, finding: ModelFinding) -> tuple[int, int]:
        if finding.key is not None and finding.key in self.nodes:
            key, value = self.nodes[finding.key]
            return self.file.position(value if finding.at == "value" else key)  # type: ignore[union-attr]
        return self.plan


def read_plan_positions(source: str) -> PlanPositions:
    """The plan's keys and values, its commented-out keys and its ignore comments."""
    plan = PlanFile(cst.parse_module(source))
    positions = PlanPositions(file=plan, ignores=plan.ignore_comments())
    for entry in plan.entries:
        key = string_value(entry.key)
        if isinstance(key, str) and key not in positions.nodes:
            positions.nodes[key] = (entry.key, entry.value)
    if plan.dicts:
        positions.plan_node = plan.dicts[0]
    elif plan.plan_values:
        positions.plan_node = plan.plan_values[0]
    elif plan.functions:
        positions.plan_node = plan.functions[0].name
    for plan_dict in plan.dicts:
        for comment in find_comments(plan_dict):
            match = _COMMENTED_KEY.match(comment.value)
            if match:
                positions.replicated_on_purpose.append(match.group("key"))
    return positions


# --- the model ---------------------------------------------------------------------------------

_MODELS: dict[str, tuple["ResolvedModel", "nn.Module"]] = {}


def load_meta_model(spec: str) -> tuple["ResolvedModel", "nn.Module"]:
    """The resolved spec and its meta-device model, built once per spec in this process (rules
    never change the model). Raises :class:`plangen.model.resolve.ModelSpecError` for a bad spec."""
    if spec not in _MODELS:
        from plangen.model.resolve import build_meta_model, resolve_model

        resolved = resolve_model(spec)
        _MODELS[spec] = (resolved, build_meta_model(resolved))
    return _MODELS[spec]


# --- the rules ---------------------------------------------------------------------------------

# Every level-2 rule (plangen/check/rules/model/), by code.
MODEL_RULES: dict[str, ModelRule] = {rule.code: rule() for rule in discover("model")}  # type: ignore[misc]


def check_rules(plan: ModelPlan) -> Iterator[ModelFinding]:
    """Every rule's findings; the rules that run the shrunk model (``runs_on_shrunk_model``) after the
    others, in code order, each only where nothing before it found an error."""
    errors = False
    on_meta = [rule for rule in MODEL_RULES.values() if not rule.runs_on_shrunk_model]
    shrunk = [rule for rule in MODEL_RULES.values() if rule.runs_on_shrunk_model]
    for rule in on_meta:
        for finding in rule.check(plan):
            errors = errors or finding.severity == "error"
            yield finding
    for rule in shrunk:
        if errors:
            return
        for finding in rule.check(plan):
            errors = errors or finding.severity == "error"
            yield finding


# --- the runner ---------------------------------------------------------------------------------


class PlanLoadFailure(Exception):
    """The plan file could not be imported or its plan read; carries the PG201 finding's position."""

    def __init__(self, message: str, position: tuple[int, int] | None) -> None:
        super().__init__(message)
        self.position = position


class PlanLoadFailureRule(ModelRule):
    """Emitted by :func:`check_model` when :func:`load_plan_styles` fails, before any rule runs."""

    level = "load"

    code = "PG201"
    title = "plan file cannot be loaded"
    explanation = (
        "Level 2 imports the plan file as the runtime will (`plangen.plan.source.load_custom_plan`)."
        " Importing it raised: a module the file imports is missing where verify (and training) runs, its"
        " top level raises, or `custom_parallel_plan()` does. The finding sits on the line that raised."
        " verify first imports each file in a child process, within `--timeout` (at most 60 s): a file"
        " whose import hangs, ends its process (`os._exit`, a signal) or raises `KeyboardInterrupt` is"
        " this finding on the plan's line, and the other files are still checked. A file whose model is"
        " not known (no `--model`, no `PLANGEN_MODEL`) is imported all the same: only the checks against"
        " the model are skipped (a note says so, and `--strict` fails it)."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\nfrom my_plans import EXTRA\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate()), **EXTRA}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )


def load_plan_styles(path: str | Path) -> dict[str, "ParallelStyle"]:
    """Import the plan file with the runtime's loader; raises :class:`PlanLoadFailure`."""
    from plangen.plan.source import PlanLoadError, load_custom_plan

    try:
        # The plan's own prints must not mix with the findings on stdout.
        with contextlib.redirect_stdout(sys.stderr):
            return load_custom_plan(str(path))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - SystemExit from a plan file is a finding too
        # The loader names the file in its own message; the finding sits in the file, so it takes
        # the plan's own error and the line that raised it.
        if isinstance(error, PlanLoadError) and error.__cause__ is not None:
            error = error.__cause__
        raise PlanLoadFailure(one_line(error, with_type=True), position_in_file(error, path)) from None


def position_in_file(error: BaseException, path: str | Path) -> tuple[int, int] | None:
    """Where in ``path`` it raised (the innermost frame in that file), if anywhere."""
    target = Path(path).resolve()
    position = None
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename and frame.lineno and Path(frame.filename).resolve() == target:
            position = (frame.lineno, (getattr(frame, "colno", None) or 0) + 1)
    return position


def check_model(
    path: str | Path,
    model_spec: str,
    tp_size: int,
    sequence_parallel: bool | None = None,
    probe: Probe | None = None,
    target: str = "plangen",
) -> list[Diagnostic]:
    """Level-2 findings for the plan file at ``path`` against ``model_spec`` at ``tp_size``, sorted.

    ``probe`` imports the file first where a failure cannot hurt (verify passes
    :func:`plangen.check.import_probe.check_import`, a child process with a time bound) and returns
    why it failed and where: such a file is a PG201 finding and is never imported here. Raises :class:`plangen.model.resolve.ModelSpecError` when
    the spec names no model, OSError when the file cannot be read.
    """
    source = decode_source(Path(path).read_bytes())
    positions = read_plan_positions(source)
    resolved, model = load_meta_model(model_spec)
    try:
        written = import_plan(path, probe)
    except PlanLoadFailure as failure:
        return load_failure_findings(path, failure, positions)
    plan = build_model_plan(
        model, written, tp_size, sequence_parallel, positions.replicated_on_purpose, resolved, target
    )
    return diagnostics_for(str(path), check_rules(plan), positions)


def check_import_only(path: str | Path, probe: Probe | None = None) -> list[Diagnostic]:
    """The part of level 2 that needs no model: the plan file imports and its plan reads (PG201
    otherwise), for a file checked without knowing its model."""
    try:
        import_plan(path, probe)
    except PlanLoadFailure as failure:
        return load_failure_findings(path, failure, read_plan_positions(decode_source(Path(path).read_bytes())))
    return []


def import_plan(path: str | Path, probe: Probe | None = None) -> dict[str, "ParallelStyle"]:
    """The plan's styles, imported in a probe first where one is given; raises :class:`PlanLoadFailure`."""
    failed = probe(str(path)) if probe is not None else None
    if failed is not None:
        raise PlanLoadFailure(*failed)
    return load_plan_styles(path)


def load_failure_findings(path: str | Path, failure: PlanLoadFailure, positions: PlanPositions) -> list[Diagnostic]:
    line, col = failure.position or positions.plan
    message = f"the plan file cannot be loaded: {failure}"
    rule = PlanLoadFailureRule
    return drop_ignored([Diagnostic(str(path), line, col, rule.code, message, rule.severity)], positions.ignores)


def build_model_plan(
    model: "nn.Module",
    written: Mapping[str, "ParallelStyle"],
    tp_size: int,
    sequence_parallel: bool | None = None,
    replicated_on_purpose: list[str] | None = None,
    source: "ResolvedModel | None" = None,
    target: str = "plangen",
) -> ModelPlan:
    from plangen.plans.checks import resolve_tied_styles

    styles = resolve_tied_styles(model, written)  # what the runtime will apply
    return ModelPlan(
        model, tp_size, sequence_parallel, dict(written), styles, list(replicated_on_purpose or ()), source, target
    )


def diagnostics_for(path: str, findings: Iterator[ModelFinding], positions: PlanPositions) -> list[Diagnostic]:
    diagnostics = {Diagnostic(path, *positions.of(f), f.code, f.message, f.severity) for f in findings}
    return sorted(drop_ignored(diagnostics, positions.ignores))

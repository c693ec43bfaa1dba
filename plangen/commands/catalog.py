"""Every causal-LM architecture the installed transformers registers, with the plan it gets.

One row per class: the plan the runtime uses at TP > 1 without a custom plan, named by its source
(``hand-written``, ``synthesized`` where the sweep proved it, ``hf``, or ``none``: the vocabulary of
:mod:`plangen.plans.choice`), whether sequence parallelism is
available with it, and the numerical check of that plan from ``plangen/plans/proven.json``.

Classes are read from transformers' causal-LM mapping, plus the multimodal classes that have a
hand-written plan. Each is built on the meta device from its default config shrunk by
:func:`plangen.model.shrink.shrink_config` (one layer per kind: the same structure, a fraction of the
modules, so ~200 builds take seconds). Nothing is cached on disk.

The share of parameters the plan shards over TP is measured at the class's default size (not
shrunk): the default config on the meta device, the runtime's plan applied at TP=2 under a
single-process fake process group. A plan can be right and nearly useless (experts replicated):
this column shows it.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

from plangen.output.errors import one_line
from plangen.plan import WELL_SHARDED
from plangen.plans.proven import NEVER_PROVEN, PROVEN_ELSEWHERE, PROVEN_HERE

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

PlanKind = Literal["hand-written", "synthesized", "hf", "none"]

FRACTION_TP_SIZE = 2  # the TP size the sharded share is measured at
# What a row lists as left whole: its largest parts, down to a router's few hundredths of a percent.
WHOLE_PARTS_MOST, WHOLE_PARTS_LISTED = 3, 0.0001


@dataclass(frozen=True)
class Architecture:
    class_name: str
    model_type: str  # the type whose config the class is built from (its config class's own type)
    aliases: tuple[str, ...] = ()  # other types transformers maps to the same class


@dataclass(frozen=True)
class CatalogRow:
    class_name: str
    model_type: str
    plan: PlanKind
    sequence_parallel: bool
    # The sweep's verdict on that plan: passed, failed, stale (proven for another plan), not run,
    # or n/a (no plan to check).
    check: str
    note: str = ""
    # Whether the class has a proof for the installed model code (plangen.plans.proven.proof_status).
    proof: str = NEVER_PROVEN
    # Share of the parameters (by elements) the plan shards over TP at the default size; 0: no plan.
    sharded_fraction: float = 0.0
    # What the plan leaves whole at that size: its largest parts, their shares and the plan's reasons.
    left_whole: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_architectures() -> list[Architecture]:
    """One entry per class: transformers' causal LMs, then multimodal classes with a hand-written plan."""
    from transformers.models.auto import modeling_auto as auto

    from plangen.plans import HAND_WRITTEN

    types: dict[str, list[str]] = {}
    for model_type, class_name in sorted(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        types.setdefault(class_name, []).append(model_type)
    for mapping in (auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, auto.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES):
        for model_type, class_name in sorted(mapping.items()):
            if class_name in HAND_WRITTEN and class_name not in types:
                types[class_name] = [model_type]
    return sorted(
        (_architecture(class_name, model_types) for class_name, model_types in types.items()),
        key=lambda a: a.class_name.lower(),
    )


def _architecture(class_name: str, model_types: list[str]) -> Architecture:
    # Several types can map to one class (llama, exaone, internlm3 -> LlamaForCausalLM): name the
    # class by the type its name starts with. (Asking the class for its config would import every
    # modeling module just to list them.)
    def squeeze(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    named = [t for t in model_types if squeeze(class_name).startswith(squeeze(t))]
    main = max(named, key=len) if named else model_types[0]
    return Architecture(class_name, main, tuple(t for t in model_types if t != main))


def _resolve_architecture(arch: Architecture):
    from plangen.model.resolve import resolve_model

    resolved = resolve_model(arch.model_type)
    if resolved.model_class.__name__ != arch.class_name:  # a type whose first mapping names another class
        resolved = resolve_model(arch.class_name)
    return resolved


def build_catalog_model(arch: Architecture) -> "nn.Module":
    """The class on the meta device, from its default config shrunk to one layer of each kind."""
    from plangen.model.resolve import build_meta_model
    from plangen.model.shrink import shrink_config

    resolved = _resolve_architecture(arch)
    # Eager attention: every class supports it, and the plan does not depend on the kernel.
    return build_meta_model(shrink_config(resolved.config, 2, attn_implementation="eager"), resolved.model_class)


def build_full_size_model(arch: Architecture) -> "nn.Module":
    """The class on the meta device, from its default config as it is (every layer, real widths)."""
    from plangen.model.resolve import build_full_size_meta_model

    return build_full_size_meta_model(_resolve_architecture(arch))


def _verdict(record: dict[str, Any] | None, with_sp: bool) -> str:
    if not record:
        return "not run"
    if record.get("tp") is not True:
        return "failed"
    if with_sp and record.get("sp") is not True:
        return "failed (SP)"
    return "passed"


def _hand_written_row(arch: Architecture, model: "nn.Module", record: dict[str, Any] | None) -> CatalogRow:
    from plangen.plans import HAND_WRITTEN

    try:
        HAND_WRITTEN[arch.class_name](model, True)
        sp, note = True, ""
    except ValueError as err:
        sp, note = False, one_line(err, part="first")
    record = record if record and record.get("plan") == "hand-written" else None
    return CatalogRow(arch.class_name, arch.model_type, "hand-written", sp, _verdict(record, sp), note)


def build_row(arch: Architecture, proven: dict[str, dict[str, Any]]) -> CatalogRow:
    """The row of one class (``proven``: the sweep's records, :func:`plangen.plans.proven.load_proven`).

    The plan is the runtime's own choice (:func:`plangen.plans.choice.choose_plan`); the row adds the
    sweep's verdict on it, below the hand-written plans why the sources above were passed over, and
    the share of the parameters the plan shards at the default size.
    """
    from plangen.plans import HAND_WRITTEN

    try:
        model = build_catalog_model(arch)
    except Exception as err:  # noqa: BLE001 - transformers' default configs fail in many ways
        plan: PlanKind = "hand-written" if arch.class_name in HAND_WRITTEN else "none"
        return CatalogRow(
            arch.class_name,
            arch.model_type,
            plan,
            False,
            "n/a",
            f"its default config does not build: {one_line(err, part='first')}",
        )
    from plangen.plans.choice import UnprovenCodeWarning
    from plangen.plans.proven import code_digest, proof_status

    # The sweep's record for the installed model code: a record of another transformers' code of
    # the class proves nothing here (the proof column says which it is).
    code = code_digest(model)
    codes = proven.get(arch.class_name, {})
    status = proof_status(codes, code)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnprovenCodeWarning)  # the row's proof column says it
        row = replace(_plan_row(arch, model, codes.get(code)), proof=status)
    if row.plan == "none":
        return row
    fraction, why, left = build_sharded_fraction(arch, model)
    note = "; ".join(n for n in (row.note, why) if n)
    return replace(row, note=note, sharded_fraction=round(fraction, 4), left_whole=left)


def _plan_row(arch: Architecture, model: "nn.Module", record: dict[str, Any] | None) -> CatalogRow:
    from plangen.plans.choice import NoPlanError, choose_plan

    try:
        chosen = choose_plan(model, sequence_parallel=False)
    except NoPlanError as err:
        from plangen.plans import HAND_WRITTEN

        if arch.class_name in HAND_WRITTEN:  # refused: it failed its check on this code (the row says so)
            return _hand_written_row(arch, model, record)
        hf_error = next(p.why for p in err.passed_over if p.source == "hf")
        why = _synthesis_note(model, record)
        return CatalogRow(
            arch.class_name,
            arch.model_type,
            "none",
            False,
            "n/a",
            f"{why}; no usable Hugging Face plan: {one_line(hf_error, part='first')}",
        )
    if chosen.source == "hand-written":
        return _hand_written_row(arch, model, record)
    if chosen.source == "synthesized":
        from plangen.plans.synthesis.analysis import analyze_model

        from plangen.plans.proven import SWEEP_COMMAND, proof_is_stale

        sp = record.get("sp") is True  # proven with SP: the sweep's record (choose_plan proved the TP one)
        sp_problems = analyze_model(model).sp_problems
        note = "" if sp else (sp_problems[0] if sp_problems else (record.get("error") or ""))
        if proof_is_stale(record, chosen.plan):
            # The synthesizer builds another plan than the sweep proved (the catalog's model is the sweep's).
            stale = (
                f"the synthesizer changed this plan since it was proven: run {SWEEP_COMMAND} --only {arch.class_name}"
            )
            return CatalogRow(
                arch.class_name, arch.model_type, "synthesized", sp, "stale", "; ".join(n for n in (stale, note) if n)
            )
        return CatalogRow(arch.class_name, arch.model_type, "synthesized", sp, _verdict(record, False), note)
    synthesized = record if record and record.get("plan") == "synthesized" else None
    hf_record = (record or {}).get("hf") if synthesized else (record if record and record.get("plan") == "hf" else None)
    return CatalogRow(
        arch.class_name, arch.model_type, "hf", False, _verdict(hf_record, False), _synthesis_note(model, record)
    )


def _synthesis_note(model: "nn.Module", record: dict[str, Any] | None) -> str:
    """Why a class without a hand-written plan did not get its synthesized one."""
    from plangen.plans.synthesis.analysis import analyze_model

    analysis = analyze_model(model)
    synthesized = record if record and record.get("plan") == "synthesized" else None
    if not analysis.synthesizable:
        return f"not synthesized: {analysis.problem}"
    if synthesized:
        return f"synthesized plan failed the check: {synthesized.get('error') or 'differs from the unsharded model'}"
    from plangen.plans.proven import SWEEP_COMMAND

    return f"synthesized plan not checked yet ({SWEEP_COMMAND})"


def build_catalog(only: Iterable[str] | None = None) -> list[CatalogRow]:
    """Every architecture's row, in class-name order; ``only``: just these model types or class names."""
    from plangen.plans.proven import load_proven

    wanted = set(only) if only is not None else None
    proven = load_proven()
    return [
        build_row(arch, proven)
        for arch in list_architectures()
        if wanted is None or {arch.class_name, arch.model_type, *arch.aliases} & wanted
    ]


# ---------------------------------------------------------------------------------------------
# The share of the parameters a plan shards


def build_sharded_fraction(arch: Architecture, shrunk: "nn.Module") -> tuple[float, str, str]:
    """(share of the parameters the runtime's plan shards at TP=2 at the default size, a note, what
    it leaves whole: :func:`render_whole_parts`, its largest parts; the note repeats them below
    :data:`WELL_SHARDED`).

    Measured on the full-size model; where the full size does not build or its plan does not apply,
    on ``shrunk`` (the catalog model, consumed), and the note says so. Needs a fake process group:
    the running one, or one started here and left running.
    """
    import torch.distributed as dist

    from plangen.distributed.fake_group import FAKE_WORLD_SIZE

    if not dist.is_initialized():
        # Left running, as plangen.distributed.fake_group.fake_process_group leaves its group (why: there).
        dist.init_process_group("fake", rank=0, world_size=FAKE_WORLD_SIZE)
    elif dist.get_backend() != "fake" or dist.get_world_size() < FRACTION_TP_SIZE:
        return 0.0, f"TP-sharded share not measured: a {dist.get_backend()} process group is running", ""
    try:
        fraction, left = measure_sharded_share(lambda: build_full_size_model(arch))
        return (
            fraction,
            "" if fraction >= WELL_SHARDED else render_left_whole(left),
            render_whole_parts(left, WHOLE_PARTS_MOST, WHOLE_PARTS_LISTED),
        )
    except Exception as err:  # noqa: BLE001 - a default config or its plan, at the real size
        why = one_line(err, part="first")
    try:
        fraction, left = measure_sharded_share(lambda: shrunk)
    except Exception as err:  # noqa: BLE001
        return 0.0, f"TP-sharded share not measured: {why}; shrunk: {one_line(err, part='first')}", ""
    return (
        fraction,
        f"TP-sharded share of the shrunk model (at the default size: {why})",
        render_whole_parts(left, WHOLE_PARTS_MOST, WHOLE_PARTS_LISTED),
    )


def measure_sharded_fraction(build_model: Callable[[], "nn.Module"]) -> float:
    """:func:`measure_sharded_share`'s share alone."""
    return measure_sharded_share(build_model)[0]


def render_whole_parts(left: list[tuple[str, float, str]], most: int = 2, at_least: float = 0.001) -> str:
    """The largest parts TP leaves whole (:func:`plangen.cost.memory.read_left_whole`) of at least
    ``at_least`` of the model, each with its share and the plan's reason."""
    return "; ".join(
        f"{pattern} {share:.{1 if share >= 0.001 else 2}%}" + (f" ({why})" if why else "")
        for pattern, share, why in left[:most]
        if share >= at_least
    )


def render_left_whole(left: list[tuple[str, float, str]], most: int = 2) -> str:
    """:func:`render_whole_parts`, for a note."""
    parts = render_whole_parts(left, most)
    return f"left whole at TP {FRACTION_TP_SIZE}: {parts}" if parts else ""


def measure_sharded_share(build_model: Callable[[], "nn.Module"]) -> tuple[float, list[tuple[str, float, str]]]:
    """The share of the parameters the runtime's plan (no SP) shards at TP=2 on the model
    ``build_model`` builds on the meta device, under the running fake process group, and what stays
    whole with the plan's reasons (:func:`plangen.cost.memory.read_left_whole`). The plan is chosen
    for, and applied to, one layer of each kind (:func:`apply_layer_sample`); where that fails (a
    plan that follows the config's layer pattern), every layer."""
    from plangen.distributed.fake_group import quiet_partial_matches, tp_mesh
    from plangen.cost.memory import read_left_whole, sharded_fraction
    from plangen.plans.choice import choose_plan
    from plangen.runtime.tensor_parallel import apply_tp

    model = build_model()
    repeats = apply_layer_sample(model)
    for attempt in ("sample", "every layer"):
        try:
            plan = choose_plan(model, sequence_parallel=False)
            styles = plan.build_styles()
            with quiet_partial_matches():
                apply_tp(model, tp_mesh(FRACTION_TP_SIZE), styles)  # checks the plan before sharding
            replicated = plan.plan.replicated if plan.plan is not None else ()
            return sharded_fraction(model, repeats), read_left_whole(model, replicated, repeats)
        except Exception:  # noqa: BLE001 - a plan that reads the config's layer pattern: every layer next
            if attempt == "every layer" or not repeats:
                raise
            model, repeats = build_model(), {}
    raise AssertionError("unreachable")


def apply_layer_sample(model: "nn.Module") -> dict[str, int]:
    """Leave one layer of each kind in ``model``'s layer lists; returns each kept layer's name -> copies.

    Layers alike in every parameter and submodule get the same styles from keys that name no layer
    index, so one shards as all do: choosing and applying the plan on every layer of ~110 full-size
    classes would triple the time of ``plangen list``. Nothing is left out where layers share
    parameters.
    """
    from torch import nn

    from plangen.model.module_tree import find_transformer_layers

    layers = {id(layer) for layer in find_transformer_layers(model)}
    owned = [id(p) for layer in model.modules() if id(layer) in layers for p in layer.parameters()]
    if len(owned) != len(set(owned)):
        return {}
    repeats: dict[str, int] = {}
    for list_name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not any(id(c) in layers for c in module):
            continue
        kept: dict[tuple, nn.Module] = {}
        copies: dict[int, int] = {}
        for child in module:
            kind = (
                tuple((n, type(m).__name__) for n, m in child.named_modules()),
                tuple((n, tuple(p.shape), p.dtype) for n, p in child.named_parameters()),
            )
            first = kept.setdefault(kind, child)
            copies[id(first)] = copies.get(id(first), 0) + 1
        # Renumbered from 0, as a model with fewer layers has them: plans name layers by position.
        module._modules = {str(i): child for i, child in enumerate(kept.values())}
        prefix = f"{list_name}." if list_name else ""
        repeats.update({f"{prefix}{i}": copies[id(child)] for i, child in enumerate(kept.values())})
    return {name: n for name, n in repeats.items() if n > 1}


# ---------------------------------------------------------------------------------------------
# Rendering (to strings: the CLI prints)


def render_catalog_json(rows: list[CatalogRow]) -> str:
    import torch
    import transformers

    document = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "architectures": [row.to_dict() for row in rows],
    }
    return json.dumps(document, indent=2) + "\n"


def render_fraction(row: CatalogRow) -> str:
    """The sharded share as a percentage, rounded down (100.0% only when everything is sharded)."""
    if row.plan == "none":
        return "-"
    return f"{math.floor(row.sharded_fraction * 1000) / 10:.1f}%"


def render_catalog_text(rows: list[CatalogRow], width: int = 160) -> str:
    """A rich table: class, model_type, plan, SP, check, TP-sharded, note; then a one-line summary."""
    from rich.console import Console
    from rich.table import Table

    cells = [
        (
            row.class_name,
            row.model_type,
            row.plan,
            "yes" if row.sequence_parallel else "no",
            row.check,
            row.proof,
            render_fraction(row),
            row.note,
        )
        for row in rows
    ]
    # proof: whether the check's record is for the installed model code (PROVEN_HERE), only for
    # other releases' code of the class (PROVEN_ELSEWHERE: plangen prove CLASS), or never.
    headers = ("class", "model_type", "plan", "SP", "check", "proof", "TP-sharded", "note")
    widths = [max([len(name)] + [len(c[i]) for c in cells]) for i, name in enumerate(headers[:-1])]
    # The note is the only column that gives way to a narrow terminal (cut here: rich would squeeze
    # the other columns instead).
    note_width = max(20, width - sum(widths) - 2 * len(widths))
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name, column_width in zip(headers, [*widths, note_width]):
        table.add_column(
            name,
            no_wrap=True,
            min_width=min(column_width, len(name)) if name == "note" else column_width,
            justify="right" if name == "TP-sharded" else "left",
        )
    for *fixed, note in cells:
        table.add_row(*fixed, note if len(note) <= note_width else note[: note_width - 1] + "…")
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False, markup=False)
    console.print(table)
    from plangen.plans.choice import NO_PLAN, SOURCES

    kinds = [*(s for s in SOURCES if s != "custom"), NO_PLAN]  # a listing has no custom plans
    counts = {kind: sum(1 for r in rows if r.plan == kind) for kind in kinds}
    well = sum(1 for r in rows if r.plan != NO_PLAN and r.sharded_fraction >= WELL_SHARDED)
    proofs = {
        status: sum(1 for r in rows if r.proof == status) for status in (PROVEN_HERE, PROVEN_ELSEWHERE, NEVER_PROVEN)
    }
    console.print(
        f"{len(rows)} architectures: "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items())
        + f"; {well} shard ≥ {WELL_SHARDED:.0%} of their parameters over TP"
        + "; proofs: "
        + ", ".join(f"{n} for {status}" if status != NEVER_PROVEN else f"{n} never" for status, n in proofs.items()),
        soft_wrap=True,  # one line, whatever the width: scripts read the summary as the last line
    )
    return buffer.getvalue()

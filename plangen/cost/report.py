"""``build_cost_report``: what a plan costs per rank and per step, beside the alternatives asked for.

For each plan: the real model is built on the meta device and the plan applied to it (TP only,
no memory), which gives every parameter's shard for the memory figures and the FSDP2 units for
its collectives; the TP collectives are measured on shrunk models under a fake process group and
scaled to the real sizes (:mod:`plangen.cost.scaling`). Nothing is printed; errors are one-line
:class:`CostError`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from plangen.cost.choices import DEFAULT, PlanChoice, check_plan_name, is_plan_file, resolve_plan_choice
from plangen.cost.data import CostReport, PlanCost
from plangen.cost.settings import CostError, CostSettings, build_cost_settings

DEFAULT_TP_SIZE = 2
# Stated for every plan of a mixture-of-experts model: what the figures assume about the router.
ROUTING_NOTE = (
    "routing: every rank holds every token (the router runs replicated and each TP rank computes the routes to "
    "its own experts, or to every expert with its slice of each where the TP size does not divide the experts, or "
    "to every expert where a plan keeps them whole over TP), so memory and communication do not depend on how tokens are routed; compute per rank "
    "does (a rank whose experts get more tokens computes more) and is not modelled"
)

# Measured and derived TP terms by (class, shrunk config, plan, TP size, dtype): a benchmark costs the
# same architecture at several real sizes, and the shrunk model is the same for all of them.
_TERMS_CACHE: dict[tuple[str, ...], tuple[list[Any], dict[str, int], frozenset[str]]] = {}
TOWERS_NOTE = (
    "towers: {layers} layers outside the decoder stack (vision, audio encoders) run no TP collective in the "
    "text-only step measured: a step with image or audio inputs adds theirs"
)


def read_target(target: str, model: str | None) -> tuple[str, str, dict[str, Any]]:
    """(subject plan name, model spec, the plan file's PLANGEN_* constants) for ``plangen cost TARGET``."""
    from plangen.check.static import read_plan_metadata

    if is_plan_file(target):
        if not Path(target).is_file():
            raise CostError(f"{target}: no such plan file")
        metadata = read_plan_metadata(target)
        from plangen.check.rules.static.structure import constant_problem

        for name, value in metadata.items():
            problem = constant_problem(name, value)
            if problem is not None:  # the file records a size nobody meant: never price it at another
                raise CostError(f"{target}: {problem}")
        spec = model or metadata.get("PLANGEN_MODEL")
        if not isinstance(spec, str) or not spec:
            raise CostError(f"{target} names no model (no PLANGEN_MODEL = ...): pass --model")
        if model is None:
            from plangen.model.resolve import resolve_recorded_spec

            spec = resolve_recorded_spec(spec, target)
        return target, spec, metadata
    if model is not None:
        raise CostError("--model is for plan files; the model is the first argument here")
    return DEFAULT, target, {}


def build_cost_report(
    target: str,
    compare: Sequence[str] = (),
    *,
    model: str | None = None,
    tp_size: int | None = None,
    dp_size: int = 1,
    seq_len: int = 4096,
    micro_batch: int = 1,
    dtype: str = "bf16",
    master_dtype: str = "fp32",
    sequence_parallel: bool | None = None,
) -> CostReport:
    """Cost ``target`` (a plan file, or a MODEL and the plan plangen would use for it) and ``compare``.

    TP size and sequence parallel default to the plan file's ``PLANGEN_TP_SIZE`` and
    ``PLANGEN_SEQUENCE_PARALLEL``, else TP 2 without sequence parallel.
    """
    subject, spec, metadata = read_target(target, model)
    names = [subject, *(check_plan_name(n) for n in compare)]
    settings = build_cost_settings(
        tp_size=tp_size if tp_size is not None else recorded_tp_size(metadata),
        dp_size=dp_size,
        seq_len=seq_len,
        micro_batch=micro_batch,
        dtype=dtype,
        master_dtype=master_dtype,
        sequence_parallel=bool(metadata.get("PLANGEN_SEQUENCE_PARALLEL", False))
        if sequence_parallel is None
        else sequence_parallel,
    )
    resolved = resolve_cost_model(spec, settings)
    from plangen.distributed.fake_group import fake_process_group

    with fake_process_group(settings.tp_size, error=CostError):
        plans = tuple(build_plan_cost(resolved, name, settings) for name in names)
    from plangen.cost.probe_configs import count_layers

    return CostReport(spec, resolved.model_class.__name__, count_layers(resolved.config), settings, plans)


def recorded_tp_size(metadata: dict[str, Any]) -> int:
    recorded = metadata.get("PLANGEN_TP_SIZE")
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else DEFAULT_TP_SIZE


def resolve_cost_model(spec: str, settings: CostSettings):
    from plangen.model.heads import any_layout_tp_size_problem
    from plangen.model.resolve import ModelSpecError, config_for_class, resolve_model

    try:
        resolved = resolve_model(spec)
    except ModelSpecError as error:
        raise CostError(str(error)) from None
    config = config_for_class(resolved.config, resolved.model_class)
    # KV heads may be replicated, odd query heads padded here: applying each plan checks it against its own layout.
    problem = any_layout_tp_size_problem(config, settings.tp_size, resolved.model_class.__name__)
    if problem is not None:
        raise CostError(f"--tp-size {settings.tp_size}: {problem}")
    return resolved


def build_plan_cost(resolved: Any, name: str, settings: CostSettings) -> PlanCost:
    """Memory and collectives of one plan for the resolved model."""
    from plangen.cost.fsdp import build_fsdp_collectives, read_unit_numels
    from plangen.cost.memory import build_memory_cost, read_parameter_shards
    from plangen.cost.scaling import sort_collectives
    from plangen.model.resolve import build_meta_model

    try:
        meta = build_meta_model(resolved)
    except Exception as error:  # transformers raises many types for a config it cannot build
        raise CostError(f"cannot build {resolved.model_class.__name__} from {resolved.spec!r}: {error}") from None
    choice = resolve_plan_choice(name, meta, settings.sequence_parallel)
    notes: list[str] = [ROUTING_NOTE] if has_experts(meta) else []  # before TP, which renumbers the experts
    if settings.tp_size > 1:
        apply_plan(meta, choice, settings)
    memory = build_memory_cost(read_parameter_shards(meta), settings)
    collectives = build_fsdp_collectives(*read_unit_numels(meta, settings.dp_size), settings)
    if settings.tp_size > 1:
        tp_rows, tp_notes = build_tp_collectives(resolved, choice, settings, layer_kinds=_count_layer_kinds(meta))
        collectives = tp_rows + collectives
        notes += tp_notes
    return PlanCost(choice.name, choice.description, memory, tuple(sort_collectives(collectives)), tuple(notes))


def has_experts(model: Any) -> bool:
    """Whether ``model`` has a mixture-of-experts layer (a packed experts module)."""
    from plangen.styles.experts import expert_count

    return any(expert_count(module) for module in model.modules())


def _count_layer_kinds(model: Any) -> Counter[str]:
    from plangen.cost.measure import layer_kind
    from plangen.model.module_tree import find_transformer_layers

    return Counter(layer_kind(layer) for layer in find_transformer_layers(model))


def apply_plan(model: Any, choice: PlanChoice, settings: CostSettings) -> None:
    """Apply the plan's TP to ``model`` with the runtime's own checks, as errors of the cost."""
    from plangen.distributed.fake_group import quiet_partial_matches, tp_mesh
    from plangen.plans.checks import PlanError
    from plangen.runtime.tensor_parallel import apply_tp

    # Read before applying: a style that refuses leaves the model half sharded, its head counts this rank's.
    problem = divisibility_problem(model, choice, settings.tp_size)
    try:
        with quiet_partial_matches():
            apply_tp(model, tp_mesh(settings.tp_size), choice.build(model), dp_size=settings.dp_size)
    except PlanError as error:
        raise CostError(f"{choice.name}: {error}") from None
    except ValueError as error:  # a style's refusal: the width it cannot split, without the legal sizes
        raise CostError(f"--tp-size {settings.tp_size}: {problem}" if problem else f"{choice.name}: {error}") from None


def divisibility_problem(model: Any, choice: PlanChoice, tp_size: int) -> str | None:
    """``plangen verify``'s PG204 on the plan at ``tp_size``: the first width it cannot split, with the
    largest legal TP size for the plan (one line), or None. BitNet's heads take TP 5, its 6912-wide
    intermediate no TP size above 1: the style's own error named no legal size."""
    from plangen.check.model_plan import ModelPlan
    from plangen.check.rules.model.shapes import DivisibilityRule
    from plangen.plans.checks import resolve_tied_styles

    styles = resolve_tied_styles(model, choice.build(model))
    findings = DivisibilityRule().check(ModelPlan(model, tp_size, None, styles, styles))
    return next((f.message for f in findings), None)


def build_tp_collectives(resolved: Any, choice: PlanChoice, settings: CostSettings, layer_kinds: Mapping[str, int]):
    """The plan's TP collectives at the real size: measured shrunk, then scaled to the real model's
    ``layer_kinds`` (decoder layers by kind, measure.layer_kind)."""
    from plangen.cost.measure import measure_tp_collectives
    from plangen.cost.probe_configs import config_with_real_widths, read_dimensions
    from plangen.cost.scaling import derive_terms, scale_terms
    from plangen.model.resolve import config_for_class
    from plangen.model.shrink import shrink_config

    config = config_for_class(resolved.config, resolved.model_class)
    tiny = config_with_real_widths(shrink_config(config, settings.tp_size), config, settings.tp_size)
    key = (resolved.model_class.__name__, tiny.to_json_string(), choice.key, str(settings.tp_size), settings.dtype)
    if key not in _TERMS_CACHE:
        # The plan's patterns are the class's: the same builder gives the shrunk models' styles.
        measured = measure_tp_collectives(resolved.model_class, tiny, choice.build, settings.tp_size, settings.dtype)
        terms = derive_terms(
            measured.base.samples,
            measured.probes,
            measured.doubled.samples,
            measured.base.layers,
            measured.doubled.layers,
            measured.base.kinds,
            {kind: run.samples for kind, run in measured.extra.items()},
        )
        _TERMS_CACHE[key] = (terms, measured.dimensions, measured.towers)
    terms, shrunk, towers = _TERMS_CACHE[key]
    real = read_dimensions(config, settings.micro_batch, settings.seq_len)
    missing = sorted({name for term in terms for name, _ in term.exponents} - set(real))
    if missing:  # DeepSeek-V2's default config leaves top-k unset (its router cannot run): never the shrunk value
        raise CostError(missing_dimension_problem(resolved.spec, config, missing[0], terms))
    decoder = {kind: n for kind, n in layer_kinds.items() if kind not in towers}
    rows, notes = scale_terms(terms, shrunk, real, decoder, settings.tp_size)
    if towers:
        notes.append(TOWERS_NOTE.format(layers=sum(layer_kinds.values()) - sum(decoder.values())))
    return rows, notes


def missing_dimension_problem(spec: str, config: Any, name: str, terms: Sequence[Any]) -> str:
    """Why the real model's collectives cannot be sized: its config leaves dimension ``name`` unset (one line)."""
    from plangen.cost.probe_configs import DIMENSION_KEYS, config_value
    from plangen.cost.scaling import tensor_formula
    from plangen.model.resolve import text_config

    keys, unset = DIMENSION_KEYS.get(name, (name,)), object()
    stated = [k for k in keys if config_value(text_config(config), k, unset) is not unset] or list(keys[:1])
    tensor = next(tensor_formula(t.exponents) for t in terms if name in dict(t.exponents))
    return (
        f"{spec} leaves {' and '.join(stated)} unset, which sizes the plan's {tensor}: pass a config.json that sets it"
    )

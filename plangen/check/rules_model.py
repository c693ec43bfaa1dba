"""Level-2 rules (PG2xx): the plan's styles against the model's module tree, shapes and ties.

Each rule reads a :class:`plangen.check.model.ModelPlan` and yields findings; none prints, raises
for a bad plan, or changes the model. Where the runtime already decides something (key matching,
head counts, tied embeddings, packed projections under FSDP2), the rule calls the runtime's own
function instead of restating it, so ``verify`` and ``parallelize_model`` cannot disagree.
"""

from __future__ import annotations

import inspect
from math import gcd
from typing import Callable, Iterator

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.check.model import ModelFinding, ModelPlan, generalize, parent_path
from plangen.styles import (
    AllReduceParamGrads,
    LeaveUnsharded,
    MlaKvAProjParallel,
    PackedColwiseParallel,
    PackedRowwiseParallel,
    ReplicatedWithGradAllReduce,
)

LOAD_FAILURE_CODE = "PG201"

# --- what a style does, in the few words the rules need ---------------------------------------


def is_sharding(style: ParallelStyle) -> bool:
    """Column- and row-parallel styles shard the module's weights; every other style replicates them."""
    return isinstance(style, (ColwiseParallel, RowwiseParallel))


def style_kind(style: ParallelStyle) -> str:
    if isinstance(style, ColwiseParallel):
        return "colwise"
    if isinstance(style, RowwiseParallel):
        return "rowwise"
    if isinstance(style, (PrepareModuleOutput, PrepareModuleInputOutput)):
        return "gather_output"
    if isinstance(style, PrepareModuleInput):
        return "prepare_input"
    if isinstance(style, (ReplicatedWithGradAllReduce, AllReduceParamGrads)):
        return "grad_reduce"
    if isinstance(style, SequenceParallel):
        return "sequence"
    if isinstance(style, LeaveUnsharded):
        return "none"
    return "other"


def _first(layouts) -> object:
    return layouts[0] if isinstance(layouts, tuple) and layouts else layouts


def _text(placement: object) -> str:
    if isinstance(placement, Shard):
        return f"Shard({placement.dim})"
    return f"{type(placement).__name__}()" if placement is not None else "None"


def _is_sequence(placement: object) -> bool:
    return isinstance(placement, Shard) and placement.dim in (1, -2)


def leaves_local_shard(style: ParallelStyle) -> bool:
    """The style hands on a plain local shard of its output (no DTensor that knows the global shape)."""
    if isinstance(style, PackedColwiseParallel):
        return bool(style.use_local_output)
    return isinstance(_first(style.output_layouts), Shard) and bool(style.use_local_output)  # type: ignore[attr-defined]


def takes_local_shard(style: ParallelStyle) -> bool:
    """The style reads a plain input as this rank's shard (``DTensor.from_local`` assumes even shards)."""
    return isinstance(style, PackedRowwiseParallel) or isinstance(_first(style.input_layouts), Shard)  # type: ignore[attr-defined]


def weight_layout(style: ParallelStyle | None, module: nn.Module) -> str | None:
    """The layout a style gives ``module.weight`` ("plain" for an ordinary tensor); None if unknown."""
    if style is None or isinstance(style, (PrepareModuleInput, PrepareModuleOutput, PrepareModuleInputOutput)):
        return "plain"
    if isinstance(style, (LeaveUnsharded, AllReduceParamGrads, MlaKvAProjParallel)):
        return "plain"
    embedding = isinstance(module, nn.Embedding)
    if isinstance(style, PackedColwiseParallel):
        return "_StridedShard(0)"
    if isinstance(style, PackedRowwiseParallel):
        return "_StridedShard(1)"
    if isinstance(style, ColwiseParallel):
        return "Shard(1)" if embedding else "Shard(0)"
    if isinstance(style, RowwiseParallel):
        return "Shard(0)" if embedding else "Shard(1)"
    if isinstance(style, SequenceParallel):
        return "Replicate()"
    return None


def _suggest_key(pattern: str, style: str) -> str:
    return f'`"{pattern}": {style}`'


# --- PG202: every key matches a module --------------------------------------------------------


def check_keys_match(plan: ModelPlan) -> Iterator[ModelFinding]:
    import difflib

    from plangen.matching import find_unmatched_keys

    candidates: dict[int, list[str]] = {}
    for name in plan.modules:
        candidates.setdefault(name.count("."), []).append(generalize(name))
    for key in find_unmatched_keys(plan.model, [k for k in plan.written]):
        same_depth = sorted(set(candidates.get(key.count("."), ())))
        close = difflib.get_close_matches(key, same_depth, n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else " (one name per dot: `*` never spans a dot)"
        yield ModelFinding(
            "PG202",
            f"`{key}` matches no module of {plan.model_name} (torch would only warn and leave it unsharded){hint}",
            key,
        )


# --- PG203: the style fits the module ----------------------------------------------------------


def _fit_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    name = type(style).__name__
    what = type(module).__name__
    if isinstance(style, (PackedColwiseParallel, PackedRowwiseParallel, MlaKvAProjParallel)):
        if not isinstance(module, nn.Linear):
            return f"`{name}` shards nn.Linear only, not {what}"
    elif is_sharding(style):
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            return f"`{name}` shards nn.Linear and nn.Embedding only, not {what} (torch raises NotImplementedError)"
        if isinstance(style, RowwiseParallel) and isinstance(module, nn.Embedding) and takes_local_shard(style):
            return (
                f"`{name}` on an Embedding reads token ids: they must come in whole (input_layouts=Replicate()); "
                f"with input_layouts={_text(_first(style.input_layouts))} every rank's ids are gathered into a longer sequence"
            )
    elif isinstance(style, (ReplicatedWithGradAllReduce, AllReduceParamGrads)):
        if not any(True for _ in module.parameters(recurse=False)):
            return f"`{name}` reduces parameter gradients, but {what} has no parameters of its own"
    prepare = style.prepare_module_input if isinstance(style, PrepareModuleInputOutput) else style
    if isinstance(prepare, PrepareModuleInput):
        layouts = {**(prepare.input_kwarg_layouts or {}), **(prepare.desired_input_kwarg_layouts or {})}
        try:
            parameters = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            return None
        named = [p for p, v in parameters.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
        unknown = [k for k in layouts if k not in named]
        if unknown:
            return (
                f"`{name}` lays out keyword argument `{unknown[0]}`, but `{what}.forward` has no such parameter"
                f" (it takes {', '.join(named) or 'none'}): the layout would never be applied"
            )
    return None


def check_style_fits(plan: ModelPlan) -> Iterator[ModelFinding]:
    for key, names in plan.matches.items():
        style = plan.styles[key]
        seen: set[type] = set()  # the fit depends on the module's class (and its forward), not on which layer
        for name in names:
            if type(plan.modules[name]) in seen:
                continue
            seen.add(type(plan.modules[name]))
            problem = _fit_problem(style, plan.modules[name])
            if problem is not None:
                yield ModelFinding("PG203", f"{problem} (`{generalize(name)}`)", key, "value")
                break


# --- PG204: sharded dimensions divide by the TP size ------------------------------------------


def _required_dims(style: ParallelStyle, module: nn.Module) -> list[tuple[str, int, int]]:
    """(what, size, parts) the style splits into ``parts`` × TP equal local shards of a plain tensor.

    DTensor handles uneven shards as long as a tensor stays a DTensor, or is gathered: a vocabulary
    split by a row-parallel embedding or a column-parallel head with DTensor logits needs no
    divisibility. A shard handed on as a plain local tensor, or read from one, does.
    """
    split = getattr(style, "split_factor", 1)
    if isinstance(module, nn.Linear):
        if isinstance(style, ColwiseParallel) and leaves_local_shard(style):
            return [("out_features", module.out_features, split)]
        if isinstance(style, RowwiseParallel) and takes_local_shard(style):
            return [("in_features", module.in_features, split)]
    if isinstance(module, nn.Embedding) and isinstance(style, ColwiseParallel) and leaves_local_shard(style):
        return [("embedding_dim", module.embedding_dim, 1)]
    return []


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0) if n else limit


def check_divisibility(plan: ModelPlan) -> Iterator[ModelFinding]:
    from plangen.heads import head_counts, tp_size_problem
    from plangen.plan_checks import shards_attention  # the runtime's own "does this shard attention"

    tp = plan.tp_size
    required: list[tuple[str, str, str, int, int]] = []  # key, path, what, size, parts
    attention_key = None
    for key, names in plan.matches.items():
        style = plan.styles[key]
        if names and attention_key is None and shards_attention(plan.model, {key: style}):
            attention_key = key
        seen: set[tuple[str, int, int]] = set()
        for name in names:
            for what, size, parts in _required_dims(style, plan.modules[name]):
                if (what, size, parts) not in seen:
                    seen.add((what, size, parts))
                    required.append((key, name, what, size, parts))
    common = 0
    for *_, size, parts in required:
        common = gcd(common, size // parts if size % parts == 0 else 1)
    heads_problem = None
    if attention_key is not None and plan.config is not None:
        heads = head_counts(plan.config)
        if heads is not None:
            common = gcd(common, gcd(*heads))
        heads_problem = tp_size_problem(plan.config, tp, plan.model_name)  # the runtime's own words
    if heads_problem is not None:
        yield ModelFinding("PG204", f"`{attention_key}` splits attention heads: {heads_problem}", attention_key, "value")
    legal = _largest_divisor(common, tp)
    for key, name, what, size, parts in required:
        if heads_problem is not None and key == attention_key:
            continue  # the heads finding there says it
        if size % (parts * tp):
            style = type(plan.styles[key]).__name__
            packed = f" ({parts} packed parts, each split on its own)" if parts > 1 else ""
            divisor = f"{parts} × the TP size {tp}" if parts > 1 else f"the TP size {tp}"
            yield ModelFinding(
                "PG204",
                f"`{style}` splits {what}={size} of `{generalize(name)}`{packed} into plain local shards, which"
                f" needs it divisible by {divisor}; the largest legal TP size for this plan is {legal}",
                key,
                "value",
            )


# --- PG205: column-parallel feeds row-parallel ------------------------------------------------


def check_column_row_pairs(plan: ModelPlan) -> Iterator[ModelFinding]:
    output_embedding = plan.model.get_output_embeddings() if hasattr(plan.model, "get_output_embeddings") else None
    for key, names in plan.matches.items():
        style = plan.styles[key]
        for name in names:
            module = plan.modules[name]
            message = None
            if isinstance(style, ColwiseParallel) and isinstance(module, (nn.Linear, nn.Embedding)):
                message = _column_problem(plan, style, name, module is output_embedding)
            elif isinstance(style, RowwiseParallel) and isinstance(module, nn.Linear) and takes_local_shard(style):
                message = _row_problem(plan, name)
            if message is not None:
                yield ModelFinding("PG205", message, key)
                break


def _column_problem(plan: ModelPlan, style: ColwiseParallel, name: str, is_head: bool) -> str | None:
    output = _first(style.output_layouts)
    if not isinstance(output, Shard) or _is_sequence(output):
        return None  # gathered (Replicate) here, or a layout this rule does not judge
    if is_head:
        if not style.use_local_output:
            return None  # vocabulary-parallel logits, a DTensor for plangen.loss
        return (
            f"logits leave `{generalize(name)}` as plain local shards of the vocabulary (use_local_output=True), so the loss sees"
            " 1/TP of it: set use_local_output=False (vocabulary-parallel logits for"
            " plangen.loss.vocab_parallel_cross_entropy) or output_layouts=Replicate()"
        )
    block = parent_path(name)
    kinds = plan.styles_below.get(block, set())
    block_style = plan.style_of(block)
    name, shown = generalize(name), generalize(block) or plan.model_name
    if "rowwise" in kinds or "gather_output" in kinds or (block_style and style_kind(block_style) == "gather_output"):
        return None
    return (
        f"column-parallel `{name}` leaves its output split over TP, but nothing in `{shown}` is"
        " row-parallel to consume it: shard the projection that reads it with RowwiseParallel, or gather this"
        " output (output_layouts=Replicate())"
    )


def _row_problem(plan: ModelPlan, name: str) -> str | None:
    block = parent_path(name)
    if "colwise" in plan.styles_below.get(block, set()):
        return None
    return (
        f"row-parallel `{generalize(name)}` reads its input as this rank's shard, but nothing in"
        f" `{generalize(block) or plan.model_name}` is"
        " column-parallel to produce one: shard the projection that feeds it with ColwiseParallel, or take a whole"
        " input (input_layouts=Replicate())"
    )


# --- PG206: sequence-parallel regions ----------------------------------------------------------


def _residual_layouts(plan: ModelPlan) -> Iterator[tuple[str, object]]:
    """(key, placement) for every layout the plan gives the residual stream (the hidden states
    between blocks): Shard(1) when the sequence is split over TP, Replicate() when it is not."""
    output_embedding = plan.model.get_output_embeddings() if hasattr(plan.model, "get_output_embeddings") else None
    for key, names in plan.matches.items():
        if not names:
            continue
        style, module = plan.styles[key], plan.modules[names[0]]
        placements: list[object] = []
        if isinstance(style, SequenceParallel) and not isinstance(style, ReplicatedWithGradAllReduce):
            placements.append(style.sequence_sharding[0])
        elif isinstance(style, RowwiseParallel) or (isinstance(style, ColwiseParallel) and isinstance(module, nn.Embedding)):
            placements.append(_first(style.output_layouts))
        elif isinstance(style, PrepareModuleInput):
            placements.append(_first(style.input_layouts))
            placements.append((style.input_kwarg_layouts or {}).get("hidden_states"))
        elif isinstance(style, ColwiseParallel) and isinstance(module, nn.Linear):
            # A projection reads the residual itself unless its block prepares the input first.
            block_style = plan.style_of(parent_path(names[0]))
            if module is output_embedding or not isinstance(block_style, PrepareModuleInput):
                placements.append(_first(style.input_layouts))
        for placement in placements:
            if _is_sequence(placement) or isinstance(placement, Replicate):
                yield key, placement


def check_sequence_parallel(plan: ModelPlan) -> Iterator[ModelFinding]:
    layouts = list(_residual_layouts(plan))
    split = [key for key, p in layouts if _is_sequence(p)]
    whole = [key for key, p in layouts if isinstance(p, Replicate)]
    declared = plan.sequence_parallel
    if declared is True and whole and not split:
        yield ModelFinding(
            "PG206",
            "sequence parallel is on (--sequence-parallel or PLANGEN_SEQUENCE_PARALLEL), but the plan never splits"
            " the sequence: no SequenceParallel norms, no Shard(1) residual",
        )
        return
    if declared is False and split and not whole:
        yield ModelFinding(
            "PG206",
            "the plan splits the sequence (Shard(1) residual, SequenceParallel norms), but sequence parallel is off:"
            " pass --sequence-parallel (and sequence_parallel=True to parallelize_model)",
        )
        return
    mode = declared if declared is not None else len(split) >= len(whole) and bool(split)
    odd = whole if mode else split
    why = "sequence parallel is on" if declared else "the rest of the plan splits the sequence (Shard(1))"
    if not mode:
        why = "sequence parallel is off" if declared is False else "the rest of the plan keeps it whole (Replicate())"
    for key in dict.fromkeys(odd):
        have = "Replicate()" if mode else "Shard(1)"
        yield ModelFinding("PG206", f"`{key}` gives the residual stream {have}, but {why}", key, "value")
    if mode:
        yield from _norms_outside_sequence_parallel(plan)


def _norms_outside_sequence_parallel(plan: ModelPlan) -> Iterator[ModelFinding]:
    """With the residual split on the sequence, every norm on it must take a sequence shard."""
    from plangen.plan_checks import find_transformer_layers

    names = {id(module): name for name, module in plan.modules.items()}
    owners: set[str] = set()  # the decoder blocks the plan touches, and the modules holding them
    for layer in find_transformer_layers(plan.model):
        path = names.get(id(layer))
        if path is not None and path in plan.styles_below:
            owners.add(path)
            owners.add(parent_path(parent_path(path)))
    reported: set[str] = set()
    for owner in sorted(owners):
        module = plan.model.get_submodule(owner) if owner else plan.model
        for child, norm in module.named_children():
            path = f"{owner}.{child}" if owner else child
            if "norm" not in type(norm).__name__.lower() or plan.style_of(path) is not None:
                continue
            pattern = generalize(path)
            if pattern not in reported:
                reported.add(pattern)
                yield ModelFinding(
                    "PG206",
                    f"`{pattern}` ({type(norm).__name__}) sits on the sequence-split residual stream, but no key"
                    f" covers it: add {_suggest_key(pattern, 'SequenceParallel()')}",
                )


# --- PG207: per-head norms get their gradient reduced -----------------------------------------


def check_per_head_norms(plan: ModelPlan) -> Iterator[ModelFinding]:
    reported: set[str] = set()
    for key, names in plan.matches.items():
        style = plan.styles[key]
        if not isinstance(style, ColwiseParallel) or not leaves_local_shard(style):
            continue
        for name in names:
            projection, block = plan.modules[name], parent_path(name)
            if not isinstance(projection, nn.Linear) or not ("attn" in block or "attention" in block):
                continue
            for child, norm in plan.model.get_submodule(block).named_children():
                path = f"{block}.{child}"
                weight = getattr(norm, "weight", None)
                if "norm" not in type(norm).__name__.lower() or not isinstance(weight, nn.Parameter):
                    continue
                if weight.numel() >= projection.out_features or generalize(path) in reported:
                    continue  # normalizes the whole projection output, not one head
                norm_style = plan.style_of(path)
                if isinstance(norm_style, (SequenceParallel, AllReduceParamGrads)):
                    continue
                reported.add(generalize(path))
                projection_key = _projection_key(plan, block, child) or key
                yield ModelFinding(
                    "PG207",
                    f"`{generalize(path)}` ({type(norm).__name__} [{weight.numel()}]) normalizes each head after"
                    f" column-parallel `{projection_key}`: a TP rank sees only its heads, so the norm's weight"
                    " gradient must be summed over TP; add "
                    f"{_suggest_key(generalize(path), 'ReplicatedWithGradAllReduce()')} (from plangen.styles)",
                    plan.covering.get(path) or projection_key,
                )


def _projection_key(plan: ModelPlan, block: str, norm: str) -> str | None:
    """The key of the projection a per-head norm follows: ``q_norm`` after ``q_proj``."""
    prefix = norm.partition("_")[0] + "_"
    for child in plan.model.get_submodule(block).named_children():
        if child[0].startswith(prefix) and child[0] != norm and f"{block}.{child[0]}" in plan.covering:
            return plan.covering[f"{block}.{child[0]}"]
    return None


# --- PG208: tied embeddings stay tied ---------------------------------------------------------


def check_tied_embeddings(plan: ModelPlan) -> Iterator[ModelFinding]:
    from plangen.plan_checks import tied_embeddings  # the runtime's own notion of "tied"

    tied = tied_embeddings(plan.model)
    if tied is None:
        return
    emb_path, head_path = tied
    emb_key, head_key = plan.covering.get(emb_path), plan.covering.get(head_path)
    emb = weight_layout(plan.style_of(emb_path), plan.modules[emb_path])
    head = weight_layout(plan.style_of(head_path), plan.modules[head_path])
    if emb is None or head is None or emb == head:
        return
    yield ModelFinding(
        "PG208",
        f"`{emb_path}` and `{head_path}` share one weight, but the plan gives it two layouts ({emb} vs {head}):"
        " the runtime refuses to re-tie them; shard both on the vocabulary (RowwiseParallel on the embedding,"
        " ColwiseParallel on the head) or neither",
        head_key if head_key in plan.written else emb_key,
        "value",
    )


# --- PG209: Linear layers left unsharded ------------------------------------------------------


def check_unsharded_linears(plan: ModelPlan) -> Iterator[ModelFinding]:
    """A Linear no key covers, where the plan shards its neighbours.

    Neighbours: a Linear under a module of the same kind (same generalized path and class) that the
    plan shards, e.g. ``mlp.gate_proj`` left out while ``mlp.up_proj`` is sharded; or the output
    head while the input embedding is sharded. Regions the plan never shards (a vision tower, Mamba
    mixers) are taken as deliberate, and so are keys commented out in the plan dict.
    """
    from plangen.matching import key_matches

    def kind_of_parent(path: str) -> tuple[str, str]:
        parent = parent_path(path)
        module = plan.modules.get(parent, plan.model)
        return generalize(parent), type(module).__name__

    sharded_kinds = {kind_of_parent(path) for path in plan.sharded}
    emb = plan.model.get_input_embeddings() if hasattr(plan.model, "get_input_embeddings") else None
    head = plan.model.get_output_embeddings() if hasattr(plan.model, "get_output_embeddings") else None
    emb_sharded = any(plan.modules[p] is emb for p in plan.sharded) if emb is not None else False
    groups: dict[str, list[nn.Linear]] = {}
    for path, module in plan.modules.items():
        if not isinstance(module, nn.Linear) or path in plan.covering:
            continue
        if any(key_matches(key, path) for key in plan.replicated_on_purpose):
            continue
        if kind_of_parent(path) in sharded_kinds or (module is head and emb_sharded):
            groups.setdefault(generalize(path), []).append(module)
    for pattern, modules in groups.items():
        linear = modules[0]
        size = sum(p.numel() for p in linear.parameters())
        yield ModelFinding(
            "PG209",
            f"`{pattern}`: {len(modules)} × Linear [{linear.out_features}, {linear.in_features}] left unsharded next"
            f" to sharded neighbours: every TP rank holds all {size:,} parameters of each; shard it, or mark it"
            f' replicated on purpose with LeaveUnsharded() or a commented-out key (# "{pattern}": ...)',
        )


# --- PG210: packed projections and FSDP2 ------------------------------------------------------


def check_packed_with_fsdp(plan: ModelPlan) -> Iterator[ModelFinding]:
    from plangen.plan_checks import PlanError, check_packed_without_fsdp

    for key, style in plan.styles.items():
        if not plan.matches.get(key):
            continue
        try:
            check_packed_without_fsdp(plan.model, {key: style}, dp_size=2)
        except PlanError as error:
            yield ModelFinding("PG210", f"right at DP size 1 only: {error}", key, "value")


# --- all of them ------------------------------------------------------------------------------

MODEL_RULES: dict[str, Callable[[ModelPlan], Iterator[ModelFinding]]] = {
    "PG202": check_keys_match,
    "PG203": check_style_fits,
    "PG204": check_divisibility,
    "PG205": check_column_row_pairs,
    "PG206": check_sequence_parallel,
    "PG207": check_per_head_norms,
    "PG208": check_tied_embeddings,
    "PG209": check_unsharded_linears,
    "PG210": check_packed_with_fsdp,
}


def check_rules(plan: ModelPlan) -> Iterator[ModelFinding]:
    for rule in MODEL_RULES.values():
        yield from rule(plan)

"""Level-2 rules about keys, modules and shapes (PG202-PG205).

Each rule is a class carrying its code's story beside its ``check``, which reads a
:class:`plangen.check.model_plan.ModelPlan` and yields findings; none prints, raises for a bad plan,
or changes the model. Where the runtime already decides something (key matching, head counts, tied
embeddings, packed projections under FSDP2), the rule calls the runtime's own function instead of
restating it, so ``verify`` and ``parallelize_model`` cannot disagree. The rules about regions, ties
and coverage (PG206-PG210) are in :mod:`plangen.check.rules.model.regions`; what a style needs of a
module (its fit, the dims that must divide), which they share, in :mod:`plangen.check.style_needs`.
"""

from __future__ import annotations

from math import gcd
from typing import Iterator

from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule, parent_path
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT
from plangen.check.style_needs import fit_problem, is_sequence_split, required_dims
from plangen.styles.base import first_layout, takes_local_shard
from plangen.styles.flat_experts import FlatExpertsParallel, flat_expert_problem
from plangen.model.module_tree import generalize
from plangen.styles.experts import expert_layout_problem
from plangen.styles.base import style_kind
from plangen.styles import (
    ExpertsParallel,
)

# --- PG202: every key matches a module --------------------------------------------------------


class KeysMatchRule(ModelRule):
    code = "PG202"
    title = "key matches no module"
    explanation = (
        "Keys select modules by torch's own rule: the key and the module path have as many dotted"
        " segments, and each segment matches by fnmatch (`*` never spans a dot). torch only warns about"
        " a key that selects nothing and leaves those modules unsharded."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'custom_parallel_plan = {"lm_heads": ColwiseParallel(output_layouts=Replicate())}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\n'
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        import difflib

        from plangen.model.module_tree import find_unmatched_keys

        candidates: dict[int, list[str]] = {}
        for name in plan.modules:
            candidates.setdefault(name.count("."), []).append(generalize(name))
        for key in find_unmatched_keys(plan.model, [k for k in plan.written]):
            same_depth = sorted(set(candidates.get(key.count("."), ())))
            close = difflib.get_close_matches(key, same_depth, n=1, cutoff=0.6)
            hint = f"; did you mean `{close[0]}`?" if close else " (one name per dot: `*` never spans a dot)"
            yield self.finding(
                f"`{key}` matches no module of {plan.model_name} (torch would only warn and leave it unsharded){hint}",
                key,
            )


# --- PG203: the style fits the module ----------------------------------------------------------


class StyleFitsRule(ModelRule):
    code = "PG203"
    title = "style does not fit the module"
    explanation = (
        "Column- and row-parallel styles shard nn.Linear and nn.Embedding only (packed ones nn.Linear"
        " only); a row-parallel embedding reads token ids, which must come in whole"
        " (`input_layouts=Replicate()`); gradient-reducing styles need parameters, and so does"
        " AttentionSinksParallel (the block's own, per head); GatedDeltaNetParallel needs a gated delta net"
        " (one depthwise nn.Conv1d, the head attributes and per-head parameters it names); PrepareModuleInput's"
        " keyword layouts must name parameters of the module's forward."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        for key, names in plan.matches.items():
            style = plan.styles[key]
            seen: set[type] = set()  # the fit depends on the module's class (and its forward), not on which layer
            for name in names:
                if type(plan.modules[name]) in seen:
                    continue
                seen.add(type(plan.modules[name]))
                problem = fit_problem(style, plan.modules[name])
                if problem is not None:
                    yield self.finding(f"{problem} (`{generalize(name)}`)", key, "value")
                    break


# --- PG204: sharded dimensions divide by the TP size ------------------------------------------


class DivisibilityRule(ModelRule):
    code = "PG204"
    title = "dimension not divisible by the TP size"
    explanation = (
        "Attention heads and key/value heads must divide by the TP size when q/k/v are column-parallel;"
        " so must every dimension a style hands on (or reads) as a plain local shard, since"
        " `DTensor.from_local` assumes even shards: the FFN width between a column- and a row-parallel"
        " projection, the output of a column-parallel embedding, a head count a block reshapes by once"
        " made this rank's (`head_attributes`, `LocalHeadCounts`). A vocabulary split by a row-parallel"
        " embedding or by a head whose logits stay a DTensor need not divide. The message names the"
        " largest legal TP size. A plan whose attention block is `PrepareAttentionInput` and whose k/v"
        " projections are `KVHeadsColwiseParallel` (plangen.styles.kv_heads) may also take a TP size that is a"
        " multiple of the key/value heads (each rank computes the one its query heads use); the message"
        " names the largest legal TP size without and with that replication. A plan whose attention block"
        " is `PrepareAttentionInput(padded_heads=True)` (plangen.styles.padded_heads: multi-query attention with"
        " an odd query head count, Falcon-7B's 71) takes any TP size that leaves every rank a real head"
        " once the heads are padded with zero heads to a multiple of it (at most the head count: 71)."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\nPLANGEN_TP_SIZE = 3\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\nPLANGEN_TP_SIZE = 2\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.model.heads import head_counts, legal_tp_size, tp_size_problem
        from plangen.model.pad_layout import legal_padded_tp_size
        from plangen.styles.kv_heads import KVHeadsColwiseParallel
        from plangen.plans.checks import pads_heads, replicates_kv_heads, shards_attention  # the runtime's own checks

        tp = plan.tp_size
        replicate_kv = replicates_kv_heads(plan.model, plan.styles)
        padded = pads_heads(plan.model, plan.styles)
        required: list[tuple[str, str, str, int, int]] = []  # key, path, what, size, parts
        attention_key = None
        for key, names in plan.matches.items():
            style = plan.styles[key]
            if names and attention_key is None and shards_attention(plan.model, {key: style}):
                attention_key = key
            if replicate_kv and isinstance(style, KVHeadsColwiseParallel):
                continue  # whole KV heads per rank, or replicated: the heads check below says which
            seen: set[tuple[str, int, int]] = set()
            for name in names:
                for what, size, parts in required_dims(style, plan.modules[name], tp):
                    if (what, size, parts) not in seen:
                        seen.add((what, size, parts))
                        required.append((key, name, what, size, parts))
        common = 0
        for *_, size, parts in required:
            common = gcd(common, size // parts if size % parts == 0 else 1)
        heads_problem, heads = None, None
        if attention_key is not None and plan.config is not None:
            heads = head_counts(plan.config)
            # the runtime's own words
            heads_problem = tp_size_problem(
                plan.config, tp, plan.model_name, replicate_kv=replicate_kv, padded_heads=padded
            )
        if heads_problem is not None:
            yield self.finding(f"`{attention_key}` splits attention heads: {heads_problem}", attention_key, "value")
        legal = max(
            d
            for d in range(1, tp + 1)
            if (common == 0 or common % d == 0)
            and (
                heads is None
                or (
                    legal_padded_tp_size(heads[0], d) if padded else legal_tp_size(*heads, d, replicate_kv=replicate_kv)
                )
            )
        )
        for key, name, what, size, parts in required:
            if heads_problem is not None and key == attention_key:
                continue  # the heads finding there says it
            if size % (parts * tp):
                style = type(plan.styles[key]).__name__
                experts_problem = (
                    expert_layout_problem(plan.modules[name], tp)
                    if isinstance(plan.styles[key], ExpertsParallel)
                    else flat_expert_problem(plan.modules[name], tp)
                    if isinstance(plan.styles[key], FlatExpertsParallel)
                    else None
                )
                if experts_problem is not None:  # neither layout fits: the style's own words
                    yield self.finding(
                        f"{experts_problem} (`{generalize(name)}`); the largest legal TP size for this plan is {legal}",
                        key,
                        "value",
                    )
                    continue
                packed = f" ({parts} packed parts, each split on its own)" if parts > 1 else ""
                divisor = f"{parts} × the TP size {tp}" if parts > 1 else f"the TP size {tp}"
                yield self.finding(
                    f"`{style}` splits {what}={size} of `{generalize(name)}`{packed} into plain local shards, which"
                    f" needs it divisible by {divisor}; the largest legal TP size for this plan is {legal}",
                    key,
                    "value",
                )


# --- PG205: column-parallel feeds row-parallel ------------------------------------------------


class ColumnRowPairsRule(ModelRule):
    code = "PG205"
    title = "column-parallel without row-parallel"
    explanation = (
        "A column-parallel projection whose output stays split over TP must feed a row-parallel one"
        " in the same block (or gather its output with `output_layouts=Replicate()`), and a"
        " row-parallel projection that reads a shard needs a column-parallel one to produce it;"
        " otherwise the next module computes on a slice. The output head may keep vocabulary-parallel"
        " logits, as a DTensor (`use_local_output=False`)."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": ColwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
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
                    yield self.finding(message, key)
                    break


def _column_problem(plan: ModelPlan, style: ColwiseParallel, name: str, is_head: bool) -> str | None:
    output = first_layout(style.output_layouts)
    if not isinstance(output, Shard) or is_sequence_split(output):
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
    # A container (Zamba2's adapters: Sequential in a ModuleList), or a module of same-shaped
    # projections only (CpmAnt's gated w_in: w_0, w_1), hands its output to the module around it,
    # which holds the projection that consumes it.
    while block and (
        isinstance(plan.modules.get(block), (nn.Sequential, nn.ModuleList)) or _parallel_projections(plan, block)
    ):
        block = parent_path(block)
    kinds = plan.styles_below.get(block, set())
    block_style = plan.style_of(block)
    name, shown = generalize(name), generalize(block) or plan.model_name
    if (
        "rowwise" in kinds
        or "gather_input" in kinds
        or "gather_output" in kinds
        or (block_style and style_kind(block_style) == "gather_output")
    ):
        return None
    partner = _split_partner(plan, block)
    if partner is not None and "rowwise" in plan.styles_below.get(partner, set()):
        return None
    return (
        f"column-parallel `{name}` leaves its output split over TP, but nothing in `{shown}` is"
        " row-parallel to consume it: shard the projection that reads it with RowwiseParallel, or gather this"
        " output (output_layouts=Replicate())"
    )


def _parallel_projections(plan: ModelPlan, block: str) -> bool:
    """``block`` holds nothing but two or more column-parallel linears of one shape, and the module
    around it a row-parallel linear that reads that width (CpmAnt's ``ffn.w_in`` and ``ffn.w_out``)."""
    module = plan.modules.get(block)
    if module is None or list(module.parameters(recurse=False)):
        return False
    children = {f"{block}.{n}": c for n, c in module.named_children() if any(True for _ in c.parameters())}
    shapes = {tuple(c.weight.shape) if isinstance(c, nn.Linear) else None for c in children.values()}
    if len(children) < 2 or len(shapes) != 1 or None in shapes:
        return False
    if any(style_kind(plan.style_of(p)) != "colwise" if plan.style_of(p) else True for p in children):
        return False
    parent = parent_path(block)
    return any(
        isinstance(m, nn.Linear)
        and m.in_features == next(iter(shapes))[0]
        and plan.style_of(p) is not None
        and style_kind(plan.style_of(p)) == "rowwise"
        for p, m in plan.modules.items()
        if parent_path(p) == parent
    )


def _split_partner(plan: ModelPlan, block: str) -> str | None:
    """The sibling holding the other half when ``block`` is one half of a block split over two modules
    (BERT's ``attention.self`` / ``attention.output``: see :class:`plangen.plans.families.split.SplitBlock`)."""
    from plangen.plans.families.dims import read_dims
    from plangen.plans.families.split import recognize_split_blocks

    parent, _, child = block.rpartition(".")
    dims = read_dims(plan.model)
    if not child or dims is None:
        return None
    for split in recognize_split_blocks(plan.model.get_submodule(parent) if parent else plan.model, dims):
        other = {split.inner: split.outer, split.outer: split.inner}.get(child)
        if other is not None:
            return f"{parent}.{other}" if parent else other
    return None


def _row_problem(plan: ModelPlan, name: str) -> str | None:
    block = parent_path(name)
    if "colwise" in plan.styles_below.get(block, set()):
        return None
    partner = _split_partner(plan, block)
    if partner is not None and "colwise" in plan.styles_below.get(partner, set()):
        return None
    return (
        f"row-parallel `{generalize(name)}` reads its input as this rank's shard, but nothing in"
        f" `{generalize(block) or plan.model_name}` is"
        " column-parallel to produce one: shard the projection that feeds it with ColwiseParallel, or take a whole"
        " input (input_layouts=Replicate())"
    )

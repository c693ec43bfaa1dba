"""Level-2 rules about regions, ties and coverage (PG206-PG212): sequence-parallel regions, per-head
norms, tied embeddings (and both ends of a tied pair), Linears left unsharded, packed projections
under FSDP2, per-head parameters.

As in :mod:`plangen.check.rules.model.shapes`, each rule is a class carrying its code's story beside its
``check``, and asks the runtime's own functions where the runtime decides.
"""

from __future__ import annotations

from typing import Iterator

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule, parent_path
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT
from plangen.check.style_needs import is_sequence_split, suggest_key
from plangen.styles.base import first_layout, leaves_local_shard
from plangen.model.module_tree import generalize
from plangen.styles.kinds import weight_layout
from plangen.styles import (
    AllReduceParamGrads,
    AttentionSinksParallel,
    ReplicatedWithGradAllReduce,
    RoutedBlockSequenceParallel,
    SharedInputGather,
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
        elif isinstance(style, RowwiseParallel) and _computed_whole_inside(plan, names[0], style):
            pass  # a plain whole output inside a block that gathered its inputs to plain tensors (Zamba2's shared block)
        elif isinstance(style, RowwiseParallel) or (
            isinstance(style, ColwiseParallel) and isinstance(module, nn.Embedding)
        ):
            placements.append(first_layout(style.output_layouts))
        elif isinstance(style, PrepareModuleInput) and not _input_prepared_above(plan, names[0]):
            # (A module inside a prepared block, a MoE block's shared expert, reads the block's input.)
            placements.append(first_layout(style.input_layouts))
            placements.append((style.input_kwarg_layouts or {}).get("hidden_states"))
        elif isinstance(style, ColwiseParallel) and isinstance(module, nn.Linear):
            # A projection reads the residual itself unless a block around it prepares the input
            # first (its own block, or the MoE block around a shared expert).
            if module is output_embedding or not _input_prepared_above(plan, names[0]):
                placements.append(first_layout(style.input_layouts))
        for placement in placements:
            if is_sequence_split(placement) or isinstance(placement, Replicate):
                yield key, placement


def _computed_whole_inside(plan: ModelPlan, path: str, style: RowwiseParallel) -> bool:
    """A row-parallel output left whole and plain (``Replicate()``, ``use_local_output=True``) below a
    block whose PrepareModuleInput hands it plain whole tensors: it stays inside that block's whole
    computation, not on the residual stream (whatever leaves the block lays it out again)."""
    if not (isinstance(first_layout(style.output_layouts), Replicate) and style.use_local_output):
        return False
    while path:
        path = parent_path(path)
        above = plan.style_of(path)
        if isinstance(above, PrepareModuleInput) and not isinstance(above, PrepareModuleInputOutput):
            desired = [*(above.desired_input_layouts or ()), *(above.desired_input_kwarg_layouts or {}).values()]
            return (
                above.use_local_output and bool(desired) and all(d is None or isinstance(d, Replicate) for d in desired)
            )
    return False


def _input_prepared_above(plan: ModelPlan, path: str) -> bool:
    while path:
        path = parent_path(path)
        style = plan.style_of(path)
        if isinstance(
            style, (PrepareModuleInput, PrepareModuleInputOutput, RoutedBlockSequenceParallel)
        ):  # (the last gathers its own)
            return True
    return False


class SequenceParallelRule(ModelRule):
    code = "PG206"
    title = "sequence-parallel regions inconsistent"
    explanation = (
        "With sequence parallel the residual stream between blocks is split on the sequence"
        " (`Shard(1)`) everywhere: the embedding and every row-parallel block output produce it, blocks"
        " gather it (PrepareModuleInput), every norm on it is SequenceParallel, the head reads it;"
        " without, it is `Replicate()` everywhere. Sequence parallel is on when --sequence-parallel or"
        " PLANGEN_SEQUENCE_PARALLEL says so, else when most of the plan's residual layouts split the"
        " sequence."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate, Shard\n"
        f"{TP_IMPORT} ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel\n\n"
        'PLANGEN_MODEL = "llama"\nPLANGEN_SEQUENCE_PARALLEL = True\nSEQ, WHOLE = Shard(1), Replicate()\n'
        "custom_parallel_plan = {\n"
        '    "model.embed_tokens": RowwiseParallel(input_layouts=WHOLE, output_layouts=SEQ, use_local_output=False),\n'
        '    "model.layers.*.input_layernorm": SequenceParallel(),\n'
        '    "model.layers.*.self_attn": PrepareModuleInput(\n'
        '        input_kwarg_layouts={"hidden_states": SEQ}, desired_input_kwarg_layouts={"hidden_states": WHOLE}\n'
        "    ),\n"
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=SEQ, use_local_output=False),\n'
        '    "model.layers.*.post_attention_layernorm": SequenceParallel(),\n'
        '    "model.layers.*.mlp": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(WHOLE,)),\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=WHOLE),\n'
        '    "model.norm": SequenceParallel(),\n'
        '    "lm_head": ColwiseParallel(input_layouts=SEQ, output_layouts=WHOLE),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate, Shard\n"
        f"{TP_IMPORT} ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel\n\n"
        'PLANGEN_MODEL = "llama"\nPLANGEN_SEQUENCE_PARALLEL = True\nSEQ, WHOLE = Shard(1), Replicate()\n'
        "custom_parallel_plan = {\n"
        '    "model.embed_tokens": RowwiseParallel(input_layouts=WHOLE, output_layouts=SEQ, use_local_output=False),\n'
        '    "model.layers.*.input_layernorm": SequenceParallel(),\n'
        '    "model.layers.*.self_attn": PrepareModuleInput(\n'
        '        input_kwarg_layouts={"hidden_states": SEQ}, desired_input_kwarg_layouts={"hidden_states": WHOLE}\n'
        "    ),\n"
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=SEQ, use_local_output=False),\n'
        '    "model.layers.*.post_attention_layernorm": SequenceParallel(),\n'
        '    "model.layers.*.mlp": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(WHOLE,)),\n'
        '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=SEQ, use_local_output=False),\n'
        '    "model.norm": SequenceParallel(),\n'
        '    "lm_head": ColwiseParallel(input_layouts=SEQ, output_layouts=WHOLE),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        layouts = list(_residual_layouts(plan))
        split = [key for key, p in layouts if is_sequence_split(p)]
        whole = [key for key, p in layouts if isinstance(p, Replicate)]
        declared = plan.sequence_parallel
        if declared is True and whole and not split:
            yield self.finding(
                "sequence parallel is on (--sequence-parallel or PLANGEN_SEQUENCE_PARALLEL), but the plan never splits"
                " the sequence: no SequenceParallel norms, no Shard(1) residual",
            )
            return
        if declared is False and split and not whole:
            yield self.finding(
                "the plan splits the sequence (Shard(1) residual, SequenceParallel norms), but sequence parallel is off:"
                " pass --sequence-parallel (and sequence_parallel=True to parallelize_model)",
            )
            return
        mode = declared if declared is not None else len(split) >= len(whole) and bool(split)
        odd = whole if mode else split
        why = "sequence parallel is on" if declared else "the rest of the plan splits the sequence (Shard(1))"
        if not mode:
            why = (
                "sequence parallel is off" if declared is False else "the rest of the plan keeps it whole (Replicate())"
            )
        for key in dict.fromkeys(odd):
            have = "Replicate()" if mode else "Shard(1)"
            yield self.finding(f"`{key}` gives the residual stream {have}, but {why}", key, "value")
        if mode:
            yield from _norms_outside_sequence_parallel(plan)


def _norms_outside_sequence_parallel(plan: ModelPlan) -> Iterator[ModelFinding]:
    """With the residual split on the sequence, every norm on it must take a sequence shard."""
    from plangen.model.module_tree import find_transformer_layers

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
        gathered = plan.style_of(owner).readers if isinstance(plan.style_of(owner), SharedInputGather) else ()  # whole
        for child, norm in module.named_children():
            path = f"{owner}.{child}" if owner else child
            if "norm" not in type(norm).__name__.lower() or plan.style_of(path) is not None or child in gathered:
                continue
            if next(norm.children(), None) is not None:  # a block named for its norms (DBRX's norm_attn_norm)
                continue
            if (pattern := generalize(path)) not in reported:
                reported.add(pattern)
                yield SequenceParallelRule.finding(
                    f"`{pattern}` ({type(norm).__name__}) sits on the sequence-split residual stream, but no key"
                    f" covers it: add {suggest_key(pattern, 'SequenceParallel()')}",
                )


# --- PG207: per-head norms get their gradient reduced -----------------------------------------


class PerHeadNormsRule(ModelRule):
    code = "PG207"
    title = "per-head norm without gradient reduction"
    explanation = (
        "A norm applied to each head after column-parallel q/k projections (Qwen3's and Gemma3's"
        " `q_norm`, `k_norm`) sees only this rank's heads, so its weight gradient on each rank is a"
        " partial sum: it must be summed over TP (`ReplicatedWithGradAllReduce` from plangen.styles),"
        " or every rank's copy drifts apart."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "qwen3"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\nfrom plangen.styles import ReplicatedWithGradAllReduce\n\n"
        'PLANGEN_MODEL = "qwen3"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.q_norm": ReplicatedWithGradAllReduce(),\n'
        '    "model.layers.*.self_attn.k_norm": ReplicatedWithGradAllReduce(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
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
                    if not _one_head_wide(plan, weight.numel(), projection.out_features):
                        continue  # not head-wide: a low-rank latent's norm (MLA's q_a_layernorm)
                    norm_style = plan.style_of(path)
                    if isinstance(norm_style, (SequenceParallel, AllReduceParamGrads)):
                        continue
                    reported.add(generalize(path))
                    projection_key = _projection_key(plan, block, child) or key
                    yield self.finding(
                        f"`{generalize(path)}` ({type(norm).__name__} [{weight.numel()}]) normalizes each head after"
                        f" column-parallel `{projection_key}`: a TP rank sees only its heads, so the norm's weight"
                        " gradient must be summed over TP; add "
                        f"{suggest_key(generalize(path), 'ReplicatedWithGradAllReduce()')} (from plangen.styles)",
                        plan.covering.get(path) or projection_key,
                    )


def _one_head_wide(plan: ModelPlan, width: int, out_features: int) -> bool:
    """The projection's output is a whole number of heads of ``width`` (as many as the config has)."""
    from plangen.model.heads import head_counts

    if out_features % width:
        return False
    counts = head_counts(plan.config) if plan.config is not None else None
    return counts is None or out_features // width in counts  # no heads in the config: shapes alone


def _projection_key(plan: ModelPlan, block: str, norm: str) -> str | None:
    """The key of the projection a per-head norm follows: ``q_norm`` after ``q_proj``."""
    prefix = norm.partition("_")[0] + "_"
    for child in plan.model.get_submodule(block).named_children():
        if child[0].startswith(prefix) and child[0] != norm and f"{block}.{child[0]}" in plan.covering:
            return plan.covering[f"{block}.{child[0]}"]
    return None


# --- PG208: tied embeddings stay tied ---------------------------------------------------------


class TiedEmbeddingsRule(ModelRule):
    code = "PG208"
    title = "tied embeddings would come apart"
    explanation = (
        "When the input embedding and the output head share one weight, both ends must give it the same"
        " layout: the vocabulary split, RowwiseParallel on the embedding and ColwiseParallel on the"
        " head. (A plan that shards only one end is completed by the runtime.)"
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": ColwiseParallel(output_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.model.module_tree import tied_embeddings  # the runtime's own notion of "tied"

        tied = tied_embeddings(plan.model)
        if tied is None:
            return
        emb_path, head_path = tied
        emb_key, head_key = plan.covering.get(emb_path), plan.covering.get(head_path)
        emb = weight_layout(plan.style_of(emb_path), plan.modules[emb_path])
        head = weight_layout(plan.style_of(head_path), plan.modules[head_path])
        if emb is None or head is None or emb == head:
            return
        yield self.finding(
            f"`{emb_path}` and `{head_path}` share one weight, but the plan gives it two layouts ({emb} vs {head}):"
            " the runtime refuses to re-tie them; shard both on the vocabulary (RowwiseParallel on the embedding,"
            " ColwiseParallel on the head) or neither",
            head_key if head_key in plan.written else emb_key,
            "value",
        )


# --- PG211: a tied pair needs both ends ------------------------------------------------------


class HalfTiedPairRule(ModelRule):
    code = "PG211"
    title = "tied pair on one end only"
    explanation = (
        "`TiedEmbeddingParallel` and `TiedHeadParallel` keep the weight that the input embedding and the"
        " output head share one parameter only when each end of the model's tie has one of them: the first"
        " applied shards the weight, the other takes it. With the other end covered by another style (or by"
        " none, which the runtime completes with a plain one), a runtime that does not re-tie"
        " (NeMo RL's `_parallelize_model`) ends up with two parameters and trains two copies."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate, Shard\n{TP_IMPORT} ColwiseParallel\n"
        "from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": TiedEmbeddingParallel(input_layouts=Replicate()),\n'
        '    "lm_head": TiedHeadParallel(output_layouts=Shard(-1), use_local_output=False),\n'
        '    "lm_*": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),  # the last match wins\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate, Shard\n\n"
        "from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": TiedEmbeddingParallel(input_layouts=Replicate()),\n'
        '    "lm_head": TiedHeadParallel(output_layouts=Shard(-1), use_local_output=False),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.model.module_tree import tied_embeddings
        from plangen.styles.base import facts_of

        tied = tied_embeddings(plan.model)
        if tied is None:  # nothing shared: each tied style shards its own weight, as torch's would
            return
        for path, other in (tied, tied[::-1]):
            key = plan.covering.get(path)
            facts = facts_of(plan.styles[key]) if key is not None else None
            if facts is None or facts.tied_partner is None:
                continue
            other_style = plan.style_of(other)
            other_facts = facts_of(other_style) if other_style is not None else None
            if other_facts is not None and other_facts.name == facts.tied_partner:
                continue
            has = f"`{type(other_style).__name__}`" if other_style is not None else "no style"
            yield self.finding(
                f"`{path}` has `{facts.name}`, but `{other}`, which shares its weight, has {has}: under a runtime"
                f" that does not re-tie (NeMo RL) they become two parameters; give `{other}` `{facts.tied_partner}(...)`",
                key,
                "value",
            )


# --- PG209: Linear layers left unsharded ------------------------------------------------------


class UnshardedLinearsRule(ModelRule):
    code = "PG209"
    title = "Linear left unsharded"
    explanation = (
        "A Linear that no key covers, next to sharded neighbours (a Linear under a module of the same"
        " kind that the plan shards, or the output head while the embedding is sharded), is whole on"
        " every TP rank: right, but probably forgotten. Regions the plan never shards (a vision"
        " tower, Mamba mixers) count as deliberate. Mark a deliberate one with `LeaveUnsharded()` or a"
        " commented-out key in the plan dict, as generated files do. Reported on the plan's first line."
    )
    wrong = (
        f"{TP_IMPORT} RowwiseParallel\n{DTENSOR_IMPORT} Replicate\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n}'
    )
    right = (
        f"{TP_IMPORT} RowwiseParallel\n{DTENSOR_IMPORT} Replicate\n\n"
        'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
        '    # "lm_head": left replicated on purpose\n}'
    )
    severity = "warning"

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        """A Linear no key covers, where the plan shards its neighbours.

        Neighbours: a Linear under a module of the same kind (same generalized path and class) that the
        plan shards, e.g. ``mlp.gate_proj`` left out while ``mlp.up_proj`` is sharded; or the output
        head while the input embedding is sharded. Regions the plan never shards (a vision tower, Mamba
        mixers) are taken as deliberate, and so are keys commented out in the plan dict.
        """
        from plangen.model.module_tree import key_matches

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
            if not isinstance(module, nn.Linear) or path in plan.covering or path in plan.laid_out_by_parent:
                continue
            if any(key_matches(key, path) for key in plan.replicated_on_purpose):
                continue
            if kind_of_parent(path) in sharded_kinds or (module is head and emb_sharded):
                groups.setdefault(generalize(path), []).append(module)
        for pattern, modules in groups.items():
            linear = modules[0]
            size = sum(p.numel() for p in linear.parameters())
            yield self.finding(
                f"`{pattern}`: {len(modules)} × Linear [{linear.out_features}, {linear.in_features}] left unsharded next"
                f" to sharded neighbours: every TP rank holds all {size:,} parameters of each; shard it, or mark it"
                f' replicated on purpose with LeaveUnsharded() or a commented-out key (# "{pattern}": ...)',
            )


# --- PG210: packed projections and FSDP2 ------------------------------------------------------


class PackedWithFsdpRule(ModelRule):
    code = "PG210"
    title = "packed projection under FSDP2"
    explanation = (
        "PackedColwiseParallel/PackedRowwiseParallel compute right, but FSDP2 (torch 2.13) lays their"
        " strided shards out wrongly, so state dicts and checkpoints would come back permuted: the"
        " runtime refuses them at DP size above 1. Right for training at DP size 1 only; say so with an"
        " ignore comment."
    )
    wrong = (
        f"{TP_IMPORT} RowwiseParallel\n\nfrom plangen.styles import PackedColwiseParallel\n\n"
        'PLANGEN_MODEL = "phi3"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_up_proj": PackedColwiseParallel(),\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} RowwiseParallel\n\nfrom plangen.styles import PackedColwiseParallel\n\n"
        'PLANGEN_MODEL = "phi3"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.mlp.gate_up_proj": PackedColwiseParallel(),  # plangen: ignore[PG210] DP size 1\n'
        '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}'
    )
    severity = "warning"

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.plans.checks import PlanError, check_packed_without_fsdp

        for key, style in plan.styles.items():
            if not plan.matches.get(key):
                continue
            try:
                check_packed_without_fsdp(plan.model, {key: style}, dp_size=2)
            except PlanError as error:
                yield self.finding(f"right at DP size 1 only: {error}", key, "value")


# --- PG212: an attention block's own per-head parameters follow its heads ---------------------


class WholeHeadParametersRule(ModelRule):
    code = "PG212"
    title = "per-head parameters left whole"
    explanation = (
        "An attention block that owns one value per head (gpt-oss's `sinks`) reads them all in its"
        " attention function: once q/k/v are column-parallel a TP rank computes only its heads, and the"
        " whole parameter no longer matches them (the forward fails on its shape). Give the block"
        " `AttentionSinksParallel` (from plangen.styles), which splits them with the heads."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gpt_oss"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\nfrom plangen.styles import AttentionSinksParallel\n\n"
        'PLANGEN_MODEL = "gpt_oss"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn": AttentionSinksParallel(),\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        from plangen.styles.attention import head_parameters
        from plangen.model.heads import head_counts

        heads = head_counts(plan.config) if plan.config is not None else None
        reported: set[str] = set()
        for key, names in plan.matches.items():
            style = plan.styles[key]
            if not isinstance(style, ColwiseParallel) or not leaves_local_shard(style):
                continue
            for name in names:
                block = parent_path(name)
                if not ("attn" in block or "attention" in block) or generalize(block) in reported:
                    continue
                if isinstance(plan.style_of(block), AttentionSinksParallel) or not heads:
                    continue
                own = {
                    n: p for n, p in head_parameters(plan.model.get_submodule(block)).items() if p.shape[0] == heads[0]
                }
                if own:
                    reported.add(generalize(block))
                    params = ", ".join(f"{n} [{p.shape[0]}]" for n, p in own.items())
                    yield self.finding(
                        f"`{generalize(block)}` keeps one value per head ({params}) whole while column-parallel"
                        f" `{key}` splits its heads: a TP rank's attention would read every head's; use "
                        f"{suggest_key(generalize(block), 'AttentionSinksParallel()')} (from plangen.styles)",
                        plan.covering.get(block) or key,
                    )

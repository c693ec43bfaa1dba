"""Derive a Megatron-style plan from the module tree, for classes with no hand-written plan.

:func:`~plangen.plans.synthesis.analysis.analyze_model` walks a model (a meta-device build is enough) and
recognises, by structure and shapes (:mod:`plangen.plans.families.core`):

* the vocabulary embedding and the output head (tied or not): vocabulary-parallel;
* per decoder layer, attention blocks (q/k/v column-parallel, o row-parallel, per-head norms with
  their gradient summed over TP) and dense MLPs (up/gate column-parallel, down row-parallel), each
  entered through ``PrepareModuleInput`` so the block input is one ``Replicate`` DTensor whose
  gradient is reduced once per block, as in :mod:`plangen.plans.dense`;
* per-feature modules on the residual stream (norms): ``SequenceParallel`` under SP.

Beyond those, the families the recognizers know are sharded too, each with the styles of its
mechanism (:mod:`plangen.styles`): norms over a whole q or k projection with its heads
(``ShardedNormParallel``: statistics summed over TP); packed q|k|v and gate|up projections re-laid
out by part (``FusedColwiseParallel``); multi-query attention by query heads; mixtures of experts
(experts over TP on the expert dim or inside each expert, shared experts, one reduction per block);
latent attention by heads; Mamba1 and Mamba2 mixers, gated delta nets and RG-LRUs by channels or
heads; towers outside the decoder, TP only. What stays replicated says why (``Replicated.why``): a
block the recognizers cannot read, or one whose call by its layer the forward reader cannot follow.
Replicated blocks are correct under plain TP (every rank computes them whole on the same input).
Under sequence parallelism a replicated block of a layer is handed the whole sequence and keeps its
shard of the output (``PrepareModuleInputOutput``: one all-gather each way); anything else on the
residual stream that cannot take a sequence shard makes SP unavailable for the class, with the reason.

How a layer calls each block (the hidden state as a keyword or positionally) is read from the
layer's forward source (:mod:`plangen.plans.source.forward`); when it cannot be read, the block's
column-parallel projections take their input layout themselves (correct, one more collective).

A synthesized plan is a candidate: the runtime uses it only for classes the numerical sweep
(``scripts/sweep_plans.py``, results in ``proven.json``) proved equal to the unsharded model.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from plangen.styles.experts import EXPERTS_PARALLEL_WHY, INPUT_GRAD_LEFT_WHY
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.synthesis.analysis import Analysis, BlockPart, KeptPart, analyze_model
from plangen.plans.source.forward import BlockCall
from plangen.plans.families.bucketed_attention import bucketed_attention_entries
from plangen.plans.families.latent import latent_attention_entries
from plangen.plans.families.bucketed_attention import BucketedAttentionBlock
from plangen.plans.families.layer_experts import layer_experts_entries
from plangen.plans.synthesis.per_head_inputs import batch_head_rows_why, per_head_input_entry
from plangen.plans.synthesis.per_layer_inputs import per_layer_input_entries
from plangen.plans.families.linear_attention import gated_delta_net_entries
from plangen.plans.families.linear_attention import GatedDeltaNetBlock
from plangen.plans.families.recurrent import MultiHeadMixerBlock
from plangen.plans.families.recurrent import mlstm_entries
from plangen.plans.families.mamba1 import mamba1_entries
from plangen.plans.families.mamba2 import mamba2_children_entries, mamba2_mixer_entry
from plangen.plans.families.core import LayerExpertsBlock, MoeBlock, ShardedBlock
from plangen.plans.families.latent import LatentBlock
from plangen.plans.families.mamba1 import Mamba1Block
from plangen.plans.families.mamba2 import Mamba2Block
from plangen.plans.families.split import SplitBlock
from plangen.plans.tied import tie_plan_entries
from plangen.plans.layouts import SEQ, row_parallel_output

__all__ = ["Analysis", "analyze_model", "build_plan_from_analysis", "build_synthesized_plan"]

Item = TypeVar("Item", PlanEntry, Replicated)


def _input_layouts(call: BlockCall, sp: bool, desired: Placement = Replicate()) -> dict[str, Any]:
    """PrepareModuleInput's layouts for the hidden state, where the layer passes it: the block sees it
    whole (or as ``desired``)."""
    if call.keyword is not None:
        return dict(
            input_layouts=None,
            desired_input_layouts=None,
            input_kwarg_layouts={call.keyword: SEQ if sp else Replicate()},
            desired_input_kwarg_layouts={call.keyword: desired},
        )
    rest = (None,) * (call.positional - 1)
    return dict(
        input_layouts=(SEQ if sp else Replicate(), *rest),
        desired_input_layouts=(desired, *rest),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
    )


def _gathered_entry(part: KeptPart, group: str) -> PlanEntry:
    # One layout per output the layer unpacks; torch passes an output whose layout is None through
    # untouched and never reads its desired layout (documented as a placement: Replicate()).
    # Its own parameters among them become Replicate DTensors, for the layer to add to the sharded output.
    others = (part.call.outputs or 1) - 1
    own = (Replicate() if i in part.parameter_outputs else None for i in range(1, others + 1))
    return PlanEntry(
        part.path,
        "PrepareModuleInputOutput",
        dict(
            **_input_layouts(part.call, True),
            use_local_input=True,
            output_layouts=(Replicate(), *own),
            desired_output_layouts=(SEQ, *(Replicate(),) * others),
            use_local_output=False,
        ),
        group,
        "replicated block under sequence parallel: all-gathers its input, computes whole on every rank, "
        "keeps this rank's sequence shard of its output"
        + (" (its other outputs pass through)" if others else "")
        + (" and hands out the parameters it returns as Replicate DTensors" if part.parameter_outputs else ""),
    )


def _moe_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """The experts split on the expert dim; shared experts column/row-parallel; every branch a partial
    sum that the block reduces once (all-reduce, or reduce-scatter under SP), as in plans/moe.py."""
    block, call = part.block, part.call
    assert isinstance(block, MoeBlock) and call is not None
    others = (call.outputs or 1) - 1  # e.g. router scores the layer unpacks and drops: passed through
    reduced = "one all-gather of the sequence in, one reduce-scatter out" if sp else "one all-reduce"
    if block.output_norm is not None:
        reduced = ("one all-gather of the sequence in; " if sp else "") + f"the sum reduced into {block.output_norm}"
    # The block reduces its branches' input gradients once (MoeBlockParallel, as plans/moe.py): each
    # branch leaves its own partial, the router's and gates' count once. It needs the block's input
    # positional (its hook reads args[0]), every shared MLP's call read (so PartialGradInput can take
    # its input) and one router; a norm on the summed branches keeps the per-branch reductions.
    once = (
        len(block.routers) == 1
        and call.keyword is None
        and block.output_norm is None
        and all(shared_call is not None for _, _, shared_call in block.shared)
    )
    entries = [
        PlanEntry(
            part.path,
            "MoeBlockParallel" if once else "PrepareModuleInputOutput",
            dict(
                **(dict(router=block.routers[0], gates=tuple(sorted(block.gates))) if once else {}),
                **_input_layouts(call, sp),
                use_local_input=True,
                # Reduced already where a norm on the summed branches is what the block returns.
                output_layouts=(Partial() if block.output_norm is None else Replicate(), *(None,) * others),
                desired_output_layouts=(SEQ if sp else Replicate(), *(Replicate(),) * others),
                use_local_output=not sp,
            ),
            "mlp",
            f"mixture of experts: {reduced} of the summed partial outputs of its branches",
        ),
        PlanEntry(
            f"{part.path}.{block.experts}",
            "ExpertsParallel",
            dict(output_layouts=Partial(), **(dict(sum_input_grad=False) if once else {})),
            "mlp",
            EXPERTS_PARALLEL_WHY + (f"; {INPUT_GRAD_LEFT_WHY}" if once else ""),
        ),
    ]
    for name, mlp, shared_call in block.shared:
        if shared_call is not None:
            entries.append(
                PlanEntry(
                    f"{part.path}.{name}",
                    "PartialGradInput" if once else "PrepareModuleInput",
                    dict(**_input_layouts(shared_call, False), use_local_output=False),
                    "mlp",
                    "shared experts: one Replicate DTensor input, so gate and up "
                    + (
                        f"add their partial input gradients on it; {INPUT_GRAD_LEFT_WHY}"
                        if once
                        else "reduce their input gradient once"
                    ),
                )
            )
        for proj in mlp.colwise:
            entries.append(
                _colwise_entry(
                    f"{part.path}.{name}.{proj}", mlp, proj, Replicate(), "mlp", "shared experts: column-parallel"
                )
            )
        entries.append(
            PlanEntry(
                f"{part.path}.{name}.{mlp.rowwise}",
                "RowwiseParallel",
                dict(input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=True),
                "mlp",
                "shared experts: row-parallel, partial sum out (reduced by the block)",
            )
        )
    if block.output_norm is not None:
        entries.append(
            PlanEntry(
                f"{part.path}.{block.output_norm}",
                "PrepareModuleInput",
                dict(
                    input_layouts=(Partial(),),
                    desired_input_layouts=(Replicate(),),
                    input_kwarg_layouts=None,
                    desired_input_kwarg_layouts=None,
                    use_local_output=True,
                ),
                "mlp",
                "norm on the summed branches: their partial sums are all-reduced into it (one all-reduce of B·S·H)",
            )
        )
    for name in block.packed_shared:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "SharedExpertsParallel",
                dict(output_layouts=Partial(), **(dict(sum_input_grad=False) if once else {})),
                "mlp",
                "shared experts of 3-D weights: a slice of each one's intermediate per rank, partial sum out (reduced "
                "by the block); "
                + (
                    "their per-token scales' gradient summed over TP, their input's left to the block's one reduction"
                    if once
                    else "their input's and per-token scales' gradients summed over TP"
                ),
            )
        )
    for gate in block.gates:
        entries.append(
            PlanEntry(
                f"{part.path}.{gate}",
                "AllReduceOutputGrad",
                {},
                "mlp",
                "replicated gate scaling the shared experts' partial output: its output gradient is summed over TP",
            )
        )
    return entries


def _latent_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """Multi-head latent attention as the hand-written DeepSeek plans shard it, its input where the layer passes it."""
    assert isinstance(part.block, LatentBlock) and part.call is not None
    entries, _ = latent_attention_entries(
        part.path,
        sequence_parallel=sp,
        query_latent=part.block.query_latent,
        shard_query_latent=part.block.shard_query_latent,
    )
    first = entries[0]
    prepared = {**first.kwargs, **_input_layouts(part.call, sp)}  # where the layer passes the hidden state
    return [PlanEntry(first.pattern, first.style, prepared, first.group, first.why), *entries[1:]]


def _colwise_entry(pattern: str, block: ShardedBlock, name: str, input_layout: Any, group: str, why: str) -> PlanEntry:
    """Column-parallel; a packed projection re-laid out so each rank holds its slice of every part."""
    parts = dict(block.fused).get(name)
    if parts is not None and block.shared_parts:
        return PlanEntry(
            pattern,
            "MultiQueryColwiseParallel",
            dict(part_sizes=parts, shared_parts=block.shared_parts, input_layouts=input_layout),
            group,
            f"{why}; multi-query: this rank's query heads, the one key/value head gathered whole "
            "(its gradient summed over TP)",
        )
    if parts is None:
        return PlanEntry(
            pattern,
            "ColwiseParallel",
            dict(input_layouts=input_layout, output_layouts=Shard(-1), use_local_output=True),
            group,
            why,
        )
    if block.shared_parameters:  # differential attention: its heads' two halves, not packed parts
        why = f"{why}; the heads' two halves (pairs i, i + H/2) re-laid out so each rank holds whole pairs"
    else:
        why = f"{why}; packed parts {parts} re-laid out so each rank holds its slice of every part"
    return PlanEntry(
        pattern,
        "FusedColwiseParallel",
        dict(part_sizes=parts, input_layouts=input_layout, use_local_output=True),
        group,
        why,
    )


def _split_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """A block split over two sibling modules (BERT): the inner one entered as one Replicate DTensor,
    its projections column-parallel, the outer one's projection row-parallel."""
    block = part.block
    assert isinstance(block, SplitBlock)
    inner, group = f"{part.path}.{block.inner}", block.kind
    entries: list[PlanEntry] = []
    if block.rebuilt:  # its parent rebuilds it (BigBird): the parent's pre-hook makes the counts local
        refused = block.refused_in_training
        entries.append(
            PlanEntry(
                part.path,
                "RebuiltChildHeadCounts",
                dict(child=block.inner, attributes=block.head_attributes, refused_in_training=refused),
                group,
                f"rebuilds its {block.inner} (another attention class) between forwards: its head counts made this rank's "
                "before each forward"
                + (
                    f"; {', '.join(refused)} refused in training (random key blocks drawn per head "
                    "from one seeded stream)"
                    if refused
                    else ""
                ),
            )
        )
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel: each rank computes its own heads, from its own input",
        )
    elif block.head_attributes:
        # One style per module: the head counts made local instead of one prepared input (each
        # projection then takes, and reduces the gradient of, its own input).
        entries.append(
            PlanEntry(
                inner,
                "LocalHeadCounts",
                dict(attributes=block.head_attributes),
                group,
                "reshapes its heads with its built-in width: make it this rank's",
            )
        )
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel: each rank computes its own heads, from its own input",
        )
    elif part.call is not None:
        gathered = "one all-gather of the sequence per block" if sp else "no communication"
        if block.inner_norm is None:
            prepared, how = False, f"{gathered}; one gradient reduction per block in backward"
        else:  # the norm inside takes a plain tensor: each projection then reduces its own input gradient
            prepared, how = True, f"{gathered}; the norm inside computes on the whole input"
        entries.append(
            PlanEntry(
                inner,
                "PrepareModuleInput",
                dict(**_input_layouts(part.call, sp), use_local_output=prepared),
                group,
                how,
            )
        )
        colwise_input, why = (
            Replicate(),
            "column-parallel: each rank computes its own " + ("heads" if group == "attention" else "slice"),
        )
    else:
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel, taking its own input (the call of its module could not be read)",
        )
    for name in block.colwise:
        entries.append(
            PlanEntry(
                f"{inner}.{name}",
                "ColwiseParallel",
                dict(input_layouts=colwise_input, output_layouts=Shard(-1), use_local_output=True),
                group,
                why,
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(
        PlanEntry(
            f"{part.path}.{block.outer}.{block.rowwise}",
            "RowwiseParallel",
            rowwise,
            group,
            f"row-parallel, in the module its column-parallel half feeds: {reduced}",
        )
    )
    return entries


def _block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    if isinstance(part.block, SplitBlock):
        return _split_entries(part, sp)
    if isinstance(part.block, MoeBlock):
        return _moe_entries(part, sp)
    if isinstance(part.block, LayerExpertsBlock):
        return layer_experts_entries(part.path, part.block.routers, part.block.input_norm, sp)
    if isinstance(part.block, LatentBlock):
        return _latent_entries(part, sp)
    if isinstance(part.block, BucketedAttentionBlock):
        assert part.call is not None
        return bucketed_attention_entries(
            part.path, part.block, part.call, _input_layouts(part.call, sp, desired=Shard(-1)), sp
        )
    if isinstance(part.block, GatedDeltaNetBlock):
        assert part.call is not None
        return gated_delta_net_entries(part.path, part.block, _input_layouts(part.call, sp), sp)
    if isinstance(part.block, MultiHeadMixerBlock):
        assert part.call is not None
        return mlstm_entries(part.path, part.block, _input_layouts(part.call, sp), sp)
    if isinstance(part.block, Mamba1Block):
        return mamba1_entries(part.path, part.block, sp)
    if isinstance(part.block, Mamba2Block):  # plangen.styles.mamba2: split by heads
        block = part.block
        return [
            mamba2_mixer_entry(part.path, sp),
            *mamba2_children_entries(part.path, sp, norm=block.norm, out_proj=block.out_proj),
        ]
    block, group = part.block, part.block.kind
    entries: list[PlanEntry] = []
    call = part.call
    # Grouped-query attention entered through its own input: KV heads replicated where the TP size
    # exceeds them (plangen.styles.kv_heads; the styles read the head counts when applied).
    kv = block.kv_projections if call is not None else ()
    heads = block.head_attributes
    if call is not None:
        gathered = "one all-gather of the sequence per block" if sp else "no communication"
        prepared = dict(**_input_layouts(call, sp), use_local_output=False)
        style = (
            "PrepareAttentionInput"
            if kv
            or heads
            or block.reads_shared_kv
            or block.shared_tables
            or block.padded_heads
            or part.batch_head_inputs
            else "PrepareModuleInput"
        )
        why = f"{gathered}; one gradient reduction per block in backward"
        if block.gate_statistics:
            style, why = (
                "ActivationSparsityParallel",
                f"{why}; its gate's top-k statistics summed over TP (2 x B·S values)",
            )
        if block.input_sharded:  # its forward reshapes by the input's own width: hand it this rank's
            prepared = dict(**_input_layouts(call, sp, desired=Shard(-1)), use_local_output=True)
            why = (
                ("an all-to-all to " if sp else "")
                + "this rank's slice of the hidden dimension, the width its forward "
                "unpacks; each column-parallel projection all-gathers it (a reduce-scatter back in backward)"
            )
        if heads:
            prepared["head_attributes"] = heads
            why += f"; its forward shapes by {', '.join(heads)}: made this rank's"
        if part.batch_head_inputs:
            prepared["batch_head_inputs"] = part.batch_head_inputs
            why += batch_head_rows_why(part.batch_head_inputs)
        if block.padded_heads:
            prepared["padded_heads"] = True
            why += "; its query heads, a count no even TP size divides, padded with zero heads to a multiple of the TP size"
        if block.shared_tables:
            prepared["shared_tables"] = block.shared_tables
            why += f"; its {', '.join(block.shared_tables)} (no heads axis) replicated, their gradient summed over TP"
        if block.head_parameters:  # as gpt-oss's hand-written plan: the block's own style splits them
            style, why = (
                "AttentionSinksParallel",
                f"{why}; its per-head {', '.join(block.head_parameters)} split with the heads",
            )
        if block.shared_parameters:
            style, why = (
                "PairedHeadsAttentionInput",
                (
                    f"{why}; heads paired i, i + H/2 (whole pairs per rank); its {', '.join(block.shared_parameters)}, "
                    "shared by every head, replicated with their gradient summed over TP"
                ),
            )
        entries.append(PlanEntry(part.path, style, prepared, group, why))
        colwise_input = Shard(-1) if block.input_sharded else Replicate()
        colwise_why = "column-parallel: each rank computes its own " + ("heads" if group == "attention" else "slice")
    else:
        if heads:
            entries.append(
                PlanEntry(
                    part.path,
                    "LocalHeadCounts",
                    dict(attributes=heads),
                    group,
                    f"its forward shapes by {', '.join(heads)}: made this rank's",
                )
            )
        colwise_input = SEQ if sp else Replicate()
        colwise_why = (
            "column-parallel, taking its own input: one gradient reduction, as its only input projection"
            if len(block.colwise) == 1
            else "column-parallel, taking its own input (the layer's call of the block could not be read)"
        )
    for name in block.colwise:
        if name in kv:
            why = "column-parallel over KV heads; replicated where TP exceeds them"
            colwise = dict(input_layouts=colwise_input, output_layouts=Shard(-1), use_local_output=True)
            entries.append(PlanEntry(f"{part.path}.{name}", "KVHeadsColwiseParallel", colwise, group, why))
        else:
            entries.append(_colwise_entry(f"{part.path}.{name}", block, name, colwise_input, group, colwise_why))
    for name in block.head_gates:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "RowwiseParallel",
                dict(input_layouts=Shard(-1), output_layouts=Shard(-1), use_local_output=True),
                group,
                "reads every KV head's values, one output per KV head: row-parallel on this rank's heads, "
                "the partial sums reduce-scattered to this rank's heads' outputs",
            )
        )
    for name in block.per_head_norms:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ReplicatedWithGradAllReduce",
                dict(sequence_dim=2, use_local_output=True),
                group,
                "per-head norm sees only local heads: its weight gradient is summed over TP",
            )
        )
    for name in block.scalar_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "AllReduceParamGrads",
                {},
                group,
                "single-valued parameters applied to this rank's slice only: their gradient is summed over TP",
            )
        )
    for name in block.conv_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ConvChannelsParallel",
                {},
                group,
                "short conv over a projection's heads: its channels split with them, no communication",
            )
        )
    for name in block.shared_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "AllReduceParamGrads",
                {},
                group,
                "read by every local head: replicated, its gradient summed over TP",
            )
        )
    for name in block.projection_norms:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ShardedNormParallel",
                {},
                group,
                "norm over the whole projection, sharded with its heads: one all-reduce of B·S values each way",
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    style, why = "RowwiseParallel", f"row-parallel: {reduced}"
    if part.modified_in_place and not sp:  # under SP the output stays a DTensor: no view is handed out
        style, why = "RowwiseParallelOwnOutput", f"{why}; its output is a copy, which the layer modifies in place"
    entries.append(PlanEntry(f"{part.path}.{block.rowwise}", style, rowwise, group, why))
    return entries


def _concrete_entries(analysis: Analysis, sp: bool) -> tuple[list[PlanEntry], list[Replicated]]:
    entries: list[PlanEntry] = []
    replicated = list(analysis.kept)
    if analysis.embedding is not None:
        reduced = "reduce-scatter into the sequence-sharded residual" if sp else "all-reduce"
        layouts = dict(input_layouts=Replicate(), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp)
        why = f"vocab-parallel embedding; {reduced}"
        if analysis.embedding_scaled:
            entries.append(
                PlanEntry(
                    analysis.embedding,
                    "ScaledEmbeddingParallel",
                    layouts,
                    "embeddings",
                    f"{why}; its own scale applied to the partial lookup first",
                )
            )
        elif analysis.embedding_modified_in_place and not sp:  # under SP the output stays a DTensor
            entries.append(
                PlanEntry(
                    analysis.embedding,
                    "RowwiseParallelOwnOutput",
                    layouts,
                    "embeddings",
                    f"{why}; its output is a copy, which the model modifies in place",
                )
            )
        else:
            entries.append(PlanEntry(analysis.embedding, "RowwiseParallel", layouts, "embeddings", why))
    for reader, embedding in analysis.embedding_row_readers:
        entries.append(
            PlanEntry(
                reader,
                "EmbeddingRowReadParallel",
                dict(embedding=embedding),
                "embeddings",
                f"its forward reads a row of {embedding}.weight itself: read whole from the vocab-parallel "
                "weight (one all-reduce of the hidden size)",
            )
        )
    per_layer = analysis.per_layer_inputs
    for path, scaled in analysis.token_tables:
        # Whole output on every rank, as the model hands it on (reshaped per layer), unless under SP
        # the layers take it on their sequence shards (plans/per_layer_inputs.py).
        style = "ScaledEmbeddingParallel" if scaled else "RowwiseParallel"
        sharded = sp and per_layer is not None and path == per_layer.table
        why = "vocab-parallel table looked up by token outside the layers; " + (
            "reduce-scattered into the sequence shards the layers take"
            if sharded
            else "all-reduced to its whole output"
        )
        layouts = dict(
            input_layouts=Replicate(), output_layouts=SEQ if sharded else Replicate(), use_local_output=not sharded
        )
        entries.append(
            PlanEntry(
                path,
                style,
                layouts,
                "embeddings",
                f"{why}; its own scale applied to the partial lookup first" if scaled else why,
            )
        )
    if per_layer is not None:
        more, kept = per_layer_input_entries(per_layer, sp)
        entries += more
        replicated += kept
    if sp:
        entries += [
            PlanEntry(
                path,
                "PrepareModuleOutput",
                dict(output_layouts=Replicate(), desired_output_layouts=Replicate(), use_local_output=False),
                "embeddings",
                "position embedding, whole on every rank: a Replicate DTensor, so adding it to the "
                "sequence-sharded token embedding takes this rank's slice (no communication)",
            )
            for path in analysis.positions
        ]
        entries += [
            PlanEntry(
                path,
                "SequenceParallelOwnParameters",
                {},
                "other",
                "own per-feature parameters on the sequence-sharded residual: Replicate DTensors in its "
                "forward, their gradient summed over TP",
            )
            for path in analysis.residual_parameters
        ]
    for part in analysis.blocks:
        entries += _block_entries(part, sp)
    for part in analysis.tower_blocks:  # a tower's sequence is not the decoder's: TP only, under SP too
        entries += _block_entries(part, False)
    entries += [per_head_input_entry(layer, head_input) for layer, head_input in analysis.head_inputs]
    if sp:
        groups = {k.pattern: k.group for k in analysis.kept}
        on_shard = set(per_layer.layer_linears) if per_layer is not None else set()
        entries += [
            _gathered_entry(part, groups.get(part.path, "other"))
            for part in analysis.gathered
            if part.path not in on_shard
        ]
    # Under SP the norm before experts the layer calls itself takes the whole sequence (plans/layer_experts.py).
    whole = (
        {
            f"{p.path.rpartition('.')[0]}.{p.block.input_norm}"
            for p in analysis.blocks
            if isinstance(p.block, LayerExpertsBlock) and p.block.input_norm
        }
        if sp
        else set()
    )
    for norm in analysis.norms:
        if norm in whole:
            continue
        if sp:
            entries.append(
                PlanEntry(
                    norm,
                    "SequenceParallel",
                    dict(sequence_dim=1, use_local_output=False),
                    "norms",
                    "norm on the local sequence shard",
                )
            )
        else:
            replicated.append(Replicated(norm, "sees the full hidden state on every rank: nothing to shard", "norms"))
    if analysis.head is not None:
        entries.append(
            PlanEntry(
                analysis.head,
                "ColwiseParallel",
                dict(input_layouts=SEQ if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False),
                "output",
                "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
            )
        )
    return entries, replicated


def _generalize(
    items: list[Item],
    layers_path: str | None,
    layers: nn.ModuleList | None,
    key: Callable[[Item], Any],
    rename: Callable[[Item, str], Item],
) -> list[Item]:
    """One ``layers.*`` item where every layer holding that module gets the same item; the rest per layer.

    Layers of different kinds (Jamba's dense and MoE ``feed_forward``) keep per-layer patterns, so a
    pattern never reaches a module the plan did not derive it for.
    """
    if layers_path is None or layers is None:
        return items
    prefix = layers_path + "."
    by_generic: dict[str, list[Item]] = {}
    for item in items:
        if item.pattern.startswith(prefix):
            index, _, rest = item.pattern[len(prefix) :].partition(".")
            if index.isdigit():
                by_generic.setdefault(f"{prefix}*.{rest}" if rest else f"{prefix}*", []).append(item)
    out: list[Item] = []
    emitted: set[str] = set()
    for item in items:
        generic = next((g for g, group in by_generic.items() if any(i is item for i in group)), None)
        if generic is None:
            out.append(item)
            continue
        if generic in emitted:
            continue
        group = by_generic[generic]
        rest = generic[len(prefix) + 2 :]
        holders = [i for i, layer in enumerate(layers) if _has_submodule(layer, rest)]
        same = len({repr(key(i)) for i in group}) == 1 and len(group) == len(holders)
        if same:
            out.append(rename(group[0], generic))
            emitted.add(generic)
        else:
            out.append(item)
    return out


def _has_submodule(layer: nn.Module, rest: str) -> bool:
    if not rest:
        return True
    try:
        layer.get_submodule(rest)
    except AttributeError:
        return False
    return True


def build_plan_from_analysis(model: nn.Module, analysis: Analysis, sequence_parallel: bool) -> Plan:
    """The plan data for an analysis (see :func:`build_synthesized_plan`)."""
    entries, replicated = _concrete_entries(analysis, sequence_parallel)
    stacks = [analysis.layers_path] if analysis.layers_path else []
    for path in [*stacks, *analysis.tower_stacks, *analysis.block_stacks]:
        layers = model.get_submodule(path)
        entries = _generalize(
            entries,
            path,
            layers,
            key=lambda e: (e.style, sorted((k, repr(v)) for k, v in e.kwargs.items())),
            rename=lambda e, p: PlanEntry(p, e.style, e.kwargs, e.group, e.why),
        )
        replicated = _generalize(
            replicated,
            path,
            layers,
            key=lambda r: r.why,
            rename=lambda r, p: Replicated(p, r.why, r.group),
        )
    return Plan(tuple(entries), "synthesized", tuple(replicated), sequence_parallel)


def build_synthesized_plan(model: nn.Module, sequence_parallel: bool) -> Plan:
    """A Megatron-style plan derived from ``model``'s module tree (source ``"synthesized"``).

    Raises a one-line ``ValueError`` when nothing in the decoder layers can be sharded safely, or
    when ``sequence_parallel`` is asked for and a module on the residual stream cannot take a
    sequence shard.
    """
    analysis = analyze_model(model)
    if analysis.problem is not None:
        raise ValueError(f"{analysis.class_name}: no synthesized plan: {analysis.problem}")
    if sequence_parallel and analysis.sp_problems:
        raise ValueError(f"{analysis.class_name}: no sequence-parallel synthesized plan: {analysis.sp_problems[0]}")
    # A tied embedding and head: the pair of tied styles, one parameter under any runtime.
    return tie_plan_entries(model, build_plan_from_analysis(model, analysis, sequence_parallel))

"""Plan entries for attention with a projection of one value per (bucket, head) (ProphetNet's
n-gram self-attention: :mod:`plangen.plans.recognize_bucketed`)."""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.forward_source import BlockCall
from plangen.plans.layouts import SEQ
from plangen.plans.recognize_bucketed import BucketedAttentionBlock


def bucketed_attention_entries(
    path: str, block: BucketedAttentionBlock, call: BlockCall, prepared: dict[str, Any], sp: bool
) -> list[PlanEntry]:
    """The block handed this rank's slice of the hidden dimension (``prepared``: its input's layouts,
    desired ``Shard(-1)``), q/k/v and the bucketed projection column-parallel on it (each all-gathers
    it), the output projection reduce-scattered back to the slice, and the block's output gathered.
    (No class with this block has a sequence-parallel plan yet: under SP the output would be kept
    sequence-sharded, unproven.)"""
    others = (call.outputs or 1) - 1
    gathered = SEQ if sp else Replicate()
    sliced = dict(input_layouts=Shard(-1), use_local_output=True)
    counts = ", ".join(block.head_attributes)
    style, helper = "PrepareAttentionInputOutput", {}
    if block.all_heads_helper is not None:
        style, helper = (
            "BucketedAttentionInputOutput",
            dict(
                bucketed=block.bucketed,
                all_heads_helper=block.all_heads_helper[0],
                all_heads_dim=block.all_heads_helper[1],
            ),
        )
    entries = [
        PlanEntry(
            path,
            style,
            dict(
                **prepared,
                use_local_input=True,
                output_layouts=(Shard(-1), *(None,) * others),
                desired_output_layouts=(gathered, *(Replicate(),) * others),
                use_local_output=True,
                head_attributes=block.head_attributes,
                head_inputs=block.head_inputs,
                **helper,
            ),
            "attention",
            "this rank's slice of the hidden dimension, the width its forward unpacks and reshapes by before and after "
            f"{block.rowwise}; its output all-gathered back (its other outputs pass through); {counts} made this rank's"
            + (
                f"; its per-head {', '.join(block.head_inputs)} sliced to this rank's heads"
                if block.head_inputs
                else ""
            )
            + (
                f"; {block.all_heads_helper[0]} (its input transposed before {block.bucketed}) run for all heads, "
                f"{block.bucketed}'s output all-gathered for it"
                if block.all_heads_helper
                else ""
            ),
        ),
    ]
    entries += [
        PlanEntry(
            f"{path}.{name}",
            "ColwiseParallel",
            dict(**sliced, output_layouts=Shard(-1)),
            "attention",
            "column-parallel: all-gathers the input slice, computes this rank's heads",
        )
        for name in block.colwise
    ]
    entries.append(
        PlanEntry(
            f"{path}.{block.bucketed}",
            "FusedColwiseParallel",
            dict(part_sizes=(1,) * block.buckets, **sliced),
            "attention",
            f"one value per (bucket, head), bucket major: {block.buckets} parts of all heads, "
            "re-laid out so each rank holds its heads of every bucket",
        )
    )
    entries.append(
        PlanEntry(
            f"{path}.{block.rowwise}",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=Shard(-1), use_local_output=True),
            "attention",
            "row-parallel: the partial sums reduce-scattered to this rank's slice of the hidden dimension",
        )
    )
    return entries

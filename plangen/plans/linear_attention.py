"""Gated-delta-net linear attention sharded by heads, as plan entries (see :mod:`plangen.styles.linear_attention`).

Per mixer, as a dense attention block: forward one all-reduce (``out_proj``), or one all-gather of
the sequence in and one reduce-scatter out under SP (the recurrence runs over the whole sequence);
backward one all-reduce of the block input's gradient, and one of the gated norm's weight gradient.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.recognize_linear_attention import GatedDeltaNetBlock
from plangen.plans.layouts import row_parallel_output


def gated_delta_net_entries(
    path: str, block: GatedDeltaNetBlock, prepared: dict[str, Any], sp: bool
) -> list[PlanEntry]:
    """The mixer at ``path``, its input laid out by ``prepared`` (``PrepareModuleInput``'s layouts)."""
    group = "attention"
    gathered = "one all-gather of the sequence per mixer" if sp else "no communication"
    if block.lru is not None:
        split = (
            f"the conv's channels and {block.lru}'s heads split over TP together, "
            f"{', '.join(block.head_attributes)} made this rank's"
        )
    elif block.head_parameters or block.head_attributes:
        split = (
            f"key heads and their value heads split over TP: {', '.join(block.head_parameters)} and the conv's "
            f"channels with them, {', '.join(block.head_attributes)} made this rank's"
        )
    else:
        split = "the depthwise conv's channels split over TP"
    entries = [
        PlanEntry(
            path,
            "GatedDeltaNetParallel",
            dict(
                **prepared,
                use_local_output=False,
                head_attributes=block.head_attributes,
                head_parameters=block.head_parameters,
                conv_parts=block.conv_parts,
            ),
            group,
            f"{gathered}; one gradient reduction per mixer in backward; {split}",
        )
    ]
    for name in block.colwise:
        if name == block.packed and block.packed_parts:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "FusedColwiseParallel",
                    dict(part_sizes=block.packed_parts, input_layouts=Replicate(), use_local_output=True),
                    group,
                    f"column-parallel by channels; packed parts {block.packed_parts} re-laid out so each rank holds "
                    "its slice of every part, the conv's channels among them",
                )
            )
        elif name == block.packed:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "FusedColwiseParallel",
                    dict(part_sizes=block.conv_parts, input_layouts=Replicate(), use_local_output=True),
                    group,
                    f"column-parallel by heads; packed [q; k; v] {block.conv_parts} re-laid out so each rank holds "
                    "its slice of every part, as the conv takes them",
                )
            )
        else:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "ColwiseParallel",
                    dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
                    group,
                    f"column-parallel by {block.lru}'s heads: each rank computes its own channels"
                    if block.lru
                    else "column-parallel by key-head groups: each rank computes its own heads",
                )
            )
    if block.lru is not None:
        entries.append(
            PlanEntry(
                f"{path}.{block.lru}",
                "RGLRUParallel",
                {},
                group,
                "RG-LRU by its block-diagonal heads, with the conv's channels: gates and recurrent_param Shard(0), "
                "no communication",
            )
        )
    if block.norm is not None:
        entries.append(
            PlanEntry(
                f"{path}.{block.norm}",
                "AllReduceParamGrads",
                {},
                group,
                "gated norm of one head's width, shared by every head, sees only local heads: its weight gradient is summed over TP",
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(PlanEntry(f"{path}.{block.rowwise}", "RowwiseParallel", rowwise, group, f"row-parallel: {reduced}"))
    return entries

"""An mLSTM layer (xLSTM) sharded by heads, as plan entries (see :mod:`plangen.plans.recognize_recurrent`).

Per layer, as a dense attention block: forward one all-reduce (``out_proj``), or one all-gather of
the sequence in and one reduce-scatter out under SP (the recurrence runs over the whole sequence);
backward one all-reduce of the layer input's gradient. The multi-head norm communicates nothing.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.recognize_recurrent import MultiHeadMixerBlock
from plangen.plans.layouts import row_parallel_output


def mlstm_entries(path: str, block: MultiHeadMixerBlock, prepared: dict[str, Any], sp: bool) -> list[PlanEntry]:
    """The layer at ``path``, its input laid out by ``prepared`` (``PrepareModuleInput``'s layouts)."""
    group = "attention"
    gathered = "one all-gather of the sequence per layer" if sp else "no communication"
    entries = [
        PlanEntry(
            path,
            "PrepareAttentionInput",
            dict(**prepared, use_local_output=False, head_attributes=block.head_attributes),
            group,
            f"{gathered}; one gradient reduction per layer in backward; its forward reshapes by "
            f"{', '.join(block.head_attributes)}: made this rank's",
        )
    ]
    entries += [
        PlanEntry(
            f"{path}.{name}",
            "ColwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
            group,
            "column-parallel by heads: each rank computes its own heads (a gate: one value per head)",
        )
        for name in block.colwise
    ]
    entries.append(
        PlanEntry(
            f"{path}.{block.norm}",
            "MultiHeadNormParallel",
            dict(head_attributes=("num_heads", "num_features")),
            group,
            "normalises each head on its own: its weight sharded with the heads, no communication",
        )
    )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(PlanEntry(f"{path}.{block.rowwise}", "RowwiseParallel", rowwise, group, f"row-parallel: {reduced}"))
    return entries

"""A Mamba1 mixer's plan entries: its channels split over TP (``plangen.styles.mamba1``), ``out_proj``
row-parallel as attention's output projection is."""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.recognize_mamba1 import Mamba1Block
from plangen.plans.layouts import SEQ


def mamba1_entries(path: str, block: Mamba1Block, sequence_parallel: bool) -> list[PlanEntry]:
    """The mixer at ``path``: whole sequence in (the scan runs over it), a partial sum out of
    ``out_proj`` reduced once (all-reduce, or reduce-scatter back to the sequence shards under SP)."""
    sp = sequence_parallel
    gathered = "one all-gather of the sequence in (the scan needs all of it)" if sp else "the whole input on every rank"
    reduced = "reduce-scatter back to the sequence-sharded residual" if sp else "one all-reduce"
    return [
        PlanEntry(
            path,
            "Mamba1MixerParallel",
            dict(input_layouts=SEQ if sp else Replicate(), grad_reduced=block.grad_reduced),
            "other",
            f"Mamba1 mixer split by channels: {gathered}; x_proj row-parallel (one all-reduce of B·S·(dt_rank+2·state)); "
            f"the gradients of the input and of dt/B/C summed over TP at {', '.join(block.grad_reduced)}",
        ),
        PlanEntry(
            f"{path}.out_proj",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp),
            "other",
            f"row-parallel: {reduced}",
        ),
    ]

"""The layouts plans are written in, defined once: the residual stream's under sequence parallel,
and how a row-parallel layer hands its partial sums back to the residual stream."""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import Replicate, Shard

SEQ = Shard(1)  # [batch, sequence, hidden] sharded on the sequence: the residual stream under SP


def row_parallel_output(sequence_parallel: bool) -> tuple[dict[str, Any], str]:
    """A row-parallel layer's keyword layouts back onto the residual stream, and what that costs."""
    sp = sequence_parallel
    layouts = dict(input_layouts=Shard(-1), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp)
    return layouts, "reduce-scatter back to the sequence-sharded residual" if sp else "one all-reduce"


__all__ = ["SEQ", "row_parallel_output"]

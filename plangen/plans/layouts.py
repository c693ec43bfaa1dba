"""The layouts plans are written in, defined once: the residual stream's under sequence parallel,
how a row-parallel layer hands its partial sums back to the residual stream, and how a block is
handed the hidden state where its layer passes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall

SEQ = Shard(1)  # [batch, sequence, hidden] sharded on the sequence: the residual stream under SP


def row_parallel_output(sequence_parallel: bool) -> tuple[dict[str, Any], str]:
    """A row-parallel layer's keyword layouts back onto the residual stream, and what that costs."""
    sp = sequence_parallel
    layouts = dict(input_layouts=Shard(-1), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp)
    return layouts, "reduce-scatter back to the sequence-sharded residual" if sp else "one all-reduce"


def hidden_state_layouts(call: BlockCall, sp: bool, desired: Placement = Replicate()) -> dict[str, Any]:
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


__all__ = ["SEQ", "hidden_state_layouts", "row_parallel_output"]

"""The style registry: names → torch ``ParallelStyle`` classes, and plangen's own styles.

Plans name their styles (``"ColwiseParallel"``) so that a plan can be data, rendered and checked
without torch; :func:`build_style` turns a name and its keyword arguments into the object. Every
style here is one of torch's own or a small subclass of one, documented below.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)


class RotaryEmbedParallel(SequenceParallel):
    """Sequence parallel for rotary-embedding modules called as ``rotary_emb(x, position_ids)``.

    The first input is the sequence-sharded hidden state, the second the position ids (replicated);
    the outputs (cos, sin) are returned as local tensors or DTensors sharded on the sequence.
    """

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):  # type: ignore[override]
        new_inputs = list(inputs)
        if not isinstance(inputs[0], DTensor):
            new_inputs[0] = DTensor.from_local(inputs[0], device_mesh, sequence_sharding, run_check=False)
        if len(inputs) > 1 and not isinstance(inputs[1], DTensor):
            new_inputs[1] = DTensor.from_local(inputs[1], device_mesh, (Replicate(),), run_check=False)
        return type(inputs)(new_inputs)

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):  # type: ignore[override]
        return type(outputs)(o.to_local() if use_local_output else o for o in outputs)


class ReplicatedWithGradAllReduce(SequenceParallel):
    """Replicated weights whose module sees a different slice on each TP rank (per-head norms).

    The module's weights become ``Replicate()`` DTensors and its local input is labelled as sharded
    on ``sequence_dim`` (the heads dimension of ``[batch, seq, heads, head_dim]`` by default), so
    autograd sums the weight gradient over the TP group. The output is returned local.
    """

    def __init__(self, *, sequence_dim: int = 2, use_local_output: bool = True) -> None:
        super().__init__(sequence_dim=sequence_dim, use_local_output=use_local_output)


# Every style a plan may name. Keys are the class names written in plan files.
STYLE_CLASSES: dict[str, type[ParallelStyle]] = {
    cls.__name__: cls
    for cls in (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        PrepareModuleInputOutput,
        RotaryEmbedParallel,
        ReplicatedWithGradAllReduce,
    )
}


def build_style(name: str, kwargs: Mapping[str, Any] | None = None) -> ParallelStyle:
    """Instantiate the registered style ``name`` with ``kwargs``; unknown names list the known ones."""
    try:
        cls = STYLE_CLASSES[name]
    except KeyError:
        known = ", ".join(sorted(STYLE_CLASSES))
        raise ValueError(f"unknown parallel style {name!r}; known styles: {known}") from None
    return cls(**dict(kwargs or {}))


__all__ = [
    "STYLE_CLASSES",
    "ReplicatedWithGradAllReduce",
    "RotaryEmbedParallel",
    "Replicate",
    "Shard",
    "build_style",
    "torch",
]

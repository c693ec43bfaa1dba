"""DTensor inputs an FSDP2 unit does not use get a DTensor gradient, not FSDP2's plain zeros.

FSDP2 (torch 2.13) passes every input of a ``fully_shard`` unit that requires grad through one
autograd function (``RegisterPostBackwardFunction``). When the unit never uses one of them, autograd
gives that function a materialised zero gradient for it, and for a DTensor input the zeros are a
plain tensor of the global shape. Where the same DTensor also feeds another unit, the two gradients
are summed, and DTensor refuses the sum of a plain tensor and a DTensor. Zamba2 under sequence
parallel hands the token embeddings (a sequence-sharded DTensor) to every layer; only its hybrid
layers read them. :func:`apply_dtensor_input_grads` puts an identity in front of FSDP2's function
that hands back a DTensor of zeros in that case (no communication, a no-op otherwise).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class _DTensorGrad(torch.autograd.Function):
    """Identity on a DTensor; a plain zero gradient comes back as a DTensor of zeros in its layout."""

    @staticmethod
    def forward(ctx: Any, x: DTensor) -> DTensor:  # type: ignore[override]
        ctx.layout = (x.device_mesh, x.placements, x.shape, x.stride(), x.to_local().shape)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if isinstance(grad, DTensor):
            return grad
        mesh, placements, shape, stride, local_shape = ctx.layout
        if grad.shape != shape or grad.any():
            raise RuntimeError(f"a plain, non-zero gradient of shape {tuple(grad.shape)} for a DTensor input "
                               f"of shape {tuple(shape)}: only FSDP2's zeros for an unused input are mended")
        zeros = grad.new_zeros(local_shape)
        return DTensor.from_local(zeros, mesh, placements, run_check=False, shape=shape, stride=stride)


def _guard(value: Any) -> Any:
    if isinstance(value, DTensor) and value.requires_grad and torch.is_grad_enabled():
        return _DTensorGrad.apply(value)
    return value


def _guard_inputs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # The first positional input is the hidden state every layer reads: left as it is.
    return (args[:1] + tuple(_guard(a) for a in args[1:]), {k: _guard(v) for k, v in kwargs.items()})


def apply_dtensor_input_grads(unit: nn.Module) -> None:
    """Run the identity before FSDP2's hook of ``unit`` (call it after ``fully_shard(unit)``: FSDP2
    prepends its hook, so this one, prepended later, runs first)."""
    unit.register_forward_pre_hook(_guard_inputs, prepend=True, with_kwargs=True)


__all__ = ["apply_dtensor_input_grads"]

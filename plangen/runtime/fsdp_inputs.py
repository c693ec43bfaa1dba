"""What FSDP2 does to a unit's inputs, mended: DTensor inputs it does not use get a DTensor gradient,
and a container the model hands its layers to fill keeps its identity.

**Unused DTensor inputs.**

FSDP2 (torch 2.13) passes every input of a ``fully_shard`` unit that requires grad through one
autograd function (``RegisterPostBackwardFunction``). When the unit never uses one of them, autograd
gives that function a materialised zero gradient for it, and for a DTensor input the zeros are a
plain tensor of the global shape. Where the same DTensor also feeds another unit, the two gradients
are summed, and DTensor refuses the sum of a plain tensor and a DTensor. Zamba2 under sequence
parallel hands the token embeddings (a sequence-sharded DTensor) to every layer; only its hybrid
layers read them. :func:`apply_dtensor_input_grads` puts an identity in front of FSDP2's function
that hands back a DTensor of zeros in that case (no communication, a no-op otherwise).

**Containers a layer fills.** FSDP2's pre-forward casts a unit's inputs to its ``param_dtype``
(``cast_forward_inputs``) by rebuilding every dict and list in them. transformers 5.8.x's Gemma 3n hands
each decoder layer one dict, ``shared_kv_states``, which a layer fills with its keys and values and a
later layer reads: under FSDP2 each layer filled a copy, and the first KV-sharing layer failed
(``KeyError: 2``), with or without TP. :func:`keep_filled_inputs` hands the unit the caller's own dicts
and lists back after FSDP2's cast (their tensors are the model's own, left as it made them).
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
            raise RuntimeError(
                f"a plain, non-zero gradient of shape {tuple(grad.shape)} for a DTensor input "
                f"of shape {tuple(shape)}: only FSDP2's zeros for an unused input are mended"
            )
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


_HANDED = "_plangen_handed_containers"


# Both hooks stand aside in a compiled layer (plangen.runtime.compile): torch 2.11's dynamo cannot trace the
# module's __dict__ they keep the note in (a graph break, which fullgraph refuses).


def _note_containers(module: nn.Module, args: tuple, kwargs: dict) -> None:
    if torch.compiler.is_compiling():
        return
    module.__dict__[_HANDED] = {k: v for k, v in kwargs.items() if type(v) in (dict, list)}


def _hand_containers_back(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    if torch.compiler.is_compiling():
        return None
    handed = module.__dict__.pop(_HANDED, None)
    if not handed or all(kwargs.get(k) is v for k, v in handed.items()):
        return None
    return args, {k: handed.get(k, v) for k, v in kwargs.items()}


def keep_filled_inputs(unit: nn.Module) -> None:
    """Keyword inputs of ``unit`` that are dicts or lists reach its forward as the caller's objects,
    not FSDP2's copies (call after ``fully_shard(unit)``: the note is taken before FSDP2's hook, the
    objects handed back after it)."""
    unit.register_forward_pre_hook(_hand_containers_back, with_kwargs=True)
    unit.register_forward_pre_hook(_note_containers, prepend=True, with_kwargs=True)


__all__ = ["apply_dtensor_input_grads", "keep_filled_inputs"]

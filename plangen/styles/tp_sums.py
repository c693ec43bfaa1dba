"""Sums over the TP mesh inside autograd, by one c10d all-reduce each, without DTensor's dispatch:
the primitives the styles that run local tensors through a module (experts, Mamba1 mixers, latent
attention, the embedding row read) build their forward and backward from."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from plangen.stack import torch_compat as compat


class SumGradOverMesh(torch.autograd.Function):
    """Identity forward; backward, the gradient summed over the mesh's group by one c10d all-reduce.

    What ``DTensor.from_local(t, mesh, [Replicate()]).to_local(grad_placements=[Partial()])``
    computes, without DTensor's dispatch: that round trip cost 7x the CPU of this one (fake group,
    one 256 x 256 gradient), and a MoE layer takes two of them per step (issue 10: the MoE step
    benchmark's plangen side spent more main-thread CPU than transformers' in the experts path).
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        # A copy: autograd may hand the same gradient tensor to another branch (an add's backward).
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class SumOverMesh(torch.autograd.Function):
    """Forward, partial sums reduced over the mesh's group (one c10d all-reduce); backward identity:
    ``from_local(t, [Partial()]).redistribute([Replicate()]).to_local()`` without DTensor's dispatch."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        summed = tensor.contiguous().clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


class GradOnceOverMesh(torch.autograd.Function):
    """Identity forward; backward, the gradient kept on the group's first rank and zero on the others.

    For a gradient that is whole on every rank flowing into one that is partial (a sum over ranks,
    reduced later): counted once, so the later reduction adds it exactly once, with no collective."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.first = dist.get_rank(group) == 0
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return (grad if ctx.first else torch.zeros_like(grad)), None


class ShareOverMesh(torch.autograd.Function):
    """Forward, this rank's ``1/size`` share of a whole value (the shares are summed over the mesh
    later, with partial sums); backward, the gradient passed on whole.

    For a term every rank computes whole inside a block whose output is a partial sum (LongCat-Flash's
    zero-compute experts on transformers 5.25): the sum over ranks is the term once, and the gradient
    of the sum, whole and the same on every rank, is each rank's gradient of the shared value (a
    replicated router's, exact with no collective). Exact for a power-of-two size."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, size: int) -> torch.Tensor:  # type: ignore[override]
        return tensor / size

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def all_reduce_grad(tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    # Identity forward; the gradient is summed over the mesh in backward.
    return SumGradOverMesh.apply(tensor, mesh.get_group())


def grad_once(tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    # Identity forward; in backward the (whole) gradient counts on the mesh's first rank only.
    return GradOnceOverMesh.apply(tensor, mesh.get_group())


def grad_once_pre_hook(mesh: DeviceMesh):
    """A forward pre-hook giving a module's first input :func:`grad_once`: for a replicated reader
    (a router, a latent down-projection) of an input whose gradient a block sums over TP once."""

    def count_once(module: torch.nn.Module, args: tuple) -> tuple:
        return (grad_once(args[0], mesh), *args[1:]) if torch.is_grad_enabled() and args else args

    return count_once


class _CountOnceWhereRead(TorchFunctionMode):
    """While active: the input of every ``F.linear`` whose weight is ``weight()`` (or a dtype
    conversion of it: ``.float()``, ``.type(...)``, ``.to(...)``) gets :func:`grad_once`."""

    CONVERSIONS = (torch.Tensor.float, torch.Tensor.type, torch.Tensor.to)

    def __init__(self, weight: Callable[[], torch.Tensor], mesh: DeviceMesh) -> None:
        super().__init__()
        self.weight, self.mesh, self.converted = weight, mesh, []

    def _is_weight(self, value: Any) -> bool:
        return value is self.weight() or any(value is c for c in self.converted)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.nn.functional.linear
            and len(args) >= 2
            and self._is_weight(args[1])
            and torch.is_grad_enabled()
        ):
            return func(grad_once(args[0], self.mesh), *args[1:], **kwargs)
        out = func(*args, **kwargs)
        if func in self.CONVERSIONS and args and self._is_weight(args[0]):
            self.converted.append(out)  # held for the forward: identity, not an id a freed tensor could reuse
        return out


def count_once_where_weight_is_read(
    module: torch.nn.Module, weight: Callable[[], torch.Tensor], mesh: DeviceMesh
) -> None:
    """During ``module``'s forward, the input of each ``F.linear`` on ``weight()`` counts its gradient
    once over ``mesh`` (:func:`grad_once`): a replicated reader the forward computes itself, by its
    weight, instead of calling it (where :func:`grad_once_pre_hook` on the reader would never run)."""
    active: list[_CountOnceWhereRead] = []

    def enter(mod: torch.nn.Module, args: tuple) -> None:
        mode = _CountOnceWhereRead(weight, mesh)
        mode.__enter__()
        active.append(mode)

    def leave(mod: torch.nn.Module, args: tuple, output: Any) -> None:
        if active:
            active.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    # always_call: an exception inside forward must not leave the mode active.
    module.register_forward_hook(leave, always_call=True)


def replicated_local(tensor: torch.Tensor) -> torch.Tensor:
    # A DTensor here is replicated (the block gathered its input): its local value is the whole tensor.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class SumOverTP(torch.autograd.Function):
    """All-reduce (sum) over the TP mesh; the gradient is all-reduced too (every rank used the sum)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return _all_reduce(local, mesh)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad.contiguous(), ctx.mesh), None


def sum_over_tp(local: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """``local`` summed over the TP mesh, its gradient summed too (every rank used the sum)."""
    return SumOverTP.apply(local, mesh)


def _all_reduce(tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return compat.all_reduce(tensor, mesh)


__all__ = [
    "SumOverTP",
    "GradOnceOverMesh",
    "ShareOverMesh",
    "SumGradOverMesh",
    "SumOverMesh",
    "all_reduce_grad",
    "count_once_where_weight_is_read",
    "grad_once",
    "grad_once_pre_hook",
    "replicated_local",
    "sum_over_tp",
]

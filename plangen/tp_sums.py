"""Sums over the TP mesh inside autograd, by one c10d all-reduce each, without DTensor's dispatch:
the primitives the styles that run local tensors through a module (experts, Mamba1 mixers, latent
attention, the embedding row read) build their forward and backward from."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


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


def replicated_local(tensor: torch.Tensor) -> torch.Tensor:
    # A DTensor here is replicated (the block gathered its input): its local value is the whole tensor.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


__all__ = ["GradOnceOverMesh", "SumGradOverMesh", "SumOverMesh", "all_reduce_grad", "grad_once", "grad_once_pre_hook", "replicated_local"]

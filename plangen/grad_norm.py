"""Gradient norm and clipping for FSDP2 + TP parameters (NeMo RL's names, correct semantics).

Each gradient element is counted exactly once across the world: a rank adds its local shard only
when it holds the first replica along every mesh dimension on which the gradient is replicated.
Summing the local shards of a TP-replicated weight over the TP group, as Megatron-derived code
does, counts it tp-size times.
"""

from __future__ import annotations

from typing import Iterable, Union

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

TensorOrDTensor = Union[torch.Tensor, DTensor]


def to_local_if_dtensor(tensor: TensorOrDTensor) -> torch.Tensor:
    """The local shard of a DTensor (a view, so in-place changes reach the DTensor); else the tensor."""
    with torch.no_grad():
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _as_list(parameters: Iterable[TensorOrDTensor] | TensorOrDTensor) -> list[TensorOrDTensor]:
    return [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)


def _is_first_replica(grad: TensorOrDTensor, groups: list) -> bool:
    """Whether this rank owns the copy of ``grad`` that the norm counts."""
    if not isinstance(grad, DTensor):
        # A plain tensor is not sharded: the same on every rank of the reduction groups.
        return all(dist.get_rank(group) == 0 for group in groups)
    mesh = grad.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return False
    # Replicated along a mesh dimension: only the first coordinate counts.
    if not all(c == 0 for c, p in zip(coordinate, grad.placements) if isinstance(p, Replicate) or p.is_partial()):
        return False
    # A group the mesh does not span (FSDP2 puts non-TP weights on the DP mesh alone) holds
    # copies of the same shard: only its first rank counts.
    mesh_ranks = set(mesh.mesh.flatten().tolist())
    me = dist.get_rank()
    return all(
        dist.get_rank(group) == 0
        for group in groups
        if mesh_ranks.isdisjoint(set(dist.get_process_group_ranks(group)) - {me})
    )


def _group_device(group: dist.ProcessGroup | None) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce_groups(dp_cp_group, tp_group) -> list:
    """The distinct groups to reduce over (the same group passed twice must reduce once)."""
    groups = []
    for group in (dp_cp_group, tp_group):
        if group is None:
            continue
        ranks = tuple(dist.get_process_group_ranks(group))
        if all(tuple(dist.get_process_group_ranks(g)) != ranks for g in groups):
            groups.append(group)
    return groups


def get_grad_norm(
    parameters: Iterable[TensorOrDTensor] | TensorOrDTensor,
    dp_cp_group: dist.ProcessGroup,
    tp_group: dist.ProcessGroup,
    norm_type: Union[int, float] = 2,
    dtype: torch.dtype = torch.float32,
) -> float:
    """The norm of all gradients viewed as one vector, on every rank; ``inf`` supported.

    ``dp_cp_group`` and ``tp_group`` together must span the ranks that hold the parameters' shards.
    """
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    groups = _reduce_groups(dp_cp_group, tp_group)
    device = grads[0].device if grads else _group_device(groups[0] if groups else None)
    if isinstance(device, torch.device) and device.type == "meta":
        raise ValueError("gradients on the meta device have no norm")

    if norm_type == float("inf"):
        # FSDP2 may leave a rank an empty shard of a small parameter: it has no maximum to give.
        shards = [to_local_if_dtensor(g).detach() for g in grads]
        local = [s.abs().max().to(dtype) for s in shards if s.numel() > 0]
        total = torch.stack(local).max() if local else torch.zeros((), dtype=dtype, device=device)
        op = dist.ReduceOp.MAX
    else:
        total = torch.zeros((), dtype=dtype, device=device)
        for g in grads:
            if _is_first_replica(g, groups):
                total += torch.linalg.vector_norm(to_local_if_dtensor(g).detach().to(dtype), norm_type) ** norm_type
        op = dist.ReduceOp.SUM
    for group in groups:
        dist.all_reduce(total, op=op, group=group)
    if norm_type == float("inf"):
        return float(total.item())
    return float(total.item() ** (1.0 / norm_type))


def clip_grad_by_total_norm_(
    parameters: Iterable[TensorOrDTensor] | TensorOrDTensor,
    max_grad_norm: Union[int, float],
    total_norm: float,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Scale gradients in place so that their total norm is at most ``max_grad_norm``.

    The scaling is applied to the gradients themselves, whatever their dtype (a bf16 gradient
    converted to ``dtype`` first would be a copy, and the clip would be lost).
    """
    clip_coeff = float(max_grad_norm) / (float(total_norm) + 1.0e-6)
    if clip_coeff >= 1.0:
        return
    for p in _as_list(parameters):
        if p.grad is not None:
            to_local_if_dtensor(p.grad).mul_(clip_coeff)

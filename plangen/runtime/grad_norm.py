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


# Partial norms are summed in float64 whatever the gradients' dtype: a float32 sum of 65 536 terms
# spanning 1e-2..1e2 already misses a float64 reference by 1.4e-6 relative on CPU. gloo and NCCL
# both all-reduce float64.
_ACCUMULATE_DTYPE = torch.float64
# A shard is upcast a slice at a time, so that a large gradient never has a whole float64 copy.
_UPCAST_ELEMENTS = 1 << 22


def _power_sum(shard: torch.Tensor, norm_type: float) -> torch.Tensor:
    """``sum(|x| ** norm_type)`` over a local shard, in float64."""
    shard = shard.reshape(1) if shard.dim() == 0 else shard
    total = torch.zeros((), dtype=_ACCUMULATE_DTYPE, device=shard.device)
    if shard.numel() == 0:
        return total
    # Split along the first dimension: a view, even of a non-contiguous shard.
    rows_per_slice = max(1, _UPCAST_ELEMENTS // (shard.numel() // shard.shape[0]))
    for piece in shard.split(rows_per_slice):
        total += torch.linalg.vector_norm(piece, norm_type, dtype=_ACCUMULATE_DTYPE) ** norm_type
    return total


def get_grad_norm(
    parameters: Iterable[TensorOrDTensor] | TensorOrDTensor,
    dp_cp_group: dist.ProcessGroup | None,
    tp_group: dist.ProcessGroup | None,
    norm_type: Union[int, float] = 2,
    dtype: torch.dtype = torch.float32,
) -> float:
    """The norm of all gradients viewed as one vector, on every rank; ``inf`` supported.

    ``dp_cp_group`` and ``tp_group`` together must span the ranks that hold the parameters' shards;
    ``None`` for both means a single process (no reduction), as NeMo RL's unit test calls it.
    ``dtype`` is accepted for NeMo RL's signature: the sums are always float64, which is at least as
    precise as any dtype it could name.
    """
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    groups = _reduce_groups(dp_cp_group, tp_group)
    if grads:
        device = grads[0].device
    else:
        device = _group_device(groups[0]) if groups else torch.device("cpu")
    if device.type == "meta":
        raise ValueError("gradients on the meta device have no norm")

    if norm_type == float("inf"):
        # FSDP2 may leave a rank an empty shard of a small parameter: it has no maximum to give.
        shards = [to_local_if_dtensor(g).detach() for g in grads]
        local = [s.abs().max().to(_ACCUMULATE_DTYPE) for s in shards if s.numel() > 0]
        total = torch.stack(local).max() if local else torch.zeros((), dtype=_ACCUMULATE_DTYPE, device=device)
        op = dist.ReduceOp.MAX
    else:
        total = torch.zeros((), dtype=_ACCUMULATE_DTYPE, device=device)
        for g in grads:
            if _is_first_replica(g, groups):
                total += _power_sum(to_local_if_dtensor(g).detach(), norm_type)
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

"""Cross-entropy on vocabulary-parallel logits, without gathering the vocabulary.

The hand-written and synthesized plans leave ``lm_head`` output as a DTensor sharded on the vocabulary
(``Shard(-1)``). torch's ``loss_parallel()`` handles that too, but its backward must also run
inside the context manager; this loss is an ordinary differentiable function. Communication: two
all-reduces of one value per token (max, then sum-of-exp and target logit together), none in the
backward, whose gradient (softmax minus one-hot) is computed locally.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group) -> torch.Tensor:
        logits = local_logits.float()
        vocab_end = vocab_start + logits.shape[-1]
        row_max = logits.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - row_max.unsqueeze(-1)

        outside = (target < vocab_start) | (target >= vocab_end)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sums = torch.stack([exp.sum(dim=-1), target_logit])
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
        sum_exp, target_logit = sums[0], sums[1]

        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_target, outside)
        ctx.input_dtype = local_logits.dtype
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.cross_entropy(logits.view(-1, V), target.view(-1))`` for logits sharded on the vocabulary.

    ``logits``: ``[..., V]``, a DTensor whose last dimension is sharded over one mesh dimension
    (plain tensors fall back to ``F.cross_entropy``). ``target``: ``[...]`` token ids.
    """
    if not isinstance(logits, DTensor):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=ignore_index, reduction=reduction)
    vocab_dim = logits.ndim - 1
    sharded = [i for i, p in enumerate(logits.placements) if isinstance(p, Shard) and p.dim % logits.ndim == vocab_dim]
    others = [p for i, p in enumerate(logits.placements) if i not in sharded and not p.is_replicate()]
    if len(sharded) != 1 or others:
        raise ValueError(f"expected logits sharded on the vocabulary only, got placements {logits.placements}")
    mesh_dim = sharded[0]
    _, offset = compute_local_shape_and_global_offset(logits.shape, logits.device_mesh, logits.placements)
    local = logits.to_local()
    target = target.to(local.device)
    valid = target != ignore_index
    losses = _VocabParallelCrossEntropy.apply(
        local.reshape(-1, local.shape[-1]), target.masked_fill(~valid, 0).reshape(-1), offset[-1],
        logits.device_mesh.get_group(mesh_dim),
    ).view(target.shape)
    losses = losses * valid
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return losses.sum() / valid.sum().clamp(min=1)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")

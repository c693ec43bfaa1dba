"""Losses on vocabulary-parallel logits, without gathering the vocabulary: per-token log-probs, entropy,
cross-entropy.

The hand-written and synthesized plans leave ``lm_head`` output as a DTensor sharded on the vocabulary
(``Shard(-1)``). torch's ``loss_parallel()`` handles cross-entropy, but its backward must also run
inside the context manager and it gives wrong gradients when ``log_softmax`` feeds anything else; these
are ordinary differentiable functions. Plain tensors (TP 1) take the same path without collectives.

Memory: logits are read in chunks of tokens, upcast to float32 one chunk at a time, in the forward and
again in the backward (recomputed, not saved): no float32 ``[tokens, V/tp]`` tensor larger than one
chunk (:data:`CHUNK_BYTES`) is ever held. What is saved is the logits themselves (already held by the
caller) and a few float32 values per token.

Communication, whatever the number of chunks: two all-reduces of a few values per token in the
forward, none in the backward. Each chunk keeps its local max and sum of exponentials (an online
softmax); after the last chunk one MAX all-reduce gives the global max, each rank rescales its sums to
it, and one SUM all-reduce adds the sums, the target logit and (entropy) the sum of ``p * logit``.
Shard offsets come from the mesh coordinate, never from tensor values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

CHUNK_BYTES = 32 * 2**20
"""Float32 bytes of one chunk of ``[tokens, V/tp]`` logits (32 MiB: 110 tokens of a 76k-wide shard):
small enough to bound memory, large enough that each op's fixed cost (Python, thread start-up, a
kernel launch) does not show."""


@dataclass(frozen=True)
class _Spec:
    vocab_start: int  # this rank's first vocabulary id
    group: Any  # the process group the vocabulary is split over; None: not split
    temperature: float
    chunk_tokens: int
    logprobs: bool
    entropy: bool


def _blocks(batch: int, tokens: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """(batch rows, token columns) of each chunk of a ``[batch, tokens, V]`` tensor, ``chunk`` tokens at most."""
    if tokens == 0:
        return
    if tokens <= chunk:
        step = chunk // tokens
        for b in range(0, batch, step):
            yield slice(b, min(b + step, batch)), slice(None)
    else:
        for b in range(batch):
            for t in range(0, tokens, chunk):
                yield slice(b, b + 1), slice(t, min(t + chunk, tokens))


class _VocabParallelStats(torch.autograd.Function):
    """``(log p(target), entropy)`` per token of ``softmax(logits / T)``, the vocabulary split over ``spec.group``.

    ``local``: ``[B, S, V_local]`` in any dtype and strides; ``target``: ``[B, S]`` global ids, ``valid``:
    ``[B, S]`` (False: the log-prob is 0 and gets no gradient). An output not asked for is empty.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, spec: _Spec):
        batch, tokens, width = local.shape
        stat = lambda: torch.zeros((batch, tokens), dtype=torch.float32, device=local.device)  # noqa: E731
        local_max, local_sum = stat(), stat()
        target_logit, weighted = (stat() if spec.logprobs else None), (stat() if spec.entropy else None)
        # The target's column on this rank; targets on other ranks' shards (or ignored) read column 0, then 0.
        inside = valid & (target >= spec.vocab_start) & (target < spec.vocab_start + width)
        column = (target - spec.vocab_start).masked_fill(~inside, 0)
        lowest = torch.finfo(torch.float32).min
        for rows, cols in _blocks(batch, tokens, spec.chunk_tokens):
            x = local[rows, cols]
            if spec.temperature != 1.0:
                x = x.float() / spec.temperature
            # The max in the logits' own dtype is exact; a row all -inf on this rank gets a finite max,
            # which keeps x - max at -inf (exp 0), never NaN.
            row_max = x.amax(dim=-1).float().clamp_(min=lowest)
            if spec.logprobs:
                picked = x.gather(-1, column[rows, cols].unsqueeze(-1)).squeeze(-1).float()
                target_logit[rows, cols] = picked.masked_fill_(~inside[rows, cols], 0.0)
            shifted = x - row_max.unsqueeze(-1)  # bf16 - float32: upcast and subtract in one pass
            del x
            if spec.entropy:
                shifted.clamp_(min=lowest)  # -inf logits: p = 0 and p * logit = 0, not 0 * inf
                exp = shifted.exp()
                weighted[rows, cols] = torch.linalg.vecdot(exp, shifted)
            else:
                exp = shifted.exp_()
            local_sum[rows, cols] = exp.sum(dim=-1)
            local_max[rows, cols] = row_max
            del shifted, exp

        global_max = local_max
        if spec.group is not None:
            global_max = local_max.clone()
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=spec.group)
        # Rescale each rank's sums from its own max to the global one (factor <= 1), then add them up.
        scale = (local_max - global_max).exp()
        sums = [local_sum * scale]
        if spec.entropy:  # sum p_i * (x_i - max), relative to the global max
            sums.append(scale * (weighted + local_sum * (local_max - global_max)))
        if spec.logprobs:
            sums.append(target_logit)
        sums = torch.stack(sums)
        if spec.group is not None:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=spec.group)
        log_sum = sums[0].log()
        logsumexp = global_max + log_sum
        empty = logsumexp.new_empty(0)
        logprob = torch.where(valid, sums[-1] - logsumexp, 0.0) if spec.logprobs else empty
        entropy = log_sum - sums[1] / sums[0] if spec.entropy else empty

        ctx.spec = spec
        ctx.save_for_backward(local, column, inside, valid, logsumexp, entropy)
        ctx.set_materialize_grads(False)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        local, column, inside, valid, logsumexp, entropy = ctx.saved_tensors
        spec: _Spec = ctx.spec
        batch, tokens, _ = local.shape
        grad = torch.empty(local.shape, dtype=local.dtype, device=local.device)
        # d log p_y / d x_j = delta_jy - p_j;  d H / d x_j = -p_j (log p_j + H);  x = logits / T.
        # One output per call (the other is empty), so exactly one of the two gradients is given.
        if spec.logprobs:
            neg_coef = -(grad_logprob * valid / spec.temperature).float()
            minus_one = -inside.float().unsqueeze(-1)
        else:
            neg_coef = -(grad_entropy / spec.temperature).float()
        for rows, cols in _blocks(batch, tokens, spec.chunk_tokens):
            x = local[rows, cols]
            if spec.temperature != 1.0:
                x = x.float() / spec.temperature
            log_p = x - logsumexp[rows, cols].unsqueeze(-1)  # upcast and subtract in one pass
            del x
            if spec.logprobs:  # -coef * (p - one_hot(target))
                out = log_p.exp_().scatter_add_(
                    -1, column[rows, cols].unsqueeze(-1), minus_one[rows, cols].to(log_p.dtype)
                )
            else:  # -coef * p * (log p + H)
                out = log_p.exp().mul_(log_p.add_(entropy[rows, cols].unsqueeze(-1)))
            torch.mul(out, neg_coef[rows, cols].unsqueeze(-1), out=grad[rows, cols])  # scale and cast in one pass
            del log_p, out
        return grad, None, None, None


# --- the public functions ---------------------------------------------------------------------------


def _local_vocab(logits: torch.Tensor) -> tuple[torch.Tensor, int, Any]:
    """(local logits, first vocabulary id of this rank, process group) of vocabulary-sharded or plain logits."""
    if not isinstance(logits, DTensor):
        return logits, 0, None
    vocab_dim = logits.ndim - 1
    sharded = [i for i, p in enumerate(logits.placements) if isinstance(p, Shard) and p.dim % logits.ndim == vocab_dim]
    others = [p for i, p in enumerate(logits.placements) if i not in sharded and not p.is_replicate()]
    if len(sharded) != 1 or others:
        raise ValueError(f"expected logits sharded on the vocabulary only, got placements {logits.placements}")
    mesh_dim = sharded[0]
    mesh = logits.device_mesh
    # From this rank's mesh coordinate, in plain ints: torch's compute_local_shape_and_global_offset
    # reads its offsets back from a tensor, which a FakeTensorMode trace cannot do.
    _, offset = Shard.local_shard_size_and_offset(logits.shape[-1], mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim))
    return logits.to_local(), offset, mesh.get_group(mesh_dim)


def _as_3d(local: torch.Tensor) -> torch.Tensor:
    """``[B, S, V]`` without a copy where the strides allow (``logits[:, :-1]`` stays a view)."""
    if local.ndim >= 3:
        return local.reshape(-1, *local.shape[-2:])
    return local.reshape((1,) * (3 - local.ndim) + tuple(local.shape))


def _vocab_stats(
    logits: torch.Tensor,
    targets: torch.Tensor | None,
    temperature: float,
    ignore_index: int,
    chunk_size: int | None,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probs, entropy, valid), each shaped like the logits without their last dimension."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, not {temperature!r}")
    local, vocab_start, group = _local_vocab(logits)
    leading = tuple(local.shape[:-1])
    local3 = _as_3d(local)
    if chunk_size is None:
        chunk_size = max(1, CHUNK_BYTES // (4 * max(1, local3.shape[-1])))
    elif chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
    if targets is None:
        target = torch.zeros(local3.shape[:2], dtype=torch.long, device=local.device)
        valid = torch.zeros(local3.shape[:2], dtype=torch.bool, device=local.device)
    else:
        if isinstance(targets, DTensor):
            targets = targets.full_tensor()
        if targets.numel() != local3.shape[0] * local3.shape[1]:
            raise ValueError(f"targets of shape {tuple(targets.shape)} for logits of shape {tuple(logits.shape)}")
        leading = tuple(targets.shape)  # as F.cross_entropy on flattened logits: only the count must match
        target = targets.to(local.device).reshape(local3.shape[:2])
        valid = target != ignore_index
        target = target.masked_fill(~valid, 0)
    spec = _Spec(vocab_start, group, float(temperature), chunk_size, targets is not None, entropy)
    logprob, ent = _VocabParallelStats.apply(local3, target, valid, spec)
    shape = lambda t: t.reshape(leading) if t.numel() else t  # noqa: E731
    return shape(logprob), shape(ent), valid.reshape(leading)


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[..., targets]`` per token, float32, shaped like ``targets``.

    ``logits``: ``[..., V]``, a DTensor sharded on its last dimension over one mesh dimension (others
    replicated), or a plain tensor (unsharded). ``targets``: ``[...]`` ids in ``[0, V)``; a target equal
    to ``ignore_index`` gives 0 and no gradient. ``chunk_size``: tokens per chunk (default: a chunk of
    :data:`CHUNK_BYTES` float32 bytes).
    """
    return _vocab_stats(logits, targets, temperature, ignore_index, chunk_size, entropy=False)[0]


def vocab_parallel_entropy(
    logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per token, float32, shaped like ``logits[..., 0]``.

    Same logits as :func:`vocab_parallel_logprobs`; mask positions afterwards (their gradient is then 0).
    """
    return _vocab_stats(logits, None, temperature, -100, chunk_size, entropy=True)[1]


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.cross_entropy(logits.view(-1, V), target.view(-1))`` for logits sharded on the vocabulary.

    ``logits``: ``[..., V]``, a DTensor whose last dimension is sharded over one mesh dimension, or a
    plain tensor (unsharded: the same chunked computation). ``target``: ``[...]`` token ids. The result
    is float32 (``reduction="none"``: shaped like ``target``, 0 at ignored positions; ``"mean"`` over the
    targets not ignored, 0 when all are).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    logprob, _, valid = _vocab_stats(logits, target, 1.0, ignore_index, None, entropy=False)
    losses = -logprob
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / valid.sum().clamp(min=1)

"""Benchmark 6: peak memory and time of the loss on vocabulary-parallel logits, forward + backward.

bf16 logits of 8192 tokens over Qwen3's vocabulary (151,936) at TP 2, as one rank holds them
(``[1, 8192, 75,968]``, a DTensor ``Shard(-1)``; one process plays rank 0 on a fake process group,
so the collectives cost nothing: they move 8192 and 2 x 8192 floats, a few microseconds on gloo).
Three losses, the mean next-token cross-entropy, side by side:

1. naive: the full vocabulary gathered (emulated by concatenating copies of the local shard: the
   same bf16 ``[tokens, V]`` tensor an all-gather makes), upcast, ``log_softmax``, the target picked;
2. today's: plangen's cross-entropy before the chunked one (copied below: float32 upcast, softmax
   saved for the backward);
3. chunked: :func:`plangen.loss.vocab_parallel_cross_entropy` (logits read in chunks of tokens,
   recomputed in the backward).

Memory is counted by a ``TorchDispatchMode`` that adds up the bytes of every tensor an op
allocates while it is alive (a tensor freed gives its bytes back): the peak of the loss's own
tensors, its gradient for the logits included, the logits themselves (held before and after)
excluded. The same count runs first on fake tensors (``FakeTensorMode``: the same ops, no memory),
which predicts each variant's peak; a variant then runs for real only where the machine has that
much memory free (the naive one needs ~14 GiB), else its row says so. Time: forward + backward, the
same runs, variants interleaved, best of ``REPEATS`` (a shared machine); the naive loss runs once.

Goals: the chunked loss's peak is at most 1/4 of today's, its time at most 1.2x today's, and its
loss equals today's.
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from common import Goal, Section, format_gib, format_ratio

VOCAB, TOKENS, TP = 151_936, 8192, 2
REPEATS = 3
MEMORY_GOAL, TIME_GOAL, LOSS_TOLERANCE = 0.25, 1.2, 1e-5
SAFETY = 3 * 2**30  # left free for the rest of the machine when deciding to run a variant for real
VARIANTS = {
    "naive": "naive: gather the vocabulary, log_softmax",
    "today": "today's cross-entropy",
    "chunked": "chunked cross-entropy (plangen.loss)",
}


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors allocated under it and still alive; the largest float32 one."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest_float32 = 0
        self._tracked: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # a DTensor: it runs, and its local ops come back here
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._tracked:
                continue  # a view or an in-place result: nothing new
            nbytes = storage.nbytes()
            self._tracked.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)
            if t.dtype == torch.float32:
                self.largest_float32 = max(self.largest_float32, nbytes)
        return out


class _PreviousCrossEntropy(torch.autograd.Function):
    """plangen's vocab-parallel cross-entropy before the chunked one (commit a6d5712), unchanged."""

    @staticmethod
    def forward(ctx, local_logits, target, vocab_start, group):
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
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None


def _loss(variant: str, logits, targets: torch.Tensor) -> torch.Tensor:
    from plangen.loss import vocab_parallel_cross_entropy

    local = logits.to_local()
    if variant == "naive":
        full = torch.cat([local] * TP, dim=-1)  # what an all-gather of the vocabulary allocates
        log_p = F.log_softmax(full.float(), dim=-1)
        return -log_p.gather(-1, targets.unsqueeze(-1)).mean()
    if variant == "today":
        group = logits.device_mesh.get_group(0)
        return _PreviousCrossEntropy.apply(local.reshape(-1, local.shape[-1]), targets.reshape(-1), 0, group).mean()
    return vocab_parallel_cross_entropy(logits, targets)


def _inputs(tokens: int, fake: bool, mesh):
    """Rank 0's bf16 logits (a leaf, and the DTensor over it) and the targets."""
    from torch.distributed.tensor import Shard

    generator = None if fake else torch.Generator().manual_seed(0)
    local = torch.randn(1, tokens, VOCAB // TP, generator=generator).mul_(3).to(torch.bfloat16).requires_grad_()
    # Targets in rank 0's columns: the fake all-reduces return each rank's own values, which then are
    # the whole sums, so today's and the chunked loss are the true loss of this shard's vocabulary.
    targets = torch.randint(0, VOCAB // TP, (1, tokens), generator=generator)
    logits = DTensor.from_local(local, mesh, (Shard(-1),), run_check=False)
    return local, logits, targets


def _mesh():
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(TP))


def measure(variant: str, tokens: int, fake: bool, inputs=None) -> tuple[int, int, float, float]:
    """(peak bytes, largest float32 tensor's bytes, loss, seconds) of one forward + backward under LiveBytes
    (its cost, a few microseconds per op, is well under 1 % of these ops')."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mesh = _mesh()  # outside the fake mode: a mesh reads its ranks
    mode = FakeTensorMode() if fake else None
    if mode:
        mode.__enter__()
    try:
        local, logits, targets = inputs or _inputs(tokens, fake, mesh)
        local.grad = None
        with LiveBytes() as counter:
            start = time.perf_counter()
            loss = _loss(variant, logits, targets)
            loss.backward()
            seconds = time.perf_counter() - start
            value = float("nan") if fake else loss.item()
            del loss
        local.grad = None
        return counter.peak, counter.largest_float32, value, seconds
    finally:
        if mode:
            mode.__exit__(None, None, None)


def available_bytes() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_loss_benchmark(quick: bool = False) -> Section:
    """``quick``: the memory of each variant on fake tensors only (exact bytes, no time)."""
    from plangen.distributed.fake_group import fake_process_group

    with fake_process_group(TP):
        return _run(quick)


def _run(quick: bool) -> Section:
    input_bytes = TOKENS * (VOCAB // TP) * 2
    section = Section(
        f"8. Loss on vocabulary-parallel logits, forward + backward: bf16, {TOKENS} tokens, vocabulary {VOCAB:,}, "
        f"TP {TP} (one rank's {format_gib(input_bytes)} of logits)",
        [
            "loss",
            "peak memory",
            "vs today's",
            "largest float32 tensor",
            "time, best (runs)",
            "vs today's",
            "loss value",
        ],
    )
    predicted = {v: measure(v, TOKENS, fake=True) for v in VARIANTS}
    runs: dict[str, list[tuple[int, int, float, float]]] = {}
    skipped: dict[str, str] = {}
    if not quick:
        inputs = _inputs(TOKENS, False, _mesh())
        for repeat in range(REPEATS):  # interleaved: load drift hits every variant alike
            for variant in VARIANTS:
                if variant in skipped or (variant == "naive" and repeat):
                    continue  # the naive loss runs once: it only sets the scale
                need = predicted[variant][0] + SAFETY
                if available_bytes() < need:
                    skipped[variant] = (
                        f"not run: needs {format_gib(need)} free, {format_gib(available_bytes())} available"
                    )
                    continue
                runs.setdefault(variant, []).append(measure(variant, TOKENS, False, inputs))
        del inputs
    measured = {v: r[0] for v, r in runs.items()}
    for variant, first in measured.items():
        if first[:2] != predicted[variant][:2]:
            section.notes.append(f"{variant}: the fake-tensor count predicted {format_gib(predicted[variant][0])}")
    best = {v: min(r[3] for r in rs) for v, rs in runs.items()}
    peak = {v: (measured.get(v) or predicted[v])[0] for v in VARIANTS}
    for variant, label in VARIANTS.items():
        peak_bytes, largest, value, _ = measured.get(variant) or predicted[variant]
        timed = variant in best
        section.rows.append(
            [
                label,
                format_gib(peak_bytes) + ("" if variant in measured else " (fake tensors)"),
                format_ratio(peak_bytes / peak["today"]),
                format_gib(largest),
                f"{best[variant]:.2f} s ({len(runs[variant])})" if timed else skipped.get(variant, "not run (--quick)"),
                format_ratio(best[variant] / best["today"]) if timed and "today" in best else "-",
                f"{value:.6f}" if variant in measured and variant != "naive" else "-",
            ]
        )
    ratio = peak["chunked"] / peak["today"]
    section.goals.append(
        Goal(
            f"the chunked loss's peak is at most {MEMORY_GOAL:g} of today's", ratio <= MEMORY_GOAL, format_ratio(ratio)
        )
    )
    if "chunked" in best and "today" in best:
        slower = best["chunked"] / best["today"]
        section.goals.append(
            Goal(f"the chunked loss takes at most {TIME_GOAL}x today's time", slower <= TIME_GOAL, format_ratio(slower))
        )
        gap = abs(measured["chunked"][2] - measured["today"][2])
        section.goals.append(Goal("the chunked loss equals today's", gap <= LOSS_TOLERANCE, f"gap {gap:.2e}"))
    section.notes.append(
        "peak: the loss's own tensors, the logits' bf16 gradient included, the logits excluded; one process plays "
        f"rank 0 (fake process group: the two all-reduces of {TOKENS} and 2 x {TOKENS} floats are not timed); the "
        "naive loss's value is over its emulated vocabulary (two copies of the shard), so it is not shown"
    )
    return section

"""vocab_parallel_cross_entropy equals F.cross_entropy, value and gradient.

On a one-rank mesh every collective is the identity, so the DTensor path (offsets, masking of
targets outside the shard, the hand-written backward) is compared exactly with torch's own loss;
the multi-rank path is covered by the parity tests, whose loss goes through it at TP=2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from plangen.loss import vocab_parallel_cross_entropy


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch_cross_entropy_with_ignored_targets(fake_pg, reduction):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(0, 11, (2, 5))
    target[0, :2] = -100
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=-100, reduction=reduction)
    (expected.sum()).backward()
    expected_grad = logits.grad.clone()

    logits.grad = None
    mesh = DeviceMesh("cpu", torch.arange(1))
    sharded = DTensor.from_local(logits, mesh, (Shard(-1),), run_check=False)
    got = vocab_parallel_cross_entropy(sharded, target, reduction=reduction)
    got.sum().backward()
    assert torch.allclose(got.reshape(expected.shape), expected, atol=1e-6)
    assert torch.allclose(logits.grad, expected_grad, atol=1e-6)


def test_logits_not_sharded_on_the_vocabulary_are_refused(fake_pg):
    mesh = DeviceMesh("cpu", torch.arange(1))
    logits = DTensor.from_local(torch.randn(2, 3, 7), mesh, (Shard(1),), run_check=False)
    with pytest.raises(ValueError, match="expected logits sharded on the vocabulary only"):
        vocab_parallel_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long))
    replicated = DTensor.from_local(torch.randn(2, 3, 7), mesh, (Replicate(),), run_check=False)
    with pytest.raises(ValueError, match="vocabulary"):
        vocab_parallel_cross_entropy(replicated, torch.zeros(2, 3, dtype=torch.long))


# --------------------------------------------------------------------------------------------
# Log-probs, entropy and cross-entropy against the unsharded float64 computation
# --------------------------------------------------------------------------------------------
#
# Tolerances. The functions compute in float32 whatever the logits' dtype (bf16 logits are exact
# in float32), so the values meet float32 bounds for both dtypes. The logits' gradient is returned
# in the logits' dtype: for bf16 that adds one rounding, at most 2**-8 of its value (bf16 keeps 8
# significant bits), on top of float32's error.
VALUE_TOL = {"atol": 4e-6, "rtol": 1e-6}
GRAD_TOL = {torch.float32: {"atol": 4e-6, "rtol": 1e-5}, torch.bfloat16: {"atol": 4e-6, "rtol": 2**-8}}
KINDS = ("logprobs", "entropy", "cross_entropy-none", "cross_entropy-mean", "cross_entropy-sum")
IGNORE = -100


def excess(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> float:
    """Largest |got - ref| in units of the allowed error (<= 1 passes)."""
    return float(((got.detach().double() - ref).abs() / (atol + rtol * ref.abs())).max())


def reference(kind: str, logits64: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The unsharded float64 computation: log_softmax over the whole vocabulary."""
    log_p = F.log_softmax(logits64 / temperature, dim=-1)
    if kind == "entropy":
        return -(log_p.exp() * log_p).sum(-1)
    valid = targets != IGNORE
    logprob = log_p.gather(-1, targets.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1) * valid
    if kind == "logprobs":
        return logprob
    losses = -logprob
    reduction = kind.split("-")[1]
    return {"none": losses, "sum": losses.sum(), "mean": losses.sum() / valid.sum()}[reduction]


def ours(kind: str, logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int | None):
    from plangen.loss import vocab_parallel_entropy, vocab_parallel_logprobs

    if kind == "logprobs":
        return vocab_parallel_logprobs(logits, targets, temperature, ignore_index=IGNORE, chunk_size=chunk_size)
    if kind == "entropy":
        return vocab_parallel_entropy(logits, temperature, chunk_size=chunk_size)
    return vocab_parallel_cross_entropy(logits, targets, ignore_index=IGNORE, reduction=kind.split("-")[1])


def make_case(vocab: int, dtype: torch.dtype, seed: int = 0):
    """Logits [2, 7, V] (the loss reads the view [:, :-1], as next-token losses do), targets with ignored
    positions, and the weights of each output in the scalar that is differentiated."""
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(2, 7, vocab, generator=generator)).to(dtype)
    targets = torch.randint(0, vocab, (2, 6), generator=generator)
    targets[0, :2] = IGNORE
    targets[1, 5] = IGNORE
    weights = torch.randn(2, 6, generator=generator)
    return logits, targets, weights


def check_against_float64(kind, logits, targets, weights, temperature, chunk_size, shard=None, gather=None):
    """One call against float64: {"value", "grad"} (excess, <= 1 passes), "ignored_zero" (the gradient
    rows of ignored targets and of the position the loss does not read are 0), "forward" and
    "backward" (collectives: {name: count}) and "sizes" (bytes of each collective).

    ``shard(leaf)``: the logits as the function takes them (a DTensor for TP); ``gather(grad)``: the
    leaf's gradient made whole."""
    from plangen.cost.measure import PayloadCounter  # CommDebugMode's counts, and c10d collectives' bytes

    leaf = logits.clone().requires_grad_()
    sharded = shard(leaf) if shard else leaf
    with PayloadCounter() as forward:
        got = ours(kind, sharded[:, :-1], targets, temperature, chunk_size)
    with PayloadCounter() as backward:
        (got * weights if got.ndim else got).sum().backward()
    grad = gather(leaf.grad) if gather else leaf.grad

    ref_leaf = logits.double().requires_grad_()
    ref = reference(kind, ref_leaf[:, :-1], targets, temperature)
    (ref * weights.double() if ref.ndim else ref).sum().backward()
    ignored_zero = bool((grad[:, -1] == 0).all())
    if kind != "entropy":
        ignored_zero = ignored_zero and bool((grad[:, :-1][targets == IGNORE] == 0).all())
    return {
        "value": excess(got, ref.detach(), **VALUE_TOL),
        "grad": excess(grad, ref_leaf.grad, **GRAD_TOL[logits.dtype]),
        "ignored_zero": ignored_zero,
        "forward": forward.counts(),
        "backward": backward.counts(),
        "sizes": [size for _, size in forward.records + backward.records],
    }


def assert_exact(result: dict) -> None:
    assert result["value"] <= 1 and result["grad"] <= 1 and result["ignored_zero"], result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunk_size", [None, 4, 1], ids=["one-chunk", "chunks-of-4", "chunks-of-1"])
@pytest.mark.parametrize("kind", KINDS)
def test_unsharded_logits_match_float64(kind, chunk_size, dtype, monkeypatch):
    import plangen.loss

    logits, targets, weights = make_case(11, dtype)
    if chunk_size is not None:  # the cross-entropy's chunks are set by CHUNK_BYTES alone
        monkeypatch.setattr(plangen.loss, "CHUNK_BYTES", 4 * 11 * chunk_size)
    for temperature in (1.0, 0.7) if kind in ("logprobs", "entropy") else (1.0,):
        result = check_against_float64(kind, logits, targets, weights, temperature, chunk_size)
        assert_exact(result)
        assert result["forward"] == {} and result["backward"] == {}  # TP 1: nothing to communicate


@pytest.mark.distributed
def test_vocab_sharded_over_two_gloo_ranks_matches_float64_with_two_all_reduces():
    """TP 2 on gloo: every function, fp32 and bf16, even and uneven vocabularies (12: 6 + 6, 11: 6 + 5),
    one chunk and chunks of 2 tokens, a 1-D mesh and the TP dimension of a 2-D one. Communication is
    today's cross-entropy's, whatever the chunks: two all-reduces of at most two values per token in
    the forward (max; then the sums and the target logit, stacked), none in the backward."""
    from plangen.distributed.launch import run_distributed

    results = run_distributed(f"{__file__}:gloo_tp2_worker", 2, timeout=240)
    tokens = 2 * 6
    for rank, per_case in enumerate(results):
        assert len(per_case) == 2 * 2 * len(KINDS) * 2 + len(KINDS), sorted(per_case)
        for case, result in per_case.items():
            assert_exact(result)
            assert result["forward"] == {"allreduce_": 2} and result["backward"] == {}, (rank, case, result)
            assert result["sizes"] == [tokens * 4, 2 * tokens * 4], (rank, case, result)


def gloo_tp2_worker(payload) -> dict[str, dict]:
    """One rank of TP 2: the results of check_against_float64 keyed 'kind/dtype/V/chunk/mesh'."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import plangen.loss

    rank = dist.get_rank()
    meshes = {"1d": init_device_mesh("cpu", (2,)), "2d": init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))}
    placements = {"1d": (Shard(-1),), "2d": (Replicate(), Shard(-1))}

    def shard_on(mesh_name):
        def shard(leaf):  # this rank's columns, as Shard(-1) splits them (torch.chunk), gradient flowing to leaf
            piece = leaf.chunk(2, dim=-1)[rank]
            return DTensor.from_local(
                piece, meshes[mesh_name], placements[mesh_name], run_check=False, shape=leaf.shape, stride=leaf.stride()
            )

        return shard

    def gather(grad):  # each rank's leaf gradient is zero outside its columns
        whole = grad.float()
        dist.all_reduce(whole)
        return whole.to(grad.dtype)

    default_chunk = plangen.loss.CHUNK_BYTES
    cases = [
        (k, d, v, c, "1d") for k in KINDS for d in (torch.float32, torch.bfloat16) for v in (12, 11) for c in (None, 2)
    ]
    cases += [(k, torch.float32, 11, 2, "2d") for k in KINDS]
    out = {}
    for kind, dtype, vocab, chunk, mesh_name in cases:
        logits, targets, weights = make_case(vocab, dtype, seed=vocab)
        plangen.loss.CHUNK_BYTES = default_chunk if chunk is None else 4 * 6 * chunk  # V/tp <= 6
        temperature = 0.7 if kind in ("logprobs", "entropy") else 1.0
        key = f"{kind}/{str(dtype).split('.')[1]}/V{vocab}/{chunk or 'one'}-chunk/{mesh_name}"
        out[key] = check_against_float64(
            kind, logits, targets, weights, temperature, chunk, shard_on(mesh_name), gather
        )
    plangen.loss.CHUNK_BYTES = default_chunk
    return out


# --------------------------------------------------------------------------------------------
# Memory: no float32 [tokens, V/tp] tensor larger than one chunk, forward or backward
# --------------------------------------------------------------------------------------------


class NewTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Records (dtype, numel) of every tensor an op allocates (not views or in-place results of its inputs)."""

    def __init__(self):
        super().__init__()
        self.allocated: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # a DTensor: let it run, then see its local ops
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.allocated.append((t.dtype, t.numel()))
        return out


@pytest.mark.parametrize("sharded", [False, True], ids=["tp1", "tp2"])
@pytest.mark.parametrize("kind", ["logprobs", "entropy", "cross_entropy-mean"])
def test_no_float32_tensor_larger_than_one_chunk_is_allocated_or_saved(fake_pg, monkeypatch, kind, sharded):
    import plangen.loss

    tokens, vocab, chunk = 4 * 64, 1000, 16
    width = vocab // 2 if sharded else vocab  # rank 0's shard at TP 2 (fake process group)
    mesh = DeviceMesh("cpu", torch.arange(2)) if sharded else None
    largest = {}
    for chunk_size in (chunk, tokens):  # chunks of 16 tokens; then one chunk of all: the recorder sees it
        monkeypatch.setattr(plangen.loss, "CHUNK_BYTES", 4 * width * chunk_size)
        local = torch.randn(4, 64, width).to(torch.bfloat16).requires_grad_()
        logits = DTensor.from_local(local, mesh, (Shard(-1),), run_check=False) if sharded else local
        targets = torch.randint(0, vocab, (4, 64))
        saved = []

        def pack(t):
            saved.append((t.dtype, t.numel()))
            return t

        with NewTensors() as recorder, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = ours(kind, logits, targets, 1.0, chunk_size)
            out.sum().backward()
        float32 = [n for dtype, n in recorder.allocated if dtype == torch.float32]
        largest[chunk_size] = max(float32)
        # Saved for backward: the logits themselves (bf16) and per-token float32 values, nothing wider.
        assert max(n for dtype, n in saved if dtype == torch.float32) <= tokens
        assert (torch.bfloat16, tokens * width) in saved
        if chunk_size == chunk:  # the logits' gradient is the one full-size tensor made, in their dtype
            assert [(d, n) for d, n in recorder.allocated if n >= tokens * width] == [(torch.bfloat16, tokens * width)]
        assert local.grad is not None and local.grad.dtype == torch.bfloat16
    assert largest == {chunk: chunk * width, tokens: tokens * width}


def test_traces_under_fake_tensor_mode_without_reading_values(fake_pg):
    """Shard offsets come from the mesh coordinate, never from tensor values: the whole loss, forward and
    backward, runs on fake tensors (what tracing it for memory or compilation needs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from plangen.loss import vocab_parallel_entropy, vocab_parallel_logprobs

    mesh = DeviceMesh("cpu", torch.arange(2))
    with FakeTensorMode():
        local = torch.randn(2, 8, 16, requires_grad=True)
        logits = DTensor.from_local(local, mesh, (Shard(-1),), run_check=False)
        targets = torch.randint(0, 32, (2, 8))
        outs = [
            vocab_parallel_logprobs(logits, targets, 0.5, chunk_size=3),
            vocab_parallel_entropy(logits, chunk_size=3),
            vocab_parallel_cross_entropy(logits, targets),
        ]
        sum(out.sum() for out in outs).backward()
        assert [tuple(out.shape) for out in outs] == [(2, 8), (2, 8), ()] and local.grad.shape == (2, 8, 16)


def test_arguments_are_checked():
    from plangen.loss import vocab_parallel_entropy, vocab_parallel_logprobs

    logits, targets = torch.randn(2, 3, 7), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must be positive"):
        vocab_parallel_logprobs(logits, targets, 0.0)
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        vocab_parallel_entropy(logits, chunk_size=0)
    with pytest.raises(ValueError, match=r"targets of shape \(2, 4\)"):
        vocab_parallel_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction must be"):
        vocab_parallel_cross_entropy(logits, targets, reduction="max")
    # As F.cross_entropy on flattened logits: only the number of targets must match.
    assert vocab_parallel_cross_entropy(logits.view(6, 7), targets, reduction="none").shape == (2, 3)

"""get_grad_norm against a float64 reference, called as NeMo RL's unit test calls it (single process,
``dp_cp_group=None, tp_group=None``, ``dtype=torch.float32``), and clip_grad_by_total_norm_ against torch.

The gradients span 1e-2..1e2 over 65 536 elements: a float32 sum of that many terms drifts past 1e-6
relative on CPU (1-norm of fp32 gradients, 2-norm of bf16 gradients), which is what this guards.
"""

from __future__ import annotations

import math

import pytest
import torch

from plangen.runtime.grad_norm import clip_grad_by_total_norm_, get_grad_norm

N = 65_536
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _params_with_grads(grad_dtype: torch.dtype, device: str, seed: int = 0):
    """Two parameters whose gradients together are ±logspace(1e-2, 1e2), and that whole vector."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.logspace(-2, 2, steps=N, dtype=grad_dtype)
    signs = (torch.rand(N, generator=generator) > 0.5).to(grad_dtype) * 2 - 1
    full = (values * signs).to(device)
    first = torch.zeros(N // 2, device=device, dtype=grad_dtype, requires_grad=True)
    second = torch.zeros(N - N // 2, device=device, dtype=grad_dtype, requires_grad=True)
    first.grad = full[: N // 2].clone()
    second.grad = full[N // 2 :].clone()
    return [first, second], full


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [1, 2, math.inf])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_grad_norm_matches_float64_reference(device, norm_type, grad_dtype):
    params, full = _params_with_grads(grad_dtype, device)
    expected = torch.linalg.vector_norm(full.to(torch.float64), ord=norm_type).item()

    norm = get_grad_norm(params, dp_cp_group=None, tp_group=None, norm_type=norm_type, dtype=torch.float32)

    assert type(norm) is float  # NeMo RL returns a Python float
    assert abs(norm - expected) <= 1e-6 * expected, f"relative error {abs(norm - expected) / expected:.3e}"


def test_grad_norm_accepts_a_single_parameter_and_the_inf_string():
    (param, _), full = _params_with_grads(torch.float32, "cpu")
    assert get_grad_norm(param, None, None, norm_type="inf") == full[: N // 2].abs().max().item()


def test_grad_norm_of_no_gradients_is_zero_without_a_process_group():
    param = torch.nn.Parameter(torch.ones(3))
    assert get_grad_norm([param], None, None) == 0.0
    assert get_grad_norm([param], None, None, norm_type=math.inf) == 0.0


@pytest.mark.parametrize("slice_elements", [1 << 22, 100, 1])
def test_grad_norm_handles_non_contiguous_empty_and_scalar_gradients(monkeypatch, slice_elements):
    import plangen.runtime.grad_norm as grad_norm

    # Small slices exercise the sliced float64 upcast (a slice smaller than one row still takes a row).
    monkeypatch.setattr(grad_norm, "_UPCAST_ELEMENTS", slice_elements)
    empty = torch.nn.Parameter(torch.zeros(0, 4))
    empty.grad = torch.zeros(0, 4)
    matrix = torch.nn.Parameter(torch.zeros(64, 48))
    matrix.grad = torch.randn(48, 64, generator=torch.Generator().manual_seed(1)).t()  # not contiguous
    scalar = torch.nn.Parameter(torch.zeros(()))
    scalar.grad = torch.tensor(3.0)
    reference = torch.cat([matrix.grad.reshape(-1), scalar.grad.reshape(1)]).double()
    for norm_type in (1, 2, 3, math.inf):
        expected = torch.linalg.vector_norm(reference, ord=norm_type).item()
        assert get_grad_norm([empty, matrix, scalar], None, None, norm_type=norm_type) == pytest.approx(
            expected, rel=1e-12
        )


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_clip_by_total_norm_scales_as_torch_does(grad_dtype):
    params, _ = _params_with_grads(grad_dtype, "cpu")
    reference, _ = _params_with_grads(grad_dtype, "cpu")

    total = get_grad_norm(params, None, None)
    clip_grad_by_total_norm_(params, max_grad_norm=1.0, total_norm=total)
    torch.nn.utils.clip_grads_with_norm_(reference, max_norm=1.0, total_norm=torch.tensor(total), foreach=False)

    for mine, theirs in zip(params, reference):
        assert mine.grad.dtype == grad_dtype
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0)
    assert get_grad_norm(params, None, None) == pytest.approx(1.0, rel=1e-5 if grad_dtype == torch.float32 else 1e-2)


def test_grad_norm_agrees_with_torch_clip_grad_norm_on_fp32():
    params, _ = _params_with_grads(torch.float32, "cpu")
    torch_total = torch.nn.utils.clip_grad_norm_(params, max_norm=math.inf, foreach=False)  # no clipping
    assert get_grad_norm(params, None, None) == pytest.approx(torch_total.item(), rel=1e-6)

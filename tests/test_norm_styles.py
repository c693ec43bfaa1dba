"""ShardedNormParallel: a norm over a whole column-parallel projection, statistics summed over TP;
GatheredNormParallel, its stable-variant twin: the projection's slices gathered, the norm computed whole.

Against the unsharded module over gloo (output, input gradient, weight and bias gradients), its
collectives counted exactly, the formula read from the module's own forward, and the refusals.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from plangen.styles.norms import GatheredNormParallel, NormMath, ShardedNormParallel, resolve_norm_math

STYLES = {"sharded": ShardedNormParallel, "gathered": GatheredNormParallel}


class _OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: the scale is 1 + weight."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())).to(
            x.dtype
        )


class _L2Norm(nn.Module):
    """Not a norm this style knows: scales by the norm, not the root mean square, and has an eps."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x / (x.norm(dim=-1, keepdim=True) + self.eps)


def _norms() -> dict[str, Any]:
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    return {
        "olmo2_rms": lambda: Olmo2RMSNorm(16, eps=1e-6),
        "layer_norm": lambda: nn.LayerNorm(16, eps=1e-5),
        "layer_norm_no_bias": lambda: nn.LayerNorm(16, eps=1e-5, bias=False),
        "offset_rms": lambda: _OffsetRMSNorm(16),
    }


def test_the_formula_is_read_from_the_modules_own_forward():
    norms = _norms()
    assert resolve_norm_math(norms["olmo2_rms"]()) == NormMath("rms", False, 1e-6)
    assert resolve_norm_math(norms["layer_norm"]()) == NormMath("layer", False, 1e-5)
    assert resolve_norm_math(norms["layer_norm_no_bias"]()) == NormMath("layer", False, 1e-5)
    assert resolve_norm_math(norms["offset_rms"]()) == NormMath("rms", True, 1e-6)
    with torch.device("meta"):  # a meta module is probed on a CPU copy, and stays on meta
        meta = norms["olmo2_rms"]()
    assert resolve_norm_math(meta) == NormMath("rms", False, 1e-6) and meta.weight.is_meta
    with pytest.raises(ValueError, match="neither an RMSNorm nor a LayerNorm"):
        resolve_norm_math(_L2Norm(16))
    with pytest.raises(ValueError, match="no 1-D weight"):
        resolve_norm_math(nn.Linear(4, 4))
    wrong_eps = norms["olmo2_rms"]()
    wrong_eps.variance_epsilon = 1e-2  # the eps is read where the forward reads it
    assert resolve_norm_math(wrong_eps).eps == 1e-2


def test_width_must_divide_by_the_tp_size(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    holder = nn.Module()
    holder.m = nn.LayerNorm(6)
    for style in STYLES.values():
        with pytest.raises(ValueError, match="width 6 cannot be split evenly over TP size 4"):
            parallelize_module(holder, DeviceMesh("cpu", torch.arange(4)), {"m": style()})
    holder.m = _L2Norm(8)  # refused as ShardedNormParallel refuses it: not a norm it knows
    with pytest.raises(ValueError, match="neither an RMSNorm nor a LayerNorm"):
        parallelize_module(holder, DeviceMesh("cpu", torch.arange(2)), {"m": GatheredNormParallel()})


def test_gathered_norm_gathers_the_slices_once_and_sums_nothing_forward(fake_pg):
    """Forward: one all-gather of the projection's slices, no sum. Backward: the gather's
    reduce-scatter of the input gradient and the whole weight's gradient summed (W values)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.distributed.comm import CollectiveCounter

    holder = nn.Module()
    holder.m = _norms()["olmo2_rms"]()
    parallelize_module(holder, DeviceMesh("cpu", torch.arange(2)), {"m": GatheredNormParallel()})
    x = torch.randn(3, 5, 8, requires_grad=True)  # this rank's 8 of 16 features
    with CollectiveCounter() as forward:
        out = holder.m(x)
    with CollectiveCounter() as backward:
        out.sum().backward()
    assert out.shape == (3, 5, 8)
    assert [op for op, _ in forward.records] == ["all_gather_into_tensor"]
    assert sorted(op for op, _ in backward.records) == ["all_reduce", "reduce_scatter_tensor"]
    assert ("all_reduce", 16 * 4) in backward.records
    assert not isinstance(holder.m.weight, torch.distributed.tensor.DTensor) and holder.m.weight.grad.shape == (16,)


@pytest.mark.parametrize("name", ["olmo2_rms", "layer_norm"])
def test_one_small_all_reduce_each_way(fake_pg, name):
    """B·S values (RMS: the sum of squares) or 2·B·S (LayerNorm: the sum too), once forward and once backward."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.distributed.comm import CollectiveCounter

    holder = nn.Module()
    holder.m = _norms()[name]()
    parallelize_module(holder, DeviceMesh("cpu", torch.arange(2)), {"m": ShardedNormParallel()})
    x = torch.randn(3, 5, 8, requires_grad=True)  # this rank's 8 of 16 features
    with CollectiveCounter() as forward:
        out = holder.m(x)
    with CollectiveCounter() as backward:
        out.sum().backward()
    values = 3 * 5 * (2 if name == "layer_norm" else 1)
    assert forward.records == [("all_reduce", values * 4)]
    assert backward.records == [("all_reduce", values * 4)]
    assert holder.m.weight.grad.placements[0].is_shard(0) and holder.m.weight.grad.to_local().shape == (8,)


@pytest.mark.distributed
def test_matches_the_unsharded_norm_over_gloo():
    from plangen.distributed.launch import run_distributed

    results = run_distributed(f"{__file__}:gloo_worker", 2, timeout=120)
    for rank, diffs in enumerate(results):
        assert set(diffs) >= {f"{n}/{w}" for n in _norms() for w in ("out", "grad_input", "grad_weight")}
        assert set(diffs) >= {f"gathered/{n}/{w}" for n in _norms() for w in ("out", "out_not_bitwise", "grad_weight")}
        assert set(diffs) >= {
            f"bitnet_{b}/{w}" for b in ("attention", "mlp") for w in ("out", "grad_input", "grad_norm")
        }
        # The test sees the norm's gradient reduction: without it the input and weight gradients are off.
        controls = {case: d for case, d in diffs.items() if case.startswith("control/")}
        assert len(controls) == 2 and min(controls.values()) > 1e-3, controls
        bad = {case: d for case, d in diffs.items() if d > 1e-6 and case not in controls}
        assert not bad, f"rank {rank}: {bad}"


def gloo_worker(payload: Any) -> dict[str, float]:
    """One rank: each norm split over 2 ranks by each style against the whole one; loss sum(out * c).
    The gathered style computes the whole norm as one device does: its output is bitwise the reference's."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    diffs: dict[str, float] = {}
    for (style_name, style), (name, make) in ((st, n) for st in STYLES.items() for n in _norms().items()):
        key = name if style_name == "sharded" else f"{style_name}/{name}"
        torch.manual_seed(0)
        reference = make()
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(torch.randn_like(p))
        holder = nn.Module()
        holder.m = copy.deepcopy(reference)
        parallelize_module(holder, mesh, {"m": style()})
        x = torch.randn(2, 3, 16) * 3 + 1
        c = torch.randn(2, 3, 16)
        x_ref = x.clone().requires_grad_(True)
        out_ref = reference(x_ref)
        (out_ref * c).sum().backward()
        x_local = x.chunk(world, -1)[rank].clone().requires_grad_(True)
        out = holder.m(x_local)
        (out * c.chunk(world, -1)[rank]).sum().backward()
        diffs[f"{key}/out"] = (out - out_ref.chunk(world, -1)[rank]).abs().max().item()
        if style is GatheredNormParallel:
            diffs[f"{key}/out_not_bitwise"] = float(not torch.equal(out, out_ref.chunk(world, -1)[rank]))
        diffs[f"{key}/grad_input"] = (x_local.grad - x_ref.grad.chunk(world, -1)[rank]).abs().max().item()
        for pname, param in reference.named_parameters():
            got = dict(holder.m.named_parameters())[pname].grad
            if style is ShardedNormParallel:
                assert isinstance(got, DTensor) and got.placements == (Shard(0),)
                got = got.full_tensor()
            else:  # whole on every rank, its gradient summed over TP
                assert not isinstance(got, DTensor) and got.shape == param.shape
            diffs[f"{key}/grad_{pname}"] = (got - param.grad).abs().max().item()
        # A DTensor input sharded on the last dim comes back the same way.
        dt = DTensor.from_local(x.chunk(world, -1)[rank], mesh, (Shard(2),), run_check=False)
        diffs[f"{key}/dtensor"] = (holder.m(dt).full_tensor() - reference(x)).abs().max().item()
    return {**diffs, **_bitnet_block_diffs(mesh, rank, world)}


def _bitnet_block_diffs(mesh: Any, rank: int, world: int) -> dict[str, float]:
    """BitNet's norms inside its blocks, as its synthesized plan shards them: attn_sub_norm on all heads'
    output (q/k/v column-parallel, o_proj row-parallel after it), ffn_sub_norm on the intermediate
    (gate/up column-parallel, down_proj after it). Output, input gradient and every parameter gradient
    against the whole block; then once more with the norm's backward all-reduce skipped (``control/``)."""
    import copy

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from transformers import BitNetConfig
    from transformers.models.bitnet import modeling_bitnet as bitnet

    from plangen.styles import norms as norm_styles

    config = BitNetConfig(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=16,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    blocks = {
        "attention": (bitnet.BitNetAttention(config, 0), "attn_sub_norm", ("q_proj", "k_proj", "v_proj"), "o_proj"),
        "mlp": (bitnet.BitNetMLP(config), "ffn_sub_norm", ("gate_proj", "up_proj"), "down_proj"),
    }
    x = torch.randn(2, 5, 32)
    c = torch.randn(2, 5, 32)
    cos_sin = bitnet.BitNetRotaryEmbedding(config)(x, torch.arange(5)[None].expand(2, 5))
    diffs: dict[str, float] = {}
    for name, (reference, norm, colwise, rowwise) in blocks.items():
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
        sharded = copy.deepcopy(reference)
        parallelize_module(
            sharded,
            mesh,
            {
                **{n: ColwiseParallel() for n in colwise},
                norm: norm_styles.ShardedNormParallel(),
                rowwise: RowwiseParallel(),
            },
        )

        def run(block: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            x_in = x.clone().requires_grad_(True)
            out = block(x_in, cos_sin, None)[0] if name == "attention" else block(x_in)
            (out * c).sum().backward()
            return out, x_in.grad

        out_ref, grad_ref = run(reference)
        out, grad = run(sharded)
        diffs[f"bitnet_{name}/out"] = _relative(out, out_ref)
        diffs[f"bitnet_{name}/grad_input"] = _relative(grad, grad_ref)
        got = dict(sharded.named_parameters())
        for pname, param in reference.named_parameters():
            g = got[pname].grad
            g = g.full_tensor() if isinstance(g, DTensor) else g
            key = "grad_norm" if pname == f"{norm}.weight" else f"grad_{pname}"
            diffs[f"bitnet_{name}/{key}"] = _relative(g, param.grad)
        # The control: each rank's statistics' gradient left unsummed.
        backward = norm_styles.SumOverTP.backward
        norm_styles.SumOverTP.backward = staticmethod(lambda ctx, g: (g, None))
        try:
            sharded.zero_grad()
            _, grad = run(sharded)
        finally:
            norm_styles.SumOverTP.backward = backward
        # Off in the input's gradient and the projections' before it (the norm's own weight gradient,
        # y times the output gradient, does not go through the statistics).
        before = [_relative(got[f"{n}.weight"].grad.full_tensor(), getattr(reference, n).weight.grad) for n in colwise]
        diffs[f"control/bitnet_{name}"] = min(_relative(grad, grad_ref), max(before))
    return diffs


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference, relative to the largest expected value (a block's values reach tens)."""
    return ((got - expected).abs().max() / expected.abs().max()).item()

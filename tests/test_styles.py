"""transformers' style strings → torch parallel styles: coverage, layouts, and numerical parity.

Coverage is checked against the installed transformers' own registry, enumerated at test time, so a
style added by a new transformers fails here until it is translated or refused on purpose.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle

from plangen.distributed.comm import merge_c10d_counts
from plangen.stack.torch_compat import COMPUTES_ON_STRIDED_SHARD
from plangen.styles import (
    HF_STYLE_SPECS,
    HF_UNSUPPORTED_STYLES,
    STYLE_CLASSES,
    UnsupportedStyleError,
    build_style,
    known_hf_styles,
    resolve_hf_style,
    translate_parallel_style,
)

# Names that transformers 4.x plans used and 5.x dropped; user plans copied from then still carry them.
LEGACY_4X_STYLES = (
    "colwise_rep",
    "rowwise_rep",
    "local_colwise",
    "local_rowwise",
    "local_packed_rowwise",
    "local",
    "gather",
    "sequence_parallel",
    "replicate",
    "grouped_gemm",
    "ep_router",
)
MLA_CONFIG = types.SimpleNamespace(qk_rope_head_dim=2)


def transformers_style_names() -> list[str]:
    """Every name in the installed transformers' parallel-style registry."""
    import transformers.distributed as distributed

    # Each submodule registers its own styles at import: import them all, not only today's two.
    for info in pkgutil.iter_modules(distributed.__path__):
        try:
            importlib.import_module(f"{distributed.__name__}.{info.name}")
        except ImportError:
            pass
    from plangen.stack.transformers_compat import hf_parallel_utils

    return sorted(hf_parallel_utils().ALL_PARALLEL_STYLES.keys())


# --------------------------------------------------------------------------------------------
# Coverage: every string translated or refused, never skipped
# --------------------------------------------------------------------------------------------


def test_registry_is_enumerated():
    names = transformers_style_names()
    assert {"colwise", "rowwise", "embedding_rowwise", "moe_tp_experts"} <= set(names)


@pytest.mark.parametrize("style", transformers_style_names())
def test_every_transformers_style_is_translated_or_refused(style):
    module_name = "model.layers.*.some_module"
    assert style in HF_STYLE_SPECS or style in HF_UNSUPPORTED_STYLES, f"{style!r} is not in plangen's tables"
    try:
        translated = translate_parallel_style(style, module_name, config=MLA_CONFIG)
    except UnsupportedStyleError as err:
        assert style in HF_UNSUPPORTED_STYLES
        assert err.style == style and err.module_name == module_name
        assert repr(style) in str(err) and module_name in str(err)
    else:
        assert isinstance(translated, ParallelStyle)


@pytest.mark.parametrize("style", LEGACY_4X_STYLES)
def test_legacy_styles_are_known(style):
    assert style in known_hf_styles()


def test_tables_are_disjoint_and_name_registered_styles():
    assert not set(HF_STYLE_SPECS) & set(HF_UNSUPPORTED_STYLES)
    for spec in HF_STYLE_SPECS.values():
        assert spec.style in STYLE_CLASSES


def test_unknown_string_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown transformers parallel style 'colwize'") as info:
        translate_parallel_style("colwize", "model.layers.*.mlp.up_proj")
    assert not isinstance(info.value, UnsupportedStyleError)
    assert "colwise" in str(info.value) and "moe_tp_experts" in str(info.value)
    assert "model.layers.*.mlp.up_proj" in str(info.value)


def test_unknown_style_class_still_raises():
    with pytest.raises(ValueError, match="unknown parallel style 'Nope'; known styles: "):
        build_style("Nope")


def test_mla_needs_the_rope_width_from_the_config():
    with pytest.raises(UnsupportedStyleError, match="qk_rope_head_dim") as info:
        resolve_hf_style("mla_kv_a_proj", "model.layers.*.self_attn.kv_a_proj_with_mqa")
    assert "kv_a_proj_with_mqa" in str(info.value)
    assert resolve_hf_style("mla_kv_a_proj", config=MLA_CONFIG) == ("MlaKvAProjParallel", {"rope_dim": 2})


def test_resolved_kwargs_are_fresh_copies():
    name, kwargs = resolve_hf_style("colwise")
    kwargs["use_local_output"] = False
    assert resolve_hf_style("colwise")[1]["use_local_output"] is True
    assert name == "ColwiseParallel"


# --------------------------------------------------------------------------------------------
# Layouts under a single-process fake process group (TP=2)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_mesh(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", [0, 1])  # two ranks of the session's fake group


def apply_style(module: nn.Module, style: str, mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    holder = nn.Module()
    holder.m = module
    parallelize_module(holder, mesh, {"m": translate_parallel_style(style, "m", config=MLA_CONFIG)})
    return holder.m


def placements(param) -> tuple:
    from torch.distributed.tensor import DTensor

    return tuple(param.placements) if isinstance(param, DTensor) else ()


def local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # Arithmetic on the output waits on its async collective, which a shape check never would.
    return module(x) * 1


def collectives(fn: Callable[[], Any]) -> dict[str, int]:
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        result = fn()
        if isinstance(result, torch.Tensor):
            result.sum()  # waits on an async collective, which a discarded output never would
    return {str(op).split(".")[-1]: count for op, count in comm.get_comm_counts().items()}


def test_colwise_layouts(tp_mesh):
    from torch.distributed.tensor import Shard

    m = apply_style(nn.Linear(8, 6), "colwise", tp_mesh)
    assert placements(m.weight) == (Shard(0),) and local(m.weight).shape == (3, 8)
    assert placements(m.bias) == (Shard(0),) and local(m.bias).shape == (3,)
    out = m(torch.randn(2, 5, 8))
    assert type(out) is torch.Tensor and out.shape == (2, 5, 3)


@pytest.mark.parametrize("style", ["colwise_gather_output", "colwise_rep"])
def test_colwise_gathered_layouts(tp_mesh, style):
    m = apply_style(nn.Linear(8, 6), style, tp_mesh)
    assert local(m.weight).shape == (3, 8)
    x = torch.randn(2, 5, 8)
    assert forward(m, x).shape == (2, 5, 6)
    assert collectives(lambda: m(x)) == {"all_gather_into_tensor": 1}


def test_rowwise_layouts(tp_mesh):
    from torch.distributed.tensor import Replicate, Shard

    m = apply_style(nn.Linear(8, 6), "rowwise", tp_mesh)
    assert placements(m.weight) == (Shard(1),) and local(m.weight).shape == (6, 4)
    assert placements(m.bias) == (Replicate(),) and local(m.bias).shape == (6,)
    x = torch.randn(2, 5, 4)
    assert forward(m, x).shape == (2, 5, 6)
    assert collectives(lambda: m(x)) == {"all_reduce": 1}


@pytest.mark.parametrize("style", ["rowwise_split_input", "rowwise_rep"])
def test_rowwise_split_input_layouts(tp_mesh, style):
    m = apply_style(nn.Linear(8, 6), style, tp_mesh)
    x = torch.randn(2, 5, 8)  # replicated: each rank takes its half, no communication for that
    assert forward(m, x).shape == (2, 5, 6)
    assert collectives(lambda: m(x)) == {"all_reduce": 1}


def test_embedding_rowwise_layouts(tp_mesh):
    from torch.distributed.tensor import Shard

    m = apply_style(nn.Embedding(16, 8), "embedding_rowwise", tp_mesh)
    assert placements(m.weight) == (Shard(0),) and local(m.weight).shape == (8, 8)
    ids = torch.randint(0, 16, (2, 5))
    assert forward(m, ids).shape == (2, 5, 8)
    assert collectives(lambda: m(ids)) == {"all_reduce": 1}


def test_embedding_colwise_layouts(tp_mesh):
    from torch.distributed.tensor import Shard

    m = apply_style(nn.Embedding(16, 8), "embedding_colwise", tp_mesh)
    assert placements(m.weight) == (Shard(1),) and local(m.weight).shape == (16, 4)
    ids = torch.randint(0, 16, (2, 5))
    assert forward(m, ids).shape == (2, 5, 8)
    assert collectives(lambda: m(ids)) == {"all_gather_into_tensor": 1}


PACKED_NEEDS = pytest.mark.skipif(
    not COMPUTES_ON_STRIDED_SHARD, reason="torch < 2.13 cannot compute on a packed layout: the styles refuse there"
)


@pytest.mark.skipif(COMPUTES_ON_STRIDED_SHARD, reason="the installed torch computes on packed layouts")
@pytest.mark.parametrize("style", ["packed_colwise", "packed_rowwise"])
def test_packed_styles_refuse_where_torch_cannot_compute_on_their_layout(tp_mesh, style):
    with pytest.raises(ValueError, match="cannot compute on a packed") as info:
        apply_style(nn.Linear(8, 12), style, tp_mesh)
    assert "FusedColwiseParallel" in str(info.value) and "\n" not in str(info.value)


@PACKED_NEEDS
def test_packed_colwise_shards_each_part(tp_mesh):
    from torch.distributed.tensor.placement_types import _StridedShard

    full = nn.Linear(8, 12)
    weight, bias = full.weight.detach().clone(), full.bias.detach().clone()
    m = apply_style(full, "packed_colwise", tp_mesh)
    assert placements(m.weight) == (_StridedShard(0, split_factor=2),)
    # rank 0 of 2 holds the first half of the gate rows and the first half of the up rows
    assert torch.equal(local(m.weight), torch.cat([weight[0:3], weight[6:9]]))
    assert torch.equal(local(m.bias), torch.cat([bias[0:3], bias[6:9]]))
    x = torch.randn(2, 5, 8)
    out = m(x)
    assert type(out) is torch.Tensor and out.shape == (2, 5, 6)
    gate, up = (x @ weight.T + bias).chunk(2, dim=-1)
    torch.testing.assert_close(out, torch.cat([gate[..., :3], up[..., :3]], dim=-1))
    assert collectives(lambda: m(x)) == {}


@PACKED_NEEDS
def test_packed_colwise_refuses_parts_that_do_not_split(tp_mesh):
    with pytest.raises(ValueError, match="must each split evenly"):
        apply_style(nn.Linear(8, 6), "packed_colwise", tp_mesh)


@PACKED_NEEDS
def test_packed_rowwise_layouts(tp_mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.placement_types import _StridedShard

    full = nn.Linear(8, 6)
    weight = full.weight.detach().clone()
    m = apply_style(full, "packed_rowwise", tp_mesh)
    assert placements(m.weight) == (_StridedShard(1, split_factor=2),)
    assert torch.equal(local(m.weight), torch.cat([weight[:, 0:2], weight[:, 4:6]], dim=1))
    assert placements(m.bias) == (Replicate(),)
    x = torch.randn(2, 5, 4)  # this rank's [a_0; b_0]
    assert forward(m, x).shape == (2, 5, 6)
    assert collectives(lambda: m(x)) == {"all_reduce": 1}


def test_sequence_parallel_layouts(tp_mesh):
    from torch.distributed.tensor import Replicate

    m = apply_style(nn.LayerNorm(8), "sequence_parallel", tp_mesh)
    assert placements(m.weight) == (Replicate(),)
    out = m(torch.randn(2, 3, 8))  # this rank's half of a 6-token sequence
    assert type(out) is torch.Tensor and out.shape == (2, 3, 8)


def test_replicated_with_grad_allreduce_keeps_plain_params(tp_mesh):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    m = apply_style(Qwen3RMSNorm(4), "replicated_with_grad_allreduce", tp_mesh)
    x = torch.randn(2, 3, 1, 4, requires_grad=True)  # [batch, seq, local heads, head_dim]
    out = m(x)
    assert type(out) is torch.Tensor and out.shape == x.shape
    assert isinstance(m.weight, nn.Parameter) and placements(m.weight) == ()
    assert collectives(lambda: m(x).sum().backward()) == {"all_reduce": 1}
    assert isinstance(m.weight, nn.Parameter) and m.weight.grad is not None
    with torch.no_grad():
        assert collectives(lambda: m(x)) == {}


def test_all_reduce_layouts(tp_mesh):
    m = apply_style(nn.Linear(4, 6, bias=False), "all_reduce", tp_mesh)
    x = torch.randn(2, 4)
    out = m(x)
    assert type(out) is torch.Tensor and out.shape == (2, 6)
    assert placements(m.weight) == ()
    assert collectives(lambda: m(x)) == {"all_reduce": 1}


def test_mla_kv_a_proj_layouts(tp_mesh):
    m = apply_style(nn.Linear(4, 6), "mla_kv_a_proj", tp_mesh)
    x = torch.randn(2, 4, requires_grad=True)
    assert forward(m, x).shape == (2, 6) and placements(m.weight) == ()
    assert collectives(lambda: m(x)) == {}
    # The rope key's gradient sum is a c10d all-reduce (no DTensor round trip: plangen.styles.experts).
    assert merge_c10d_counts(collectives(lambda: m(x).sum().backward())) == {"all_reduce": 1}


def test_replicate_leaves_the_module_alone(tp_mesh):
    m = apply_style(nn.Embedding(16, 8), "replicate", tp_mesh)
    assert placements(m.weight) == () and local(m.weight).shape == (16, 8)
    assert not m._forward_hooks and not m._forward_pre_hooks


def test_attention_sinks_are_split_with_the_heads_and_their_gradient_is_exact(tp_mesh):
    """gpt-oss attention on rank 0 of TP 2, q/k/v column-parallel, o_proj left out: the block's output
    is this rank's heads of the unsharded block's output (the attention used this rank's sinks), and
    the gradient of the local sinks is exactly the unsharded one's first half, with no communication."""
    import copy

    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from plangen.styles import AttentionSinksParallel
    from tiny_configs import build_tiny

    model = build_tiny("gpt_oss", attn_implementation="eager")
    reference = model.model.layers[0].self_attn
    reference.o_proj = nn.Identity()  # the concatenated heads
    holder = nn.Module()
    holder.attn = copy.deepcopy(reference)
    styles = {
        "attn": AttentionSinksParallel(),
        **{f"attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
    }
    parallelize_module(holder, tp_mesh, styles)
    sharded = holder.attn
    assert isinstance(sharded.sinks, DTensor) and placements(sharded.sinks) == (Shard(0),)
    assert local(sharded.sinks).shape == (2,) and torch.equal(local(sharded.sinks), reference.sinks[:2])
    x = torch.randn(2, 8, 32)
    cos_sin = model.model.rotary_emb(x, torch.arange(8)[None].expand(2, -1))
    expected, _ = reference(x, cos_sin, None)
    half = expected.shape[-1] // 2
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()

    def step() -> torch.Tensor:
        out, _ = sharded(x, cos_sin, None)
        (out * weights[..., :half]).sum().backward()
        return out

    assert collectives(step) == {}
    out, _ = sharded(x, cos_sin, None)
    assert (out - expected[..., :half]).abs().max() < 1e-6
    assert isinstance(sharded.sinks, DTensor)  # put back after the forward
    assert placements(sharded.sinks.grad) == (Shard(0),)
    assert (local(sharded.sinks.grad) - reference.sinks.grad[:2]).abs().max() < 1e-6


def _synthesizer_pairs_diffllama_heads() -> bool:
    from plangen.model.resolve import build_meta_model, resolve_model
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    resolved = resolve_model("diffllama")
    plan = build_synthesized_plan(build_meta_model(resolved.config, resolved.model_class), False)
    return any(e.style == "PairedHeadsAttentionInput" for e in plan.entries)


def test_paired_heads_attention_holds_whole_pairs_and_sums_its_lambdas_gradient(tp_mesh):
    if not _synthesizer_pairs_diffllama_heads():
        pytest.skip(
            "the installed DiffLlama's attention is not the form PairedHeadsAttentionInput reads (transformers "
            "5.24.0 on): plans keep it whole there (tests/test_synthesize.py)"
        )
    """DiffLlama attention (4 heads, 4 KV heads) on rank 0 of TP 2, q/k/v in two halves, o_proj left
    out: its output is exactly the unsharded block's first two pairs (contiguous, so o_proj is a
    plain row-parallel); the lambdas stay whole, plain tensors, and each gets one all-reduce of its
    gradient (the fake group's all-reduce keeps rank 0's part: the pairs' share of the gradient)."""
    import copy

    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import build_tiny_model
    from plangen.styles import FusedColwiseParallel, PairedHeadsAttentionInput

    model = build_tiny_model(resolve_model("diffllama"), seed=0, attn_implementation="eager")
    reference = model.model.layers[0].self_attn
    reference.o_proj = nn.Identity()  # the pairs' outputs, concatenated
    holder = nn.Module()
    holder.attn = copy.deepcopy(reference)
    columns = dict(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True)
    styles = {
        "attn": PairedHeadsAttentionInput(
            input_kwarg_layouts={"hidden_states": Replicate()},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        ),
        **{f"attn.{p}": FusedColwiseParallel(**columns) for p in ("q_proj", "k_proj", "v_proj")},
    }
    parallelize_module(holder, tp_mesh, styles)
    sharded = holder.attn
    lambdas = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
    x = torch.randn(2, 8, 64, requires_grad=True)
    cos_sin = model.model.rotary_emb(x, torch.arange(8)[None].expand(2, -1))
    expected, _ = reference(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)
    half = expected.shape[-1] // 2
    weights = torch.randn_like(expected)
    weights[..., half:] = 0  # the other rank's pairs: its share of the lambdas' gradient
    (expected * weights).sum().backward()

    def step() -> torch.Tensor:
        out, _ = sharded(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)
        (out * weights[..., :half]).sum().backward()
        return out

    # One gradient reduction of the block's input, one per lambda.
    assert collectives(step) == {"all_reduce": 1 + len(lambdas)}
    for name in lambdas:
        assert type(sharded._parameters[name]) is nn.Parameter  # put back, whole
        getattr(sharded, name).grad = None
    out, _ = sharded(hidden_states=x, position_embeddings=cos_sin, attention_mask=None)
    assert out.shape[-1] == half and (out - expected[..., :half]).abs().max() < 1e-5
    (out * weights[..., :half]).sum().backward()
    for name in lambdas:
        assert (getattr(sharded, name).grad - getattr(reference, name).grad).abs().max() < 1e-5


def test_paired_heads_attention_refuses_halves_the_tp_size_does_not_split(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import build_tiny_model
    from plangen.styles import PairedHeadsAttentionInput

    model = build_tiny_model(resolve_model("diffllama"), seed=0, tp_size=1)  # 2 heads: one pair
    holder = nn.Module()
    holder.attn = model.model.layers[0].self_attn
    with pytest.raises(ValueError, match="2 attention heads need a multiple of 2 x TP size 2"):
        parallelize_module(holder, tp_mesh, {"attn": PairedHeadsAttentionInput()})
    holder.attn = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no config with head counts to pair"):
        parallelize_module(holder, tp_mesh, {"attn": PairedHeadsAttentionInput()})


def test_gated_delta_net_is_split_by_heads_and_its_gradients_are_exact(tp_mesh):
    """Qwen3.5's gated delta net on rank 0 of TP 2, out_proj left out: the mixer's output is this
    rank's value heads of the unsharded one's (its key head, its conv channels, its A_log/dt_bias);
    the local gradients of A_log, dt_bias and the conv are exactly the unsharded ones' rows for this
    rank, and the only collective is the gated norm's weight gradient (shared by the heads)."""
    import copy

    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from plangen.styles import AllReduceParamGrads, FusedColwiseParallel, GatedDeltaNetParallel
    from tiny_configs import build_tiny

    reference = build_tiny("qwen3_5-linear").model.layers[0].linear_attn
    reference.out_proj = nn.Identity()  # the heads' outputs, concatenated
    holder = nn.Module()
    holder.mixer = copy.deepcopy(reference)
    attributes = ("num_k_heads", "num_v_heads", "key_dim", "value_dim", "conv_dim")
    columns = dict(input_layouts=Replicate(), use_local_output=True)
    styles = {
        "mixer": GatedDeltaNetParallel(
            head_attributes=attributes, head_parameters=("A_log", "dt_bias"), conv_parts=(1, 1, 2)
        ),
        "mixer.in_proj_qkv": FusedColwiseParallel(part_sizes=(1, 1, 2), **columns),
        **{f"mixer.{p}": ColwiseParallel(**columns) for p in ("in_proj_z", "in_proj_a", "in_proj_b")},
        "mixer.norm": AllReduceParamGrads(),
    }
    parallelize_module(holder, tp_mesh, styles)
    sharded = holder.mixer
    assert (sharded.num_k_heads, sharded.num_v_heads, sharded.key_dim, sharded.value_dim) == (1, 2, 8, 16)
    assert placements(sharded.conv1d.weight) == (Shard(0),) and local(sharded.conv1d.weight).shape == (32, 1, 4)
    rows = torch.cat([torch.arange(0, 8), torch.arange(16, 24), torch.arange(32, 48)])  # rank 0's q, k, v channels
    assert torch.equal(local(sharded.conv1d.weight), reference.conv1d.weight[rows])
    x = torch.randn(2, 8, 32)
    expected = reference(x)
    half = expected.shape[-1] // 2
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()

    def step() -> torch.Tensor:
        out = sharded(x)
        (out * weights[..., :half]).sum().backward()
        return out

    assert collectives(step) == {"all_reduce": 1}
    out = sharded(x)
    assert (out - expected[..., :half]).abs().max() < 1e-5
    assert isinstance(sharded.A_log, DTensor) and isinstance(sharded.conv1d.weight, DTensor)  # put back
    for name in ("A_log", "dt_bias"):
        grad = getattr(sharded, name).grad
        assert placements(grad) == (Shard(0),)
        assert (local(grad) - getattr(reference, name).grad[:2]).abs().max() < 1e-5
    assert (local(sharded.conv1d.weight.grad) - reference.conv1d.weight.grad[rows]).abs().max() < 1e-5


def test_gated_delta_net_refuses_heads_the_tp_size_does_not_divide(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import GatedDeltaNetParallel
    from tiny_configs import build_tiny

    holder = nn.Module()
    holder.mixer = build_tiny("qwen3_5-linear").model.layers[0].linear_attn
    holder.mixer.num_k_heads = 3
    with pytest.raises(ValueError, match="num_k_heads=3 does not divide by the TP size 2"):
        parallelize_module(
            holder, tp_mesh, {"mixer": GatedDeltaNetParallel(head_attributes=("num_k_heads",), conv_parts=(1, 1, 2))}
        )
    holder.mixer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="has 0 depthwise nn.Conv1d children, not one"):
        parallelize_module(holder, tp_mesh, {"mixer": GatedDeltaNetParallel()})


class _Heads(nn.Module):
    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.num_heads, self.width, self.head_dim = heads, heads * 8, 8


class _Drawing(_Heads):
    """Stands for BigBird's block-sparse attention (per-head random draws from one seeded stream)."""


class _Rebuilding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Heads()

    def forward(self, x):
        return self.inner.num_heads, self.inner.width, self.inner.head_dim


def test_rebuilt_child_head_counts_follow_the_child_the_parent_holds_at_each_forward(tp_mesh):
    # BigBird's set_attention_type builds a new attention child with all heads' counts at the model's
    # first forward: counts made local only when the plan was applied would be lost with the old one.
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import RebuiltChildHeadCounts

    holder = nn.Module()
    holder.attn = _Rebuilding()
    style = RebuiltChildHeadCounts(child="inner", attributes=("num_heads", "width"), refused_in_training=("_Drawing",))
    parallelize_module(holder, tp_mesh, {"attn": style})
    assert (holder.attn.inner.num_heads, holder.attn.inner.width) == (2, 16)
    holder.attn.inner = _Heads()  # rebuilt: all heads' counts again
    x = torch.zeros(1)
    assert holder.attn(x) == holder.attn(x) == (2, 16, 8)  # made local once per child, head_dim untouched
    holder.attn.inner = _Drawing()
    holder.attn.eval()
    assert holder.attn(x) == (2, 16, 8)
    holder.attn.train()
    with pytest.raises(ValueError, match="_Drawing draws each head's random key blocks from one seeded stream"):
        holder.attn(x)
    holder.attn = _Rebuilding()
    holder.attn.inner = _Heads(3)
    with pytest.raises(ValueError, match=r"_Heads.num_heads=3 does not divide by the TP size 2"):
        parallelize_module(holder, tp_mesh, {"attn": style})


class _WidthShaped(nn.Module):
    """Reports what its forward is handed (ProphetNet's n-gram attention unpacks its width from its input)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_attn_heads = 4

    def forward(self, hidden_states, attention_mask=None, broadcast_mask=None):
        return hidden_states, attention_mask, broadcast_mask, self.num_attn_heads


def test_prepare_attention_input_output_slices_the_input_width_the_head_counts_and_per_head_masks(tp_mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import PrepareAttentionInputOutput

    holder = nn.Module()
    holder.attn = _WidthShaped()
    style = PrepareAttentionInputOutput(
        input_kwarg_layouts={"hidden_states": Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Shard(-1)},
        use_local_input=True,
        output_layouts=(Replicate(), None, None, None),
        desired_output_layouts=(Replicate(), Replicate(), Replicate(), Replicate()),
        head_attributes=("num_attn_heads",),
        head_inputs=("attention_mask", "broadcast_mask"),
    )
    parallelize_module(holder, tp_mesh, {"attn": style})
    hidden = torch.randn(2, 3, 8)
    mask = torch.arange(4.0).view(1, 4, 1, 1).expand(2, 4, 3, 3)  # one slice per head, for all heads
    broadcast = torch.zeros(2, 1, 3, 3)
    seen, seen_mask, seen_broadcast, heads = holder.attn(
        hidden_states=hidden, attention_mask=mask, broadcast_mask=broadcast
    )
    assert heads == 2 and torch.equal(seen, hidden[..., :4])  # this (fake) rank 0's slice of the width
    assert torch.equal(seen_mask, mask[:, :2]) and seen_broadcast is broadcast  # its heads; a broadcast one whole


class _BatchHeads(nn.Module):
    """Reports what its forward is handed and its head count (Bloom's attention: alibi= by keyword)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads = 4

    def forward(self, hidden_states, residual, alibi=None):
        return alibi, self.num_heads


def test_prepare_attention_input_cuts_the_rows_of_its_heads_from_every_batch_row(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import PrepareAttentionInput

    holder = nn.Module()
    holder.attn = _BatchHeads()
    parallelize_module(
        holder, tp_mesh, {"attn": PrepareAttentionInput(head_attributes=("num_heads",), batch_head_inputs=("alibi",))}
    )
    # Row b x 4 + h holds 10 b + h: three batch rows of four heads, as Bloom's ALiBi stacks them.
    alibi = (10 * torch.arange(3.0)[:, None] + torch.arange(4.0)).reshape(12, 1, 1).expand(12, 1, 5).requires_grad_()
    seen, heads = holder.attn(torch.zeros(3, 5, 8), torch.zeros(3, 5, 8), alibi=alibi)
    assert heads == 2 and seen.shape == (6, 1, 5)
    assert seen[:, 0, 0].tolist() == [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]  # (fake) rank 0: heads 0 and 1 of each row
    seen.sum().backward()  # a slice: each of its rows' gradient reaches the whole bias's row, the others none
    assert alibi.grad[:, 0, 0].tolist() == [1.0, 1.0, 0.0, 0.0] * 3
    with pytest.raises(ValueError, match="alibi has 10 rows, not a batch of 4 heads each"):
        holder.attn(torch.zeros(3, 5, 8), torch.zeros(3, 5, 8), alibi=torch.zeros(10, 1, 5))
    holder.attn = _BatchHeads()
    with pytest.raises(ValueError, match="batch_head_inputs need the block's head count"):
        parallelize_module(holder, tp_mesh, {"attn": PrepareAttentionInput(batch_head_inputs=("alibi",))})


def test_attention_sinks_refuse_heads_the_tp_size_does_not_divide(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import AttentionSinksParallel

    holder = nn.Module()
    holder.attn = nn.Module()
    holder.attn.sinks = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="3 heads, which TP size 2 does not divide"):
        parallelize_module(holder, tp_mesh, {"attn": AttentionSinksParallel()})
    holder.attn = nn.Identity()
    with pytest.raises(ValueError, match="no parameters of its own"):
        parallelize_module(holder, tp_mesh, {"attn": AttentionSinksParallel()})


def test_mamba1_mixer_is_split_by_channels_and_its_attributes_made_local(tp_mesh):
    """Mamba1MixerParallel at TP 2 (rank 0): every per-channel tensor holds half the channels, in_proj
    this rank's halves of x and of the gate (Hugging Face's shape in its state dict), x_proj its
    input half; the channel counts the forward and conv1d read are this rank's; parameters put back
    after a forward."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import Mamba1MixerParallel

    mixer = _mamba_mixer()
    reference = {k: v.clone() for k, v in mixer.state_dict().items()}
    width, half = mixer.intermediate_size, mixer.intermediate_size // 2
    holder = nn.Module()
    holder.m = mixer
    parallelize_module(holder, tp_mesh, {"m": Mamba1MixerParallel()})
    expected = {
        "in_proj.weight": (
            Shard(0),
            torch.cat([reference["in_proj.weight"][:half], reference["in_proj.weight"][width : width + half]]),
        ),
        "conv1d.weight": (Shard(0), reference["conv1d.weight"][:half]),
        "conv1d.bias": (Shard(0), reference["conv1d.bias"][:half]),
        "x_proj.weight": (Shard(1), reference["x_proj.weight"][:, :half]),
        "dt_proj.weight": (Shard(0), reference["dt_proj.weight"][:half]),
        "dt_proj.bias": (Shard(0), reference["dt_proj.bias"][:half]),
        "A_log": (Shard(0), reference["A_log"][:half]),
        "D": (Shard(0), reference["D"][:half]),
    }
    params = dict(mixer.named_parameters())
    for name, (placement, rows) in expected.items():
        assert placements(params[name]) == (placement,), name
        assert torch.equal(local(params[name]), rows), name
    assert not isinstance(params["out_proj.weight"], DTensor)  # its own RowwiseParallel entry
    assert (mixer.intermediate_size, mixer.conv1d.groups, mixer.conv1d.in_channels) == (half, half, half)
    # Hugging Face's whole shape (its values at DP 2 x TP 2: tests/test_synthesized_distributed.py).
    assert mixer.state_dict()["in_proj.weight"].shape == reference["in_proj.weight"].shape
    mixer.out_proj.weight.data = mixer.out_proj.weight.data[:, :half].clone()  # as its row-parallel style leaves it
    mixer(torch.randn(2, 5, 32))
    assert all(isinstance(dict(mixer.named_parameters())[n], DTensor) for n in expected)


def test_mamba1_mixer_never_takes_the_fused_kernel_that_would_skip_its_sums(tp_mesh, monkeypatch):
    """mamba_ssm's mamba_inner_fn (installed on GPU machines) runs x_proj and out_proj inside one
    kernel in training: the split mixer takes the unfused path instead, and stays in training mode."""
    import transformers.models.mamba.modeling_mamba as modeling
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    from plangen.styles import Mamba1MixerParallel

    calls = []
    monkeypatch.setattr(modeling, "mamba_inner_fn", lambda *a, **k: calls.append(1) or a[0])
    holder = nn.Module()
    holder.m = _mamba_mixer().train()
    parallelize_module(holder, tp_mesh, {"m": Mamba1MixerParallel(), "m.out_proj": RowwiseParallel()})
    out = holder.m(torch.randn(2, 5, 32))
    assert calls == [] and out.shape == (2, 5, 32) and holder.m.training


def test_mamba1_mixer_style_refuses_what_it_cannot_split(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import Mamba1MixerParallel

    holder = nn.Module()
    holder.m = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="Mamba1MixerParallel: Linear: no nn.Linear/nn.Conv1d in_proj"):
        parallelize_module(holder, tp_mesh, {"m": Mamba1MixerParallel()})
    holder.m = _mamba_mixer()
    with pytest.raises(ValueError, match="has no child dt_layernorm"):
        parallelize_module(holder, tp_mesh, {"m": Mamba1MixerParallel(grad_reduced=("dt_layernorm",))})


def test_rg_lru_is_split_by_its_heads_and_its_outputs_and_gradients_are_exact(tp_mesh):
    """RGLRUParallel at TP 2 (rank 0): the block-diagonal gates and their biases keep heads 0-1,
    recurrent_param their 16 channels; on those channels the output and every parameter's gradient
    are the unsharded RG-LRU's, with no communication; the carried state is this rank's channels."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.recurrent import RG_LRU_PARAMETERS
    from plangen.styles import RGLRUParallel

    reference, holder = _rg_lru(), nn.Module()
    holder.m = _rg_lru()
    parallelize_module(holder, tp_mesh, {"m": RGLRUParallel()})
    sharded = holder.m
    assert sharded.num_attention_heads == 2 and sharded.block_width == 8
    for name in RG_LRU_PARAMETERS:
        param = getattr(sharded, name)
        assert placements(param) == (Shard(0),), name
        assert torch.equal(local(param), getattr(reference, name)[: param.shape[0] // 2]), name
    x, positions = torch.randn(2, 6, 32), torch.arange(6).expand(2, 6)
    expected = reference(x, positions)
    weights = torch.randn_like(expected[..., :16])
    (expected[..., :16] * weights).sum().backward()

    def step() -> torch.Tensor:
        out = sharded(x[..., :16], positions)
        (out * weights).sum().backward()
        return out

    assert collectives(step) == {}
    assert (sharded(x[..., :16], positions) - expected[..., :16]).abs().max() < 1e-5
    assert sharded.recurrent_states.shape == (2, 16)
    for name in RG_LRU_PARAMETERS:
        param = getattr(sharded, name)
        assert isinstance(param, DTensor) and placements(param.grad) == (Shard(0),), name  # put back
        rows = param.shape[0] // 2
        assert (local(param.grad) - getattr(reference, name).grad[:rows]).abs().max() < 1e-5, name


def test_multi_head_norm_keeps_this_ranks_heads_and_is_exact_on_them(tp_mesh):
    """MultiHeadNormParallel at TP 2 (rank 0): weight and bias keep heads 0-1's 16 features, the head
    and feature counts are this rank's; on those heads output and gradients are the unsharded norm's,
    with no communication. Three heads do not split over TP 2: refused before anything is sharded."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import MultiHeadNormParallel

    reference, holder = _multi_head_norm(), nn.Module()
    holder.m = _multi_head_norm()
    parallelize_module(holder, tp_mesh, {"m": MultiHeadNormParallel()})
    sharded = holder.m
    assert (sharded.num_heads, sharded.num_features, sharded.head_dim) == (2, 16, 8)
    x = torch.randn(2, 5, 4, 8)
    expected = reference(x)
    weights = torch.randn(2, 5, 16)
    (expected[..., :16] * weights).sum().backward()

    def step() -> torch.Tensor:
        out = sharded(x[:, :, :2])
        (out * weights).sum().backward()
        return out

    assert collectives(step) == {}
    assert (sharded(x[:, :, :2]) - expected[..., :16]).abs().max() < 1e-5
    for name in ("weight", "bias"):
        param = getattr(sharded, name)
        assert placements(param) == (Shard(0),) and placements(param.grad) == (Shard(0),), name
        assert torch.equal(local(param), getattr(reference, name)[:16]), name
        assert (local(param.grad) - getattr(reference, name).grad[:16]).abs().max() < 1e-5, name
    holder.m = _multi_head_norm()
    holder.m.num_heads = 3
    with pytest.raises(ValueError, match=r"num_heads=3 does not divide by the TP size 2"):
        parallelize_module(holder, tp_mesh, {"m": MultiHeadNormParallel()})
    assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in holder.m.parameters())


def test_rg_lru_style_refuses_what_it_cannot_split(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import RGLRUParallel

    holder = nn.Module()
    holder.m = nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"RGLRUParallel: Linear has parameters \['bias', 'weight'\], not an RG-LRU's"):
        parallelize_module(holder, tp_mesh, {"m": RGLRUParallel()})
    holder.m = _rg_lru()
    holder.m.num_attention_heads = 3
    with pytest.raises(ValueError, match=r"has input_gate_weight \(4, 8, 8\), not \(3, 8, 8\)"):
        parallelize_module(holder, tp_mesh, {"m": RGLRUParallel()})
    holder.m = _rg_lru()
    with pytest.raises(ValueError, match="has no integer attribute heads"):
        parallelize_module(holder, tp_mesh, {"m": RGLRUParallel(head_attribute="heads")})


# --------------------------------------------------------------------------------------------
# Numerical parity at TP=2 on gloo: plangen's style vs transformers' own layer vs the unsharded module
# --------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_styles_match_transformers_and_unsharded_at_tp2():
    from plangen.distributed.launch import run_distributed

    results = run_distributed(f"{__file__}:gloo_parity_worker", 2, timeout=120)
    for rank, diffs in enumerate(results):
        bad = {case: d for case, d in diffs.items() if d > 1e-5}
        assert not bad, f"rank {rank}: {bad}"
    # Every translated style was exercised against the unsharded module (the packed ones where torch
    # computes on their layout), and against transformers' own layers where the test can build them.
    exercised = set(HF_STYLE_SPECS) - (set() if COMPUTES_ON_STRIDED_SHARD else {"packed_colwise", "packed_rowwise"})
    assert {case.split("/")[0] for case in results[0]} >= exercised
    assert any("/transformers/" in case for case in results[0]) == bool(hf_apply_tensor_parallelism())


def hf_apply_tensor_parallelism() -> Callable | None:
    """transformers' own ``apply_tensor_parallelism(model, mesh, plan)``, where the installed release
    has it with that form (5.24.0): the worker compares plangen's styles with transformers' layers.
    5.5.x-5.8.x hook modules one by one (``distribute_model``), 5.25.0 reads a mesh manager from the
    model: there the styles are compared with the unsharded module only."""
    try:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    except ImportError:
        return None
    return None if "_mesh_manager" in inspect.getsource(apply_tensor_parallelism) else apply_tensor_parallelism


def gloo_parity_worker(payload: Any) -> dict[str, float]:
    """One rank: every translated style on a tiny module, max abs differences keyed 'style/what/against'."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    apply_tensor_parallelism = hf_apply_tensor_parallelism()
    impls = ("plangen", "transformers") if apply_tensor_parallelism else ("plangen",)

    from plangen.styles import EmbeddingRowReadParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    diffs: dict[str, float] = {}

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    def chunk(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.chunk(world, dim=dim)[rank]

    def packed_chunk(t: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.cat([chunk(part, dim) for part in t.chunk(2, dim=dim)], dim=dim)

    def sharded(style: str, module: nn.Module, impl: str) -> nn.Module:
        holder = nn.Module()
        holder.m = module
        holder.config = types.SimpleNamespace(qk_rope_head_dim=MLA_CONFIG.qk_rope_head_dim)
        holder.config.get_text_config = lambda: holder.config
        if impl == "plangen":
            parallelize_module(holder, mesh, {"m": translate_parallel_style(style, "m", config=MLA_CONFIG)})
        else:  # transformers' own layer, given its expanded plan: parameters first, then the module
            plan = {f"m.{name}": style for name, _ in module.named_parameters(recurse=False)}
            apply_tensor_parallelism(holder, mesh, {**plan, "m": style})
        return holder.m

    def make_copy(reference: nn.Module) -> nn.Module:
        clone = copy.deepcopy(reference)
        clone.zero_grad(set_to_none=True)
        return clone

    def compare(
        case: str,
        make: Callable[[], nn.Module],
        x: torch.Tensor,
        *,
        local_in: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
        local_out: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
        against_hf: bool = True,
    ) -> None:
        """Global loss sum(out * c); each rank feeds local_in(x) and weighs its output with local_out(c)."""
        style = case.split("/")[0]
        torch.manual_seed(1)
        reference = make()
        float_input = x.is_floating_point()
        x_ref = x.clone().requires_grad_(float_input)
        out_ref = reference(x_ref)
        c = torch.randn_like(out_ref)
        (out_ref * c).sum().backward()
        for impl in impls if against_hf else ("plangen",):
            module = sharded(style, make_copy(reference), impl)
            x_local = local_in(x.clone()).requires_grad_(float_input)
            out = module(x_local)
            (out * local_out(c)).sum().backward()
            key = f"{case}/{impl}"
            diffs[f"{key}/out"] = (out - local_out(out_ref)).abs().max().item()
            for name, param in reference.named_parameters():
                got = full(dict(module.named_parameters())[name].grad)
                diffs[f"{key}/grad_{name}"] = (got - param.grad).abs().max().item()
            if float_input:
                diffs[f"{key}/grad_input"] = (x_local.grad - local_in(x_ref.grad)).abs().max().item()

    torch.manual_seed(0)
    x8 = torch.randn(2, 3, 8)
    ids = torch.randint(0, 16, (2, 3))
    last = lambda t: chunk(t, -1)  # noqa: E731
    for style in ("colwise",):
        compare(style, lambda: nn.Linear(8, 6), x8, local_out=last)
    for style in ("colwise_gather_output", "colwise_rep"):
        compare(style, lambda: nn.Linear(8, 6), x8)
    compare("rowwise", lambda: nn.Linear(8, 6), x8, local_in=last)
    # 5.25.0's whole-head styles (no transformers layer to compare on the pinned release; its own
    # needs a config's head_dim): at a TP size dividing the heads, colwise and rowwise.
    compare("unit_colwise", lambda: nn.Linear(8, 6), x8, local_out=last, against_hf=False)
    compare("unit_rowwise", lambda: nn.Linear(8, 6), x8, local_in=last, against_hf=False)
    for style in ("rowwise_split_input", "rowwise_rep"):
        compare(style, lambda: nn.Linear(8, 6), x8)
    for style in ("embedding_rowwise", "embedding_colwise"):
        compare(style, lambda: nn.Embedding(16, 8), ids)
    packed_out = lambda t: packed_chunk(t, -1)  # noqa: E731
    # transformers shards a packed bias as a plain Shard(0) (gate on one rank, up on the other):
    # compared with transformers without a bias, with the unsharded module with one.
    if COMPUTES_ON_STRIDED_SHARD:  # else the packed styles refuse (test_packed_styles_refuse_...)
        compare("packed_colwise/nobias", lambda: nn.Linear(8, 12, bias=False), x8, local_out=packed_out)
        compare("packed_colwise/bias", lambda: nn.Linear(8, 12), x8, local_out=packed_out, against_hf=False)
        # transformers' packed_rowwise shards parameters only and installs no forward.
        compare("packed_rowwise", lambda: nn.Linear(8, 6), x8, local_in=packed_out, against_hf=False)
    seq = lambda t: chunk(t, 1)  # noqa: E731
    compare("sequence_parallel", lambda: nn.LayerNorm(8), torch.randn(2, 4, 8), local_in=seq, local_out=seq)
    heads = lambda t: chunk(t, 2)  # noqa: E731
    compare(
        "replicated_with_grad_allreduce",
        lambda: Qwen3RMSNorm(4),
        torch.randn(2, 3, 4, 4),
        local_in=heads,
        local_out=heads,
    )
    compare("replicate", lambda: nn.Linear(8, 6), x8)

    # all_reduce: each rank's module output is partial; the sum is every rank's output.
    torch.manual_seed(1)
    reference = nn.Linear(8, 6, bias=False)
    xs = torch.randn(world, 2, 8)
    c = torch.randn(2, 6)
    expected = sum(reference(xs[r]) for r in range(world))
    grads = {}
    for impl in impls:
        module = sharded("all_reduce", make_copy(reference), impl)
        x_local = xs[rank].clone().requires_grad_()
        out = module(x_local)
        (out * c).sum().backward()
        diffs[f"all_reduce/{impl}/out"] = (out - expected).abs().max().item()
        grads[impl] = (module.weight.grad, x_local.grad)
    # identity backward: each rank's grads are its own, the same as transformers'
    if "transformers" in grads:
        diffs["all_reduce/plangen-vs-transformers/grad_weight"] = (
            (grads["plangen"][0] - grads["transformers"][0]).abs().max().item()
        )
        diffs["all_reduce/plangen-vs-transformers/grad_input"] = (
            (grads["plangen"][1] - grads["transformers"][1]).abs().max().item()
        )
    diffs["all_reduce/grad_input_is_local"] = (grads["plangen"][1] - c @ reference.weight).abs().max().item()

    # mla_kv_a_proj: the rope tail's gradient is summed over ranks, the rest is left to kv_b_proj.
    torch.manual_seed(1)
    reference = nn.Linear(8, 6)
    x = torch.randn(2, 8)
    cs = torch.randn(world, 2, 6)  # each rank's attention heads weigh the output differently
    rope = MLA_CONFIG.qk_rope_head_dim
    expected_grad_out = torch.cat([cs[rank][:, :-rope], cs.sum(0)[:, -rope:]], dim=-1)
    for impl in impls:
        module = sharded("mla_kv_a_proj", make_copy(reference), impl)
        x_local = x.clone().requires_grad_()
        out = module(x_local)
        (out * cs[rank]).sum().backward()
        diffs[f"mla_kv_a_proj/{impl}/out"] = (out - reference(x)).abs().max().item()
        diffs[f"mla_kv_a_proj/{impl}/grad_input"] = (
            (x_local.grad - expected_grad_out @ reference.weight).abs().max().item()
        )
    # MlaAttentionParallel on the attention module: the same reduction, the width read from the shapes.
    attention = _LatentAttention(rope=rope, latent=6 - rope)
    attention.kv_a_proj_with_mqa = make_copy(reference)
    parallelize_module(attention, mesh, build_style("MlaAttentionParallel"))
    x_local = x.clone().requires_grad_()
    out = attention(x_local)
    (out * cs[rank]).sum().backward()
    diffs["MlaAttentionParallel/out"] = (out - reference(x)).abs().max().item()
    diffs["MlaAttentionParallel/grad_input"] = (x_local.grad - expected_grad_out @ reference.weight).abs().max().item()

    # EmbeddingRowReadParallel: a model reading rows of its vocab-parallel embedding's weight itself
    # (Gemma 4's pad row) reads them whole, rows held by either rank, with their gradients.
    torch.manual_seed(1)
    reference = _ReadsRows(9)
    ids9 = torch.tensor([[0, 4, 5, 8]])
    c = torch.randn(1, 4, 4)
    (reference(ids9) * c).sum().backward()
    module = make_copy(reference)
    parallelize_module(
        module,
        mesh,
        {
            "embed": build_style("TiedEmbeddingParallel", dict(local_lookup=True)),
            "": EmbeddingRowReadParallel(embedding="embed"),
        },
    )
    out = module(ids9)
    (out * c).sum().backward()
    diffs["EmbeddingRowReadParallel/out"] = (out - reference(ids9)).abs().max().item()
    diffs["EmbeddingRowReadParallel/grad_weight"] = (
        (full(module.embed.weight.grad) - reference.embed.weight.grad).abs().max().item()
    )
    # Under SP the reader mixes the whole row into the sequence-sharded lookup with a torch.where of a
    # plain mask (Gemma 4's placeholder tokens): the mask and the row taken as Replicate, exact both ways.
    from torch.distributed.tensor import Shard

    reference = _WheresRows(9)
    ids9 = torch.tensor([[0, 4, 5, 8], [2, 5, 7, 1]])
    c = torch.randn(2, 4, 4)
    (reference(ids9) * c).sum().backward()
    module = make_copy(reference)
    lookup = dict(local_lookup=True, output_layouts=Shard(1), use_local_output=False)
    parallelize_module(
        module,
        mesh,
        {"embed": build_style("TiedEmbeddingParallel", lookup), "": EmbeddingRowReadParallel(embedding="embed")},
    )
    out = module(ids9)
    diffs["EmbeddingRowReadParallel/sp/placement"] = float(tuple(out.placements) != (Shard(1),))
    (out.full_tensor() * c).sum().backward()
    diffs["EmbeddingRowReadParallel/sp/out"] = (out.full_tensor() - reference(ids9)).abs().max().item()
    diffs["EmbeddingRowReadParallel/sp/grad_weight"] = (
        (full(module.embed.weight.grad) - reference.embed.weight.grad).abs().max().item()
    )
    return diffs


class _WheresRows(nn.Module):
    """Puts row 7 of its embedding's weight (rank 1's at TP 2) where the ids are 5, Gemma 4's way."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        row = self.embed.weight[7, :]
        return torch.where((ids == 5)[..., None], row.view(1, 1, -1), self.embed(ids))


class _ReadsRows(nn.Module):
    """Reads rows 2 and 7 of its embedding's weight in its own forward (rank 0 holds 0-4 of 9 at TP 2)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.embed.weight[2, :] * 2 + self.embed.weight[-2]
        return self.embed(ids) * rows.view(1, 1, -1)


class _LatentAttention(nn.Module):
    """The latent projections of multi-head latent attention; forward returns kv_a_proj_with_mqa's output."""

    def __init__(self, *, rope: int, latent: int, qk_rope_head_dim: int | None = None) -> None:
        super().__init__()
        self.kv_a_proj_with_mqa = nn.Linear(8, latent + rope)
        self.kv_b_proj = nn.Linear(latent, 8)
        self.weight = nn.Parameter(torch.zeros(8, 8))  # what the style-facts tests read
        if qk_rope_head_dim is not None:
            self.qk_rope_head_dim = qk_rope_head_dim

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.kv_a_proj_with_mqa(hidden_states)


def test_mla_attention_reads_the_rope_width_from_the_module(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    for rope, latent in ((2, 4), (3, 5)):  # two model sizes, one plan entry
        m = _LatentAttention(rope=rope, latent=latent, qk_rope_head_dim=rope)
        holder = nn.Module()
        holder.attn = m
        parallelize_module(holder, tp_mesh, {"attn": build_style("MlaAttentionParallel")})
        (hook,) = m.kv_a_proj_with_mqa._forward_hooks.values()
        assert hook.args[0] == rope
        x = torch.randn(2, 8, requires_grad=True)
        assert holder.attn(x).shape == (2, latent + rope) and placements(m.kv_a_proj_with_mqa.weight) == ()
        assert collectives(lambda: holder.attn(x)) == {}
        assert merge_c10d_counts(collectives(lambda: holder.attn(x).sum().backward())) == {"all_reduce": 1}
    with pytest.raises(ValueError, match="no rope key of width 5"):
        parallelize_module(
            _LatentAttention(rope=2, latent=4, qk_rope_head_dim=5), tp_mesh, build_style("MlaAttentionParallel")
        )
    with pytest.raises(ValueError, match="multi-head latent attention module"):
        parallelize_module(nn.Linear(4, 4), tp_mesh, build_style("MlaAttentionParallel"))


class _QueryLatentAttention(_LatentAttention):
    """With a query down-projection; forward returns both latents' outputs."""

    def __init__(self) -> None:
        super().__init__(rope=2, latent=4)
        self.q_a_proj = nn.Linear(8, 6)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_a_proj(hidden_states), self.kv_a_proj_with_mqa(hidden_states)


def test_mla_attention_with_a_sharded_query_latent_reduces_the_input_gradient_once(tp_mesh):
    """q_a_proj column-parallel: its input gradient is left partial, kv_a_proj_with_mqa's (whole)
    counted once, and the block input's reduced once, by its gather's backward under SP: a
    reduce-scatter beside the rope key's all-reduce, where q_a_proj reducing its own adds an
    all-reduce (and the gather's backward keeps a slice). Refused where q_a_proj is not sharded, or
    there is none."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    def step(sharded_query_latent: bool) -> dict[str, int]:
        style = dict(
            input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),), sharded_query_latent=sharded_query_latent
        )
        m = parallelize_module(_QueryLatentAttention(), tp_mesh, build_style("MlaAttentionParallel", style))
        parallelize_module(m.q_a_proj, tp_mesh, ColwiseParallel(output_layouts=Shard(-1)))
        x = torch.randn(2, 8, requires_grad=True)  # this rank's rows of 4
        query, kv = m(x)
        assert query.shape == (4, 3) and kv.shape == (4, 6)  # every row, this rank's slice of the query latent
        return merge_c10d_counts(collectives(lambda: sum(t.sum() for t in m(x)).backward()))

    # Forward and backward: the input gathered, then its gradient reduced.
    assert step(True) == {"all_gather_into_tensor": 1, "all_reduce": 1, "reduce_scatter_tensor": 1}
    assert step(False) == {"all_gather_into_tensor": 1, "all_reduce": 2}
    style = dict(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), sharded_query_latent=True)
    whole = parallelize_module(_QueryLatentAttention(), tp_mesh, build_style("MlaAttentionParallel", style))
    with pytest.raises(ValueError, match="q_a_proj is not sharded; give it ColwiseParallel"):
        whole(torch.randn(2, 8))
    with pytest.raises(ValueError, match="has no nn.Linear q_a_proj"):
        parallelize_module(_LatentAttention(rope=2, latent=4), tp_mesh, build_style("MlaAttentionParallel", style))
    with pytest.raises(ValueError, match="read the block input whole and local"):
        build_style("MlaAttentionParallel", dict(style, use_local_output=False))


# --------------------------------------------------------------------------------------------
# Style facts (plangen.plan.style_facts): the torch-free table agrees with the real styles
# --------------------------------------------------------------------------------------------

# Arguments a style cannot be built without.
_REQUIRED_KWARGS: dict[str, dict[str, Any]] = {
    "PrepareModuleOutput": {"output_layouts": "Replicate()", "desired_output_layouts": "Replicate()"},
    "PrepareModuleInputOutput": {"output_layouts": "Replicate()", "desired_output_layouts": "Replicate()"},
    "MlaKvAProjParallel": {"rope_dim": 2},
    "EveryTokenMoeParallel": {"output_layouts": "Replicate()", "desired_output_layouts": "Replicate()"},
    "GatedDeltaNetParallel": {"head_parameters": ("weight",), "head_attributes": ("num_v_heads",)},
    "EmbeddingRowReadParallel": {"embedding": "embed"},
    "SharedInputGather": {"readers": ("child",)},
    "MoeBlockParallel": {"router": "child", "output_layouts": "Replicate()", "desired_output_layouts": "Replicate()"},
    "PrepareAttentionInputOutput": {"output_layouts": "Replicate()", "desired_output_layouts": "Replicate()"},
    "BucketedAttentionInputOutput": {
        "output_layouts": "Replicate()",
        "desired_output_layouts": "Replicate()",
        "head_attributes": ("num_heads",),
        "bucketed": "weight_proj",
        "all_heads_helper": "extra",
    },
}


class _EveryTokenMoe(nn.Module):
    """Llama-4's MoE block layout: packed experts and a router as children; ``weight`` its own (left whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = _PackedExperts()
        self.router = nn.Linear(8, 4, bias=False)
        self.weight = nn.Parameter(torch.zeros(8, 8))


# Styles that apply to one kind of module only, and that module.
class _PairedHeadsBlock(nn.Module):
    """Differential attention's own parameter beside its head counts (4 heads: two pairs per TP 2 rank)."""

    def __init__(self) -> None:
        super().__init__()
        from types import SimpleNamespace

        self.config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=4)
        self.head_dim = 2
        self.weight = nn.Parameter(torch.randn(8, 8))


def _rwkv_mixer(kind: str) -> nn.Module:
    """RWKV-4's time (``RwkvSelfAttention``) or channel (``RwkvFeedForward``) mixing, 32 wide; its
    ``weight`` is its whole time_mix_key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny_configs import TINY

    block = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY["rwkv"])).rwkv.blocks[0]
    mixer = block.attention if kind == "time" else block.feed_forward
    mixer.__class__ = type(type(mixer).__name__, (type(mixer),), {"weight": property(lambda self: self.time_mix_key)})
    return mixer


def _position_bias() -> nn.Module:
    """CpmAnt's relative position bias: a [16 + 4 x 4, 4 heads] table; ``weight`` is the table."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny_configs import TINY

    bias = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**TINY["cpmant"], attn_implementation="eager")
    ).cpmant.position_bias
    bias.__class__ = type(
        "PositionBias", (type(bias),), {"weight": property(lambda self: self.relative_attention_bias)}
    )
    return bias


_MODULE_OF = {
    "RwkvTimeMixParallel": lambda: _rwkv_mixer("time"),
    "RwkvChannelMixParallel": lambda: _rwkv_mixer("channel"),
    "MlaAttentionParallel": lambda: _LatentAttention(rope=2, latent=6),
    "PairedHeadsAttentionInput": _PairedHeadsBlock,
    "EveryTokenMoeParallel": _EveryTokenMoe,
    "RoutedBlockParallel": lambda: _jetmoe_moe(),
    "RoutedBlockSequenceParallel": lambda: _jetmoe_moe(),
    "GatheredNormParallel": lambda: nn.LayerNorm(8),
    "SharedInputGather": lambda: _with_child(nn.Linear(8, 8), "child", nn.Linear(8, 8)),
    "MoeBlockParallel": lambda: _with_child(nn.Linear(8, 8), "child", nn.Linear(8, 8)),
    "EmbeddingRowReadParallel": lambda: _with_child(nn.Linear(8, 8), "embed", nn.Embedding(8, 4)),
    "RebuiltChildHeadCounts": lambda: _with_child(nn.Linear(8, 8), "self", nn.Identity()),  # BigBird's child name
    "BucketedAttentionInputOutput": lambda: _Bucketed(),
}


def _jetmoe_moe():
    """JetMoE's MoE MLP (a bias, a router, experts of one [E, out, in] weight); ``weight`` is the router's."""
    from transformers import AutoConfig
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoE

    from tiny_configs import TINY

    class Block(JetMoeMoE):
        weight = property(lambda self: self.router.layer.weight)

    config = {k: v for k, v in TINY["jetmoe"].items() if k != "model_type"}
    return Block(AutoConfig.for_model("jetmoe", **config))


class _Bucketed(nn.Linear):
    """A block with a head count, a bucketed projection and a helper (ProphetNet's n-gram attention's shape)."""

    def __init__(self) -> None:
        super().__init__(8, 8)
        self.num_heads = 4
        self.weight_proj = nn.Identity()

    def extra(self, x):
        return x


def _with_child(module: nn.Module, name: str, child: nn.Module) -> nn.Module:
    module.add_module(name, child)
    return module


def _built(name: str):
    from plangen.plan.style_facts import placement_from_text
    from plangen.styles import build_style

    kwargs = {
        k: placement_from_text(v) if isinstance(v, str) and v.endswith(")") else v
        for k, v in _REQUIRED_KWARGS.get(name, {}).items()
    }
    return build_style(name, kwargs)


def _weight_text(param) -> str:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(param, DTensor):
        return "plain"
    (placement,) = param.placements
    if isinstance(placement, _StridedShard):
        return f"_StridedShard({placement.dim})"
    if isinstance(placement, Shard):
        return f"Shard({placement.dim})"
    assert isinstance(placement, Replicate), placement
    return "Replicate()"


def test_style_facts_cover_exactly_the_registered_styles_and_say_where_they_live():
    from plangen.plan.style_facts import PLANGEN_STYLES, TORCH_STYLES
    from plangen.plan.style_table import STYLE_FACTS

    assert sorted(STYLE_FACTS) == sorted(STYLE_CLASSES)
    for name, facts in STYLE_FACTS.items():
        assert facts.name == name
        home = TORCH_STYLES if STYLE_CLASSES[name].__module__.startswith("torch.") else PLANGEN_STYLES
        assert facts.module == home, name
        assert not (facts.shards and facts.replicates), name


@pytest.mark.parametrize("name", sorted(STYLE_CLASSES))
def test_style_facts_layout_defaults_are_what_torch_fills_in(name):
    from plangen.plan.style_facts import placement_from_text
    from plangen.plan.style_table import STYLE_FACTS

    style = _built(name)
    for argument, text in STYLE_FACTS[name].layout_defaults.items():
        value = getattr(style, argument)
        assert (value[0] if isinstance(value, tuple) else value) == placement_from_text(text), (name, argument)


class _PackedExperts(nn.Module):
    """transformers 5.x's experts layout: per-expert weights packed on dim 0 (``weight``: gate_up)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_experts = 4
        self.weight = nn.Parameter(torch.zeros(4, 6, 8))  # [experts, 2 x intermediate, hidden]
        self.down_proj = nn.Parameter(torch.zeros(4, 8, 3))


class _DeltaNetBlock(nn.Module):
    """A gated delta net's own layout: [value heads] parameters (named ``weight`` here), a depthwise conv."""

    def __init__(self) -> None:
        super().__init__()
        self.num_v_heads = 4
        self.weight = nn.Parameter(torch.zeros(4))  # [value heads]: A_log, dt_bias
        self.conv1d = nn.Conv1d(6, 6, 3, groups=6, bias=False)  # [q; k; v] channels, 2 each


def _mamba_mixer() -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny_configs import TINY

    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY["mamba"])).backbone.layers[0].mixer


class _HeadsBlock(nn.Module):
    """An attention block's own per-head parameter (gpt-oss's ``sinks``), named ``weight`` here."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4))  # [heads]


def _mamba2_mixer(**overrides):
    """A tiny NemotronH Mamba2 mixer; ``weight`` is its per-head ``A_log`` (what the facts describe)."""
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    from tiny_configs import TINY

    class Mixer(NemotronHMamba2Mixer):
        weight = property(lambda self: self.A_log)

    config = {k: v for k, v in {**TINY["nemotron_h"], **overrides}.items() if k != "model_type"}
    return Mixer(NemotronHConfig(**config), layer_idx=0)


def _rg_lru():
    """A tiny RecurrentGemma RG-LRU (4 heads of 8 channels); ``weight`` is its [heads, block, block] input gate."""
    from transformers import RecurrentGemmaConfig
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    from tiny_configs import TINY

    class Lru(RecurrentGemmaRglru):
        weight = property(lambda self: self.input_gate_weight)

    torch.manual_seed(0)
    lru = Lru(RecurrentGemmaConfig(**{k: v for k, v in TINY["recurrent_gemma"].items() if k != "model_type"}))
    for param in lru.parameters():  # torch.empty in its constructor
        nn.init.normal_(param, std=0.3)
    return lru


def _multi_head_norm():
    """xLSTM's multi-head norm over 4 heads of 8, with a bias, its weight and bias random."""
    from transformers.models.xlstm.modeling_xlstm import xLSTMMultiHeadLayerNorm

    torch.manual_seed(0)
    norm = xLSTMMultiHeadLayerNorm(num_heads=4, head_dim=8, use_bias=True)
    for param in norm.parameters():
        nn.init.normal_(param)
    return norm


def _gated_norm(width: int = 8, group: int = 4):
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHRMSNormGated

    return NemotronHRMSNormGated(width, group_size=group)


def _flat_experts():
    """DBRX's experts (flat [E * ffn, H] weights in ``mlp``); ``weight`` is ``mlp.w1`` (v1 and w2 alike)."""
    from transformers import AutoConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxExperts

    from tiny_configs import TINY

    class Experts(DbrxExperts):
        weight = property(lambda self: self.mlp.w1)

    config = {k: v for k, v in TINY["dbrx"].items() if k != "model_type"}
    return Experts(AutoConfig.for_model("dbrx", **config).ffn_config)


def _shared_experts():
    """Inkling's 2 shared experts (gate/up [2, 16, 32], down [2, 32, 16]); ``weight`` is ``gate_proj``."""
    from transformers import AutoConfig
    from transformers.models.inkling.modeling_inkling import InklingSharedExperts

    from tiny_configs import TINY

    class Shared(InklingSharedExperts):
        weight = property(lambda self: self.gate_proj)

    config = {k: v for k, v in TINY["inkling"].items() if k != "model_type"}
    return Shared(AutoConfig.for_model("inkling_text", **config))


def _short_conv():
    """Inkling's short conv over 16 channels (kernel 4); ``weight`` is its conv's [16, 1, 4]."""
    from transformers.models.inkling.modeling_inkling import InklingShortConvolution

    class Conv(InklingShortConvolution):
        weight = property(lambda self: self.conv1d.weight)

    return Conv(16, 4, layer_idx=0, conv_idx=0)


# Styles for one module type only, with the module kind their facts name.
_OWN_MODULE = {
    "ConvChannelsParallel": _short_conv,
    "FlatExpertsParallel": _flat_experts,
    "SharedExpertsParallel": _shared_experts,
    "Mamba2MixerParallel": _mamba2_mixer,
    "GatedRMSNormParallel": _gated_norm,
    "GatheredGatedRMSNormParallel": _gated_norm,
    "RGLRUParallel": _rg_lru,
    "MultiHeadNormParallel": _multi_head_norm,
    "HeadTableParallel": _position_bias,
}


@pytest.mark.parametrize(
    "name",
    [
        n if COMPUTES_ON_STRIDED_SHARD or not n.startswith("Packed") else pytest.param(n, marks=PACKED_NEEDS)
        for n in sorted(STYLE_CLASSES)
    ],
)
def test_style_facts_weight_layout_is_what_torch_does(name, tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.plan.style_facts import CONV1D, EMBEDDING, EXPERTS, HEADS, LINEAR, MIXER, NORM
    from plangen.plan.style_table import STYLE_FACTS

    facts = STYLE_FACTS[name]
    if name in _OWN_MODULE:
        (kind,) = facts.shard_dim
        kinds = {kind: _OWN_MODULE[name]}
    elif EXPERTS in facts.shard_dim:  # a style for packed experts only
        kinds = {EXPERTS: _PackedExperts}
    elif MIXER in facts.shard_dim:  # a style for Mamba1 mixers only
        kinds = {MIXER: _mamba_mixer}
    elif HEADS in facts.shard_dim:  # a style for a block's own per-head parameters only
        kinds = {HEADS: _DeltaNetBlock if name == "GatedDeltaNetParallel" else _HeadsBlock}
    elif NORM in facts.shard_dim:  # a style for norms only
        kinds = {NORM: lambda: nn.LayerNorm(8)}
    else:
        from transformers.pytorch_utils import Conv1D

        makers = {
            LINEAR: _MODULE_OF.get(name, lambda: nn.Linear(8, 8)),
            EMBEDDING: lambda: nn.Embedding(16, 8),
            CONV1D: lambda: Conv1D(8, 16),  # weight [in 16, out 8]: the split dim is not the square's
        }
        if name in _MODULE_OF:  # a style for one module type only, on that module
            kinds = {LINEAR: makers[LINEAR]}
        else:  # a sharding style on the module kinds it splits (a tied pair's ends take one kind each)
            kinds = {k: makers[k] for k in (facts.shard_dim if facts.shards else makers)}
    for kind, make in kinds.items():
        holder = nn.Module()
        holder.m = make()
        weight_name = "A_log" if kind == MIXER else "weight"  # a mixer's own [channels, state]
        full = tuple(getattr(holder.m, weight_name).shape)
        parallelize_module(holder, tp_mesh, {"m": _built(name)})
        weight = getattr(holder.m, weight_name)
        assert _weight_text(weight) == facts.weight_layout(kind), (name, kind)
        local_shape = tuple(local(weight).shape)
        if facts.shards:
            expected = list(full)
            expected[facts.shard_dim[kind]] //= 2
            assert local_shape == tuple(expected), (name, kind)
        else:
            assert local_shape == full, (name, kind)


def test_style_facts_of_objects_follow_the_nearest_registered_class():
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle

    from plangen.styles.base import facts_of, is_sharding, style_kind
    from plangen.styles.kinds import weight_layout

    class MyColwise(ColwiseParallel):
        pass

    class Unrelated(ParallelStyle):
        def _apply(self, module, device_mesh):
            return module

    assert facts_of(MyColwise()).name == "ColwiseParallel"
    assert is_sharding(MyColwise()) and style_kind(MyColwise()) == "colwise"
    assert weight_layout(MyColwise(), nn.Embedding(4, 2)) == "Shard(1)"
    assert weight_layout(MyColwise(), nn.Linear(4, 2)) == "Shard(0)"
    assert facts_of(Unrelated()) is None and not is_sharding(Unrelated()) and style_kind(Unrelated()) == "other"
    assert weight_layout(Unrelated(), nn.Linear(4, 2)) is None and weight_layout(None, nn.Linear(4, 2)) == "plain"
    assert [style_kind(_built(n)) for n in ("PackedRowwiseParallel", "RotaryEmbedParallel", "AllReduceParamGrads")] == [
        "rowwise",
        "sequence",
        "grad_reduce",
    ]
    # A user's subclass of a plangen style is that style to the rules, in whatever module it lives.
    from plangen.styles import FlatExpertsParallel, SharedInputGather

    class MyFlatExperts(FlatExpertsParallel):
        pass

    assert facts_of(MyFlatExperts()).name == "FlatExpertsParallel" and is_sharding(MyFlatExperts())
    assert style_kind(SharedInputGather(readers=("router",))) == "prepare_input"


def test_every_registered_style_has_facts_found_from_its_object():
    """Each style is known by what it is, not by a list of the modules styles may live in (before
    the registry, the styles of three modules left off that list had no facts at all)."""
    from plangen.styles.base import STYLE_FACTS, facts_of

    for name in STYLE_CLASSES:
        assert facts_of(_built(name)) is STYLE_FACTS[name], name


def test_the_static_table_is_generated_from_the_style_classes():
    """plangen/plan/style_table.py is what ``python -m plangen.styles.table`` writes now: a style added,
    changed or given another signature without regenerating it fails here."""
    from plangen.styles.table import TABLE_PATH, render_table

    assert TABLE_PATH.read_text() == render_table(), "run: python -m plangen.styles.table"


def test_defining_a_style_with_facts_registers_it_and_a_second_of_that_name_is_refused():
    from plangen.plan.style_facts import StyleFacts
    from plangen.styles import base

    before = dict(base.STYLE_CLASSES), dict(base.STYLE_FACTS)
    try:

        class ProbeOnlyParallel(base.PlangenStyle):
            facts = StyleFacts("other")

            def _apply(self, module, device_mesh):
                return module

        assert base.STYLE_CLASSES["ProbeOnlyParallel"] is ProbeOnlyParallel
        assert base.STYLE_FACTS["ProbeOnlyParallel"].module == "plangen.styles"
        assert base.build_style("ProbeOnlyParallel")._apply(nn.Linear(2, 2), None) is not None

        class Variant(ProbeOnlyParallel):  # no facts of its own: its parent to the rules, not registered
            pass

        assert "Variant" not in base.STYLE_CLASSES and base.facts_of(Variant()).name == "ProbeOnlyParallel"
        with pytest.raises(TypeError, match="two parallel styles named 'ProbeOnlyParallel'"):

            class ProbeOnlyParallel(base.PlangenStyle):  # noqa: F811 - the point: a second class of that name
                facts = StyleFacts("other")

                def _apply(self, module, device_mesh):
                    return module
    finally:
        base.STYLE_CLASSES.clear(), base.STYLE_CLASSES.update(before[0])
        base.STYLE_FACTS.clear(), base.STYLE_FACTS.update(before[1])


def test_a_style_signature_the_static_checks_cannot_describe_is_refused_by_the_generator():
    from plangen.styles.table import StyleSignatureError, style_params

    class Positional(ColwiseParallel):
        def __init__(self, width: int) -> None:
            super().__init__()

    class Unknown(ColwiseParallel):
        def __init__(self, *, width: float = 1.0) -> None:
            super().__init__()

    with pytest.raises(StyleSignatureError, match="must be keyword-only"):
        style_params(Positional)
    with pytest.raises(StyleSignatureError, match=r"width: float\): an annotation"):
        style_params(Unknown)


def test_placement_from_text_round_trips_and_refuses_other_text():
    from torch.distributed.tensor import Partial, Replicate, Shard

    from plangen.plan.style_facts import placement_from_text

    assert placement_from_text("Shard(-1)") == Shard(-1)
    assert placement_from_text("Replicate()") == Replicate()
    assert placement_from_text("Partial(sum)") == Partial("sum")
    with pytest.raises(ValueError, match="not a placement"):
        placement_from_text("Shard(x)")


def test_style_facts_and_static_tables_import_without_torch():
    import subprocess
    import sys

    code = "import sys, plangen.plan.style_facts, plangen.plan.style_table, plangen.check.known_styles; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# The tied pair: one weight at both ends, whatever applies it first
# --------------------------------------------------------------------------------------------


def _tied_lm():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tiny_configs import build_tiny

    return build_tiny("llama-tied")


@pytest.mark.parametrize("head_first", [False, True])
def test_tied_pair_keeps_one_parameter_in_either_order(tp_mesh, head_first):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel

    model = _tied_lm()
    full = model.lm_head.weight.detach().clone()
    plan = {"model.embed_tokens": TiedEmbeddingParallel(), "lm_head": TiedHeadParallel()}
    if head_first:  # dict order must not matter
        plan = dict(reversed(list(plan.items())))
    parallelize_module(model, tp_mesh, plan)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.placements == (Shard(0),)
    assert len([n for n, _ in model.named_parameters() if n.endswith(("embed_tokens.weight", "lm_head.weight"))]) == 1
    assert torch.equal(local(model.lm_head.weight), full[: full.shape[0] // 2])


def test_tied_pair_hands_nothing_across_models_and_is_plain_on_an_untied_one(tp_mesh):
    import gc

    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import tied as tied_styles
    from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel

    plan = {"model.embed_tokens": TiedEmbeddingParallel(), "lm_head": TiedHeadParallel()}
    first, second = _tied_lm(), _tied_lm()
    parallelize_module(first, tp_mesh, plan)
    parallelize_module(second, tp_mesh, plan)  # the same dict, as a generated module's, on a second model
    assert second.lm_head.weight is second.model.embed_tokens.weight
    assert second.lm_head.weight is not first.lm_head.weight
    untied = _tied_lm()
    untied.lm_head.weight = nn.Parameter(untied.lm_head.weight.detach().clone())
    parallelize_module(untied, tp_mesh, plan)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight  # two weights stay two
    del first, second, untied
    gc.collect()
    assert tied_styles._HANDED_OVER == {} or all(o() is None for o, _ in tied_styles._HANDED_OVER.values())


def test_tied_pair_ends_refuse_the_other_module_kind(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel

    with pytest.raises(NotImplementedError, match="nn.Embedding"):
        parallelize_module(nn.Linear(4, 4), tp_mesh, TiedEmbeddingParallel())
    with pytest.raises(NotImplementedError, match="nn.Linear"):
        parallelize_module(nn.Embedding(4, 4), tp_mesh, TiedHeadParallel())


def test_rowwise_own_output_may_be_modified_in_place(tp_mesh):
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    from plangen.styles import RowwiseParallelOwnOutput

    def weight_grad(style, in_place: bool) -> torch.Tensor:
        torch.manual_seed(0)
        holder = nn.Module()
        holder.m = nn.Linear(8, 6)
        parallelize_module(holder, tp_mesh, {"m": style})
        out = holder.m(torch.randn(2, 5, 4))
        if in_place:
            out += 1.0  # Falcon's mlp_output += attention_output
        else:
            out = out + 1.0
        (out * out).sum().backward()
        return local(holder.m.weight.grad)

    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        weight_grad(RowwiseParallel(), in_place=True)
    # The output a copy: the in-place add is allowed, and the gradient is what the out-of-place add gives.
    assert torch.equal(weight_grad(RowwiseParallelOwnOutput(), True), weight_grad(RowwiseParallel(), False))
    m = apply_style(nn.Linear(8, 6), "rowwise", tp_mesh)
    own = nn.Module()
    own.m = nn.Linear(8, 6)
    parallelize_module(own, tp_mesh, {"m": RowwiseParallelOwnOutput()})
    x = torch.randn(2, 5, 4)
    assert collectives(lambda: own.m(x)) == collectives(lambda: m(x)) == {"all_reduce": 1}


def test_colwise_own_output_may_be_modified_in_place(tp_mesh):
    """The stable variant's twin: column-parallel on a gathered input, the gathered output a copy."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from torch.distributed.tensor import Replicate, Shard

    from plangen.styles import ColwiseParallelOwnOutput

    gathered = {"input_layouts": Shard(-1), "output_layouts": Replicate(), "use_local_output": True}

    def weight_grad(style, in_place: bool) -> torch.Tensor:
        torch.manual_seed(0)
        holder = nn.Module()
        holder.m = nn.Linear(8, 6)
        parallelize_module(holder, tp_mesh, {"m": style})
        out = holder.m(torch.randn(2, 5, 8 // tp_mesh.size()))
        if in_place:
            out += 1.0
        else:
            out = out + 1.0
        (out * out).sum().backward()
        return local(holder.m.weight.grad)

    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        weight_grad(ColwiseParallel(**gathered), in_place=True)
    assert torch.equal(
        weight_grad(ColwiseParallelOwnOutput(**gathered), True), weight_grad(ColwiseParallel(**gathered), False)
    )


class _ScaledEmbedding(nn.Embedding):
    """Gemma3's layout: the module scales its own lookup (Gemma3TextScaledWordEmbedding)."""

    def forward(self, input_ids):
        return super().forward(input_ids) * 3.0


def test_local_lookup_scales_this_ranks_partial_lookup_and_reduces_it_once(tp_mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import TiedEmbeddingParallel

    # 9 rows over TP 2 split as torch.chunk does: rank 0 (this fake rank) holds rows 0-4.
    holder = nn.Module()
    holder.m = _ScaledEmbedding(9, 4, padding_idx=7)
    full = holder.m.weight.detach().clone()
    parallelize_module(
        holder,
        tp_mesh,
        {"m": TiedEmbeddingParallel(output_layouts=Shard(1), use_local_output=False, local_lookup=True)},
    )
    ids = torch.tensor([[0, 4, 5, 8], [7, 1, 2, 3]])
    with CommDebugMode() as comm:
        out = holder.m(ids)
    # One reduce-scatter of the scaled partial lookup, nothing all-reduced (the fake group leaves this
    # rank's partial sum in place: its rows scaled, the other rank's rows zero).
    assert {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()} == {"reduce_scatter_tensor": 1}
    assert isinstance(out, DTensor) and tuple(out.placements) == (Shard(1),)
    expected = torch.where((ids < 5).unsqueeze(-1), full[ids.clamp(max=4)] * 3.0, torch.zeros(()))
    torch.testing.assert_close(out.to_local(), expected[:, :2])
    # The parameter and the global padding index are back after the forward.
    assert isinstance(holder.m.weight, DTensor) and tuple(holder.m.weight.placements) == (Shard(0),)
    assert holder.m.padding_idx == 7 and tuple(holder.m.weight.to_local().shape) == (5, 4)
    assert Replicate() == TiedEmbeddingParallel(local_lookup=True).output_layouts[0]  # all-reduce by default


def test_embedding_row_reads_take_the_whole_row_with_one_all_reduce_and_only_rows(tp_mesh):
    """On this fake rank (rank 0 of TP 2: rows 0-4 of 9) a held row is its own, one not held is this
    rank's zero share of the sum; each read is one all-reduce of the hidden size, the embedding's own
    lookup one more, and any other read of the weight is refused with its name (gloo: both ranks whole,
    test_styles_match_transformers_and_unsharded_at_tp2)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import EmbeddingRowReadParallel, TiedEmbeddingParallel

    model = _ReadsRows(9)
    full = model.embed.weight.detach().clone()
    parallelize_module(
        model,
        tp_mesh,
        {"embed": TiedEmbeddingParallel(local_lookup=True), "": EmbeddingRowReadParallel(embedding="embed")},
    )
    ids = torch.tensor([[0, 1, 2, 3]])
    with CommDebugMode() as comm:
        out = model(ids)
    # the lookup: a DTensor all-reduce; each row: one c10d all-reduce (plangen.styles.tp_sums.SumOverMesh)
    assert {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()} == {"all_reduce": 1, "allreduce_": 2}
    torch.testing.assert_close(out, full[ids] * (full[2] * 2).view(1, 1, -1))  # row 7's share here: zeros
    out.sum().backward()
    grad = model.embed.weight.grad
    assert isinstance(grad, DTensor) and grad.to_local()[2].abs().sum() > 0
    assert isinstance(model.embed.weight[0:2], DTensor)  # outside the module's forward: untouched

    class ReadsSlice(_ReadsRows):
        def forward(self, ids):
            return self.embed(ids) * self.embed.weight[0:2].sum()

    other = ReadsSlice(9)
    parallelize_module(
        other,
        tp_mesh,
        {"embed": TiedEmbeddingParallel(local_lookup=True), "": EmbeddingRowReadParallel(embedding="embed")},
    )
    with pytest.raises(NotImplementedError, match=r"ReadsSlice\.embed\.weight\[slice\(0, 2"):
        other(ids)


def _tiny_experts(name: str):
    from tiny_configs import build_tiny

    return build_tiny(name).model.layers[0].mlp.experts


def test_experts_the_tp_size_does_not_divide_split_each_experts_intermediate(tp_mesh):
    """3 experts at TP 2 (and HunYuan's one): each rank holds every expert's slice of gate, of up
    (gate_up_proj re-laid out [gate_r; up_r]) and of down_proj's input; 8 experts keep the expert split."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.experts import ExpertsParallel, choose_expert_layout

    assert choose_expert_layout(8, 2) == "experts" and choose_expert_layout(3, 2) == "intermediate"
    assert choose_expert_layout(1, 2) == "intermediate" and choose_expert_layout(4, 4) == "experts"
    for name, experts in (("mixtral-3-experts", 3), ("hunyuan_v1_moe", 1)):
        holder = nn.Module()
        holder.experts = _tiny_experts(name)
        gate_up, down = holder.experts.gate_up_proj.detach().clone(), holder.experts.down_proj.detach().clone()
        parallelize_module(holder, tp_mesh, {"experts": ExpertsParallel()})
        module = holder.experts
        assert module._plangen_expert_layout == "intermediate" and module.num_experts == experts
        assert module.gate_up_proj.placements == (Shard(1),) and module.down_proj.placements == (Shard(2),)
        width = down.shape[2]  # the intermediate, 64
        rank = tp_mesh.get_local_rank()
        mine = slice(rank * width // 2, (rank + 1) * width // 2)
        expected = torch.cat([gate_up[:, :width][:, mine], gate_up[:, width:][:, mine]], dim=1)
        assert torch.equal(local(module.gate_up_proj), expected)
        assert torch.equal(local(module.down_proj), down[:, :, mine])
    holder = nn.Module()
    holder.experts = _tiny_experts("mixtral")
    parallelize_module(holder, tp_mesh, {"experts": ExpertsParallel()})
    assert holder.experts._plangen_expert_layout == "experts" and holder.experts.num_experts == 4


def test_experts_called_by_their_layer_under_sp_leave_their_sum_a_partial_dtensor(tp_mesh):
    """ExpertsParallel(output_layouts=Partial(), use_local_output=False) (Gemma 4's MoE form under SP):
    the local partial sum comes back as a Partial DTensor, for the norm after it to reduce-scatter;
    asking for a DTensor of an already reduced output is refused."""
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.experts import ExpertsParallel

    holder = nn.Module()
    holder.experts = _tiny_experts("mixtral")
    parallelize_module(holder, tp_mesh, {"experts": ExpertsParallel(output_layouts=Partial(), use_local_output=False)})
    tokens = torch.randn(6, holder.experts.gate_up_proj.shape[-1])
    index, weights = torch.tensor([[0, 3]] * 6), torch.full((6, 2), 0.5)
    out = holder.experts(tokens, index, weights)
    assert isinstance(out, DTensor) and out.placements == (Partial(),) and out.shape == tokens.shape
    with pytest.raises(ValueError, match=r"use_local_output=False needs output_layouts=Partial\(\)"):
        ExpertsParallel(output_layouts=Replicate(), use_local_output=False)


def test_experts_that_neither_layout_fits_are_refused_naming_both(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.experts import ExpertsParallel

    experts = _tiny_experts("mixtral-3-experts")
    experts.down_proj = nn.Parameter(torch.zeros(3, 32, 63))  # an odd intermediate width
    holder = nn.Module()
    holder.experts = experts
    with pytest.raises(
        ValueError,
        match=r"3 experts do not divide by the TP size 2, and each expert's intermediate "
        r"split \(the other layout\) does not fit: their intermediate width 63",
    ):
        parallelize_module(holder, tp_mesh, {"experts": ExpertsParallel()})


def test_mamba2_mixer_is_split_by_heads_and_made_local(tp_mesh):
    """What each rank holds: in_proj and conv1d re-laid out (z|x|B|C|dt, x|B|C) with this rank's rows,
    the per-head parameters Shard(0), and the shape attributes the forward reads made this rank's."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.fused import LAYOUT_ATTRIBUTE
    from plangen.styles import build_style

    for groups, local_groups in ((2, 1), (1, 1)):
        holder = nn.Module()
        holder.m = _mamba2_mixer(n_groups=groups)
        parallelize_module(holder, tp_mesh, {"m": build_style("Mamba2MixerParallel")})
        mixer = holder.m
        heads, state = 4, 8
        assert (mixer.num_heads, mixer.intermediate_size, mixer.n_groups) == (2, 32, local_groups)
        assert mixer.conv_dim == 32 + 2 * local_groups * state
        bc = groups * state
        assert getattr(mixer.in_proj, LAYOUT_ATTRIBUTE) == ((64, 64, bc, bc, heads), 2, None)
        assert getattr(mixer.conv1d, LAYOUT_ATTRIBUTE) == ((64, bc, bc), 2, None)
        assert tuple(mixer.in_proj.weight.to_local().shape) == ((128 + 2 * bc + heads) // 2, 32)
        for name in ("A_log", "D", "dt_bias"):
            param = getattr(mixer, name)
            assert isinstance(param, DTensor) and param.placements == (Shard(0),) and param.to_local().shape == (2,)


def test_mamba2_mixer_refuses_a_tp_size_that_splits_neither_heads_nor_groups(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.mamba2 import Mamba2Layout, resolve_mamba2_layout
    from plangen.styles import build_style

    assert Mamba2Layout(heads=8, head_dim=4, groups=2, state=16).largest_tp() == 2
    assert Mamba2Layout(heads=8, head_dim=4, groups=1, state=16).largest_tp() == 8
    assert (
        Mamba2Layout(heads=6, head_dim=4, groups=6, state=16).refusal(4) == "mamba heads=6 do not split over TP size 4"
    )
    mixer = _mamba2_mixer(n_groups=4)  # 4 heads, 4 groups: fine at TP 2
    assert resolve_mamba2_layout(mixer).refusal(2) is None
    holder = nn.Module()
    holder.m = _mamba2_mixer(mamba_num_heads=6, n_groups=3)
    with pytest.raises(
        ValueError, match=r"n_groups=3 is neither 1 nor divisible by TP size 2; the largest TP size it splits over is 3"
    ):
        parallelize_module(holder, tp_mesh, {"m": build_style("Mamba2MixerParallel")})
    with pytest.raises(ValueError, match="not a Mamba2 mixer"):
        resolve_mamba2_layout(nn.Linear(4, 4))


def test_gated_norm_style_refuses_a_norm_that_computes_something_else(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import build_style

    class Ungated(nn.Module):  # RMS over groups, but ignores the gate
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.group_size, self.variance_epsilon = nn.Parameter(torch.ones(8)), 4, 1e-6

        def forward(self, x, gate=None):
            return _gated_norm().forward(x)

    for module in (Ungated(), nn.LayerNorm(8)):
        holder = nn.Module()
        holder.m = module
        with pytest.raises(ValueError, match="gated RMSNorm"):
            parallelize_module(holder, tp_mesh, {"m": build_style("GatedRMSNormParallel")})


def test_sequence_parallel_own_parameters_meet_the_sharded_residual_and_sum_their_gradient(fake_pg):
    """Doge's layer scales under SP: Replicate DTensors in the forward against the Shard(1) residual,
    plain parameters outside it, and one all-reduce per parameter in backward (the sum over TP)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    from plangen.styles import SequenceParallelOwnParameters

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))
            self.child = nn.Linear(4, 4)

        def forward(self, x):
            return self.scale * x

    module = Scaled()
    mesh = DeviceMesh("cpu", torch.arange(2))
    SequenceParallelOwnParameters()._apply(module, mesh)
    residual = DTensor.from_local(torch.randn(1, 3, 4, requires_grad=True), mesh, (Shard(1),), run_check=False)
    with CommDebugMode() as comm:
        out = module(residual)
        assert isinstance(out, DTensor) and out.placements == (Shard(1),)
        assert comm.get_total_counts() == 0  # nothing in forward
        out.to_local().sum().backward()
    assert comm.get_comm_counts().get(torch.ops.c10d_functional.all_reduce, 0) == 1
    assert type(module.scale) is nn.Parameter and module.scale.grad.shape == (4,)
    assert not isinstance(module.child.weight, DTensor)  # children keep their own styles
    with torch.no_grad():
        assert isinstance(module(residual), DTensor)  # swapped without autograd too


def test_routed_block_keeps_its_bias_one_replicated_parameter_even_when_its_forward_fails(tp_mesh):
    """RoutedBlockSequenceParallel makes the block's bias a Replicate() DTensor (added once, on the
    sequence shard, after the reduce-scatter) and puts a zero in its place during the forward; the
    parameter is back afterwards, also when the forward raises (always_call), and the output is the
    block's sequence shard, a DTensor. Numerics: tests/test_parallelize_distributed.py (jetmoe-sp)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    holder = nn.Module()
    holder.m = _jetmoe_moe()
    parallelize_module(holder, tp_mesh, {"m": _built("RoutedBlockSequenceParallel")})
    block = holder.m
    bias = block.bias
    assert isinstance(bias, DTensor) and bias.placements == (Replicate(),)
    output = block(torch.randn(2, 4, 32))  # this rank's sequence shard; the block gathers it
    assert isinstance(output, DTensor) and output.placements == (Shard(1),) and output.to_local().shape == (2, 4, 32)
    assert block.bias is bias

    def fail(*_: Any) -> None:
        raise RuntimeError("router failed")

    block.router.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="router failed"):
        block(torch.randn(2, 4, 32))
    assert block.bias is bias and "bias" in dict(block.named_parameters())


def test_rwkv_mixers_are_split_by_channels_and_put_back_after_a_forward(tp_mesh):
    """RwkvTimeMixParallel / RwkvChannelMixParallel at TP 2 (rank 0): the time mixing's key, value,
    receptance rows and time_decay/time_first, the channel mixing's key and receptance rows and
    value's columns, this rank's half; the time_mix_* whole; parameters put back after a forward,
    whose WKV state is this rank's channels of the caller's (written in place) and handed back whole."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import RwkvChannelMixParallel, RwkvTimeMixParallel

    holder = nn.Module()
    holder.t, holder.c = _rwkv_mixer("time"), _rwkv_mixer("channel")
    reference = {k: v.clone() for k, v in holder.state_dict().items()}
    parallelize_module(holder, tp_mesh, {"t": RwkvTimeMixParallel(), "c": RwkvChannelMixParallel()})
    expected = {
        **{f"t.{n}.weight": (Shard(0), reference[f"t.{n}.weight"][:16]) for n in ("key", "value", "receptance")},
        "t.time_decay": (Shard(0), reference["t.time_decay"][:16]),
        "t.time_first": (Shard(0), reference["t.time_first"][:16]),
        "c.key.weight": (Shard(0), reference["c.key.weight"][:32]),
        "c.receptance.weight": (Shard(0), reference["c.receptance.weight"][:16]),
        "c.value.weight": (Shard(1), reference["c.value.weight"][:, :32]),
    }
    params = dict(holder.named_parameters())
    for name, (placement, rows) in expected.items():
        assert placements(params[name]) == (placement,), name
        assert torch.equal(local(params[name]), rows), name
    assert not any(isinstance(params[n], DTensor) for n in params if "time_mix" in n or n == "t.output.weight")
    holder.t.output.weight.data = holder.t.output.weight.data[:, :16].clone()  # as its row-parallel style leaves it
    state = [torch.zeros(2, 32, 2) for _ in range(5)]
    out, returned = holder.t(torch.randn(2, 3, 32), state=state, use_cache=True)
    assert returned is state and out.shape == (2, 3, 32)
    assert state[2][:, :16, 0].abs().sum() > 0 and state[2][:, 16:, 0].abs().sum() == 0  # rank 0's channels
    assert holder.c(torch.randn(2, 3, 32))[0].shape == (2, 3, 32)  # fake group: gathered to the whole width
    assert all(isinstance(dict(holder.named_parameters())[n], DTensor) for n in expected)
    assert all(type(p) is nn.Parameter for n, p in holder.named_parameters() if "time_mix" in n)


def test_rwkv_mixer_styles_refuse_the_other_kind_and_what_they_cannot_split(tp_mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import RwkvChannelMixParallel, RwkvTimeMixParallel

    holder = nn.Module()
    holder.m = _rwkv_mixer("channel")
    with pytest.raises(
        ValueError, match="RwkvTimeMixParallel: RwkvFeedForward: an RWKV channel mixing module, not the time"
    ):
        parallelize_module(holder, tp_mesh, {"m": RwkvTimeMixParallel()})
    holder.m = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="RwkvChannelMixParallel: Linear: not an RWKV-4 time mixing"):
        parallelize_module(holder, tp_mesh, {"m": RwkvChannelMixParallel()})


def test_head_table_is_split_by_heads_and_the_bias_is_this_ranks_heads(tp_mesh):
    """HeadTableParallel on CpmAnt's position bias (rank 0): the [buckets, heads] table Shard(1), the
    bias it computes [batch, heads / 2, q, k] from rank 0's columns; refused where TP does not divide the heads."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import HeadTableParallel

    holder = nn.Module()
    holder.m = _position_bias()
    positions, segments = torch.arange(6).repeat(2, 1), torch.full((2, 6), 2)
    whole = holder.m(positions, positions, segments, segments)
    parallelize_module(holder, tp_mesh, {"m": HeadTableParallel()})
    assert placements(holder.m.relative_attention_bias) == (Shard(1),)
    assert torch.equal(holder.m(positions, positions, segments, segments), whole[:, :2])
    assert isinstance(holder.m.relative_attention_bias, DTensor)
    holder.m = _position_bias()
    holder.m.relative_attention_bias = nn.Parameter(torch.zeros(32, 3))
    with pytest.raises(ValueError, match=r"HeadTableParallel: PositionBias.relative_attention_bias is \(32, 3\)"):
        parallelize_module(holder, tp_mesh, {"m": HeadTableParallel()})


def test_moe_block_reducing_its_input_gradient_once_refuses_what_it_cannot_count_once(tp_mesh):
    """MoeBlockParallel reduces the block input's gradient once for its branches (counts:
    tests/test_comm_counts.py, numerics: the MoE and inkling distributed cases). A block with experts
    but without the router or a gate named (whose whole gradient must count once) is refused, and so
    are shards of the hidden state handed to the branches; PartialGradInput takes whole inputs only."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.experts import expert_count
    from plangen.styles import MoeBlockParallel, PartialGradInput

    block = _EveryTokenMoe()
    assert expert_count(block.experts)
    style = MoeBlockParallel(
        router="router",
        gates=("shared_expert_gate",),
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        output_layouts=(Partial(),),
        desired_output_layouts=(Replicate(),),
    )
    with pytest.raises(ValueError, match="_EveryTokenMoe has experts but no shared_expert_gate"):
        parallelize_module(block, tp_mesh, style)
    with pytest.raises(ValueError, match="read its input whole"):
        MoeBlockParallel(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Shard(1),),
            output_layouts=(Partial(),),
            desired_output_layouts=(Shard(1),),
        )
    with pytest.raises(ValueError, match="must be whole"):
        PartialGradInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def test_shared_input_gather_partial_readers_are_among_its_readers_and_their_parameters_replicated(tp_mesh):
    """A partial reader must be one of the readers it gathers for; its own parameters become Replicate
    DTensors (as a sequence-parallel norm's), the other readers' stay plain."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles import SharedInputGather

    with pytest.raises(ValueError, match="partial_readers"):
        SharedInputGather(readers=("router",), partial_readers=("norm",))
    layer = nn.Module()
    layer.router, layer.norm = nn.Linear(8, 4), nn.LayerNorm(8)
    parallelize_module(layer, tp_mesh, SharedInputGather(readers=("router", "norm"), partial_readers=("norm",)))
    assert all(isinstance(p, DTensor) and p.placements == (Replicate(),) for p in layer.norm.parameters())
    assert not any(isinstance(p, DTensor) for p in layer.router.parameters())

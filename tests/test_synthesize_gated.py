"""Attention with an output gate per head, and the LFM short-conv mixer: how the synthesizer shards them.

Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (a ``q_proj`` of query and gate per head), LFM3 (a ``g_proj`` of
one value per head) and LFM2-MoE / LFM3's ``ShortConv`` (packed ``[B; C; x]``, a depthwise conv):
each recognised from shapes and the forward source (``plangen.plans.families.gated``,
``plangen.plans.families.short_conv``). Their numerics against the unsharded model, and their state
dicts at DP 2 x TP 2, are in tests/test_synthesized_distributed.py.
"""

from __future__ import annotations

import pytest

from conftest import pinned_release_only, skip_unless_pinned_model_code
import torch
from torch import nn

from plangen.model.resolve import build_meta_model, resolve_model
from plangen.plans.families.core import KeptBlock, ShardedBlock, recognize_attention
from plangen.plans.families.registry import recognize_block
from plangen.plans.families.dims import read_dims
from plangen.plans.synthesis.synthesize import build_synthesized_plan
from plangen.model.shrink import shrink_config


def meta(model_type: str) -> nn.Module:
    resolved = resolve_model(model_type)
    return build_meta_model(shrink_config(resolved.config, 2, attn_implementation="eager"), resolved.model_class)


def styles(plan) -> dict[str, str]:
    return {e.pattern: e.style for e in plan.entries}


def replicated(plan) -> set[str]:
    return {r.pattern for r in plan.replicated}


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_query_and_gate_per_head_is_sharded_with_its_heads(model_type, sequence_parallel):
    # q_proj(x).view(*shape, -1, head_dim * 2), then torch.chunk(.., 2, dim=-1): each head's query
    # then its gate, head after head, so a plain Shard(0) keeps every gate with its head.
    plan = build_synthesized_plan(meta(model_type), sequence_parallel)
    found = styles(plan)
    attention = next(p.removesuffix(".q_proj") for p in found if p.endswith("self_attn.q_proj"))
    assert found[f"{attention}.q_proj"] == "ColwiseParallel"
    assert found[f"{attention}.k_proj"] == found[f"{attention}.v_proj"] == "KVHeadsColwiseParallel"
    assert found[f"{attention}.q_norm"] == found[f"{attention}.k_norm"] == "ReplicatedWithGradAllReduce"
    assert found[f"{attention}.o_proj"] == "RowwiseParallel"
    assert found[attention] == "PrepareAttentionInput"
    assert attention not in replicated(plan)


def test_qwen3_next_attention_is_no_longer_taken_for_a_mixture_of_experts():
    # Its k_proj (512 rows at the default size) matched the expert count: the block was kept whole
    # as "mixture of experts".
    from plangen.commands.catalog import build_full_size_model, list_architectures

    arch = next(a for a in list_architectures() if a.class_name == "Qwen3NextForCausalLM")
    model = build_full_size_model(arch)
    attention = next(m for n, m in model.named_modules() if n.endswith("self_attn"))
    assert isinstance(recognize_block("self_attn", attention, read_dims(model)), ShardedBlock)


def test_the_packed_reader_follows_torch_chunk_called_as_a_function():
    from plangen.plans.source.packed import PackedSplit, read_packed_split

    model = meta("qwen3_5")
    attention = next(m for n, m in model.named_modules() if n.endswith("self_attn"))
    dims = read_dims(model)
    split = read_packed_split(
        attention, "q_proj", attention.q_proj.out_features, {dims.heads, dims.kv_heads}, dims.head_dim
    )
    assert split == PackedSplit("groups", groups=dims.heads)


class _Interleaved(nn.Module):
    """Each head's query then its gate, head after head (Qwen3.5's layout)."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16):
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, 2 * heads * head_dim)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim)
        self.o_proj = nn.Linear(heads * head_dim, hidden)

    def forward(self, hidden_states):
        shape = hidden_states.shape[:-1]
        query, gate = torch.chunk(self.q_proj(hidden_states).view(*shape, -1, self.head_dim * 2), 2, dim=-1)
        out = query.reshape(*shape, -1) * torch.sigmoid(gate.reshape(*shape, -1))
        return self.o_proj(out + self.k_proj(hidden_states).sum() + self.v_proj(hidden_states).sum())


class _Parts(_Interleaved):
    """All queries, then all gates."""

    def forward(self, hidden_states):
        query, gate = self.q_proj(hidden_states).chunk(2, dim=-1)
        return self.o_proj(
            query * torch.sigmoid(gate) + self.k_proj(hidden_states).sum() + self.v_proj(hidden_states).sum()
        )


class _Wide(_Interleaved):
    """As wide as query and gate, but read whole, not per head (Inkling's r_proj has the width only)."""

    def forward(self, hidden_states):
        scale = self.q_proj(hidden_states).mean(-1, keepdim=True)
        return self.o_proj(hidden_states * scale + self.k_proj(hidden_states).sum() + self.v_proj(hidden_states).sum())


def _dims():
    from plangen.plans.families.dims import ModelDims

    return ModelDims(hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=None, experts=None)


def test_query_and_gate_layouts_are_read_from_the_forward():
    interleaved = recognize_attention(_Interleaved(), _dims())
    assert isinstance(interleaved, ShardedBlock) and interleaved.fused == ()
    assert interleaved.colwise == ("q_proj", "k_proj", "v_proj") and interleaved.kv_projections == ("k_proj", "v_proj")
    # [all queries; all gates]: re-laid out so each rank holds its heads' queries and gates.
    parts = recognize_attention(_Parts(), _dims())
    assert isinstance(parts, ShardedBlock) and parts.fused == (("q_proj", (1, 1)),)
    # Only twice as wide: not taken for a query and gate.
    assert recognize_attention(_Wide(), _dims()) is None


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_lfm3_per_head_gate_and_short_conv_are_sharded(sequence_parallel):
    plan = build_synthesized_plan(meta("lfm3"), sequence_parallel)
    found = {e.pattern: e for e in plan.entries}
    attention = next(p.removesuffix(".g_proj") for p in found if p.endswith("self_attn.g_proj"))
    assert found[f"{attention}.g_proj"].style == "ColwiseParallel"  # one value per head: its heads' rows
    assert found[f"{attention}.q_proj"].style == "ColwiseParallel"
    assert found[f"{attention}.o_proj"].style == "RowwiseParallel"
    conv = next(p for p in found if p.endswith(".conv") and found[p].style == "GatedDeltaNetParallel")
    mixer = found[conv].kwargs
    assert (mixer["conv_parts"], mixer["head_attributes"], mixer["head_parameters"]) == ((1,), (), ())
    assert (found[f"{conv}.in_proj"].style, found[f"{conv}.in_proj"].kwargs["part_sizes"]) == (
        "FusedColwiseParallel",
        (1, 1, 1),
    )
    assert found[f"{conv}.out_proj"].style == "RowwiseParallel"
    assert not any(p.startswith(f"{conv}.") and p.endswith("norm") for p in found)  # no norm to reduce
    assert not {attention, conv} & replicated(plan)


def test_a_conv_mixer_of_other_parts_is_not_a_short_conv():
    from plangen.plans.families.short_conv import recognize_short_conv

    model = meta("lfm2_moe")
    skip_unless_pinned_model_code(model)
    conv = next(m for n, m in model.named_modules() if type(m).__name__ == "Lfm2MoeShortConv")
    dims = read_dims(model)
    assert recognize_short_conv(conv, dims) is not None
    conv.extra = nn.Linear(dims.hidden, dims.hidden, device="meta")  # a fourth part with weights
    assert recognize_short_conv(conv, dims) is None
    assert isinstance(recognize_block("conv", conv, dims), KeptBlock)


@pinned_release_only
@pytest.mark.parametrize("class_name", ["Qwen3_5ForCausalLM", "Lfm3ForCausalLM"])  # 94.7 % and 80.6 % before
def test_the_default_size_shards_at_least_95_percent(fake_pg, class_name):
    from plangen.commands.catalog import (
        WELL_SHARDED,
        build_full_size_model,
        list_architectures,
        measure_sharded_fraction,
    )

    arch = next(a for a in list_architectures() if a.class_name == class_name)
    assert measure_sharded_fraction(lambda: build_full_size_model(arch)) >= WELL_SHARDED

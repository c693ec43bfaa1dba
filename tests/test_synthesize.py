"""Synthesized plans on meta models: what is sharded, what stays replicated and why; exact collectives.

The recognizers work from shapes and the forward source, so the same code that re-derives the
hand-written plans (first tests) must also handle renamed projections, per-head norms under other
names, fused projections, OLMo-2's whole-projection norms, MoE and state-space mixers.
"""

from __future__ import annotations

import inspect
import json
from importlib import resources

import pytest
import torch
import transformers
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from conftest import differs_from_pinned_model_code, skip_unless_pinned_model_code
from plangen.model.resolve import build_meta_model, resolve_model
from plangen.model.shrink import shrink_config
from plangen.styles import build_parallel_styles
from plangen.plans import HAND_WRITTEN
from plangen.plans.choice import NoPlanError, choose_plan
from plangen.plans.source.forward import BlockCall, read_block_call, read_input_readers
from plangen.plans.synthesis.synthesize import analyze_model, build_synthesized_plan


HAND_WRITTEN_CLASS = {"llama4": resolve_model("llama4").model_class}


def meta(model_type: str) -> nn.Module:
    resolved = resolve_model(model_type)
    config = shrink_config(resolved.config, 2, attn_implementation="eager")
    return build_meta_model(config, resolved.model_class)


def entry_set(plan) -> set:
    return {(e.pattern, e.style, tuple(sorted((k, repr(v)) for k, v in e.kwargs.items()))) for e in plan.entries}


def styles_of(plan) -> dict[str, str]:
    return {e.pattern: e.style for e in plan.entries}


def why_of(plan, pattern: str) -> str:
    return next(r.why for r in plan.replicated if r.pattern == pattern)


# --- the hand-written plans, derived again from structure ------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_synthesizer_rederives_every_hand_written_dense_plan(model_type, sequence_parallel):
    model = meta(model_type)
    synthesized = build_synthesized_plan(model, sequence_parallel)
    hand_written = HAND_WRITTEN[type(model).__name__](model, sequence_parallel)
    assert synthesized.source == "synthesized"
    assert entry_set(synthesized) == entry_set(hand_written)


def test_synthesizer_rederives_nemotron_h_with_its_mamba2_mixers_split_and_replicates_its_moe():
    model = meta("nemotron_h")
    synthesized = build_synthesized_plan(model, False)
    # The hand-written plan also splits the MoE mixer's experts (plangen.plans.hybrid): the rest is the same.
    moe = [f"model.layers.{i}.mixer" for i, kind in enumerate(model.config.layers_block_type) if kind == "moe"]
    hand_written = {
        e
        for e in entry_set(HAND_WRITTEN["NemotronHForCausalLM"](model, False))
        if e[0] not in moe
        and not e[0].startswith(("model.layers.*.mixer.experts", "model.layers.*.mixer.shared_experts"))
    }
    assert moe and entry_set(synthesized) == hand_written
    reasons = {r.why for r in synthesized.replicated}
    assert any("mixture of experts" in why for why in reasons) and not any("Mamba2" in why for why in reasons)
    assert styles_of(synthesized)["model.layers.0.mixer"] == "Mamba2MixerParallel"


# --- recognition by shapes and data flow, not names -------------------------------------------


def test_renamed_projections_are_recognised_by_what_they_read():
    # LFM2: w1/w3 read the MLP input (column-parallel), w2 maps the intermediate back (row-parallel);
    # out_proj is attention's output; q_layernorm/k_layernorm are one head wide.
    styles = styles_of(build_synthesized_plan(meta("lfm2"), False))
    layer = "model.layers.*"
    assert styles[f"{layer}.feed_forward.w1"] == styles[f"{layer}.feed_forward.w3"] == "ColwiseParallel"
    assert styles[f"{layer}.feed_forward.w2"] == "RowwiseParallel"
    assert styles[f"{layer}.self_attn.out_proj"] == "RowwiseParallel"
    assert styles[f"{layer}.self_attn.q_layernorm"] == "ReplicatedWithGradAllReduce"


def test_per_head_norms_are_recognised_by_their_width():
    styles = styles_of(build_synthesized_plan(meta("hunyuan_v1_dense"), False))
    for norm in ("query_layernorm", "key_layernorm"):
        assert styles[f"model.layers.*.self_attn.{norm}"] == "ReplicatedWithGradAllReduce"


def test_call_conventions_come_from_the_layer_source():
    plan = build_synthesized_plan(meta("olmo"), True)
    kwargs = {e.pattern: dict(e.kwargs) for e in plan.entries}
    # OLMo's layer passes hidden_states= to attention and the hidden state positionally to the MLP.
    assert set(kwargs["model.layers.*.self_attn"]["input_kwarg_layouts"]) == {"hidden_states"}
    assert kwargs["model.layers.*.mlp"]["input_layouts"] == (torch.distributed.tensor.Shard(1),)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.gate, self.down = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, hidden_states, mask=None):
        scaled = self.up(hidden_states) * self.gate(hidden_states)
        hidden_states = self.down(scaled)
        return self.up(hidden_states), None


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp, self.other = _Block(), _Block(), _Block()

    def forward(self, x, mask):
        y, _ = self.attn(hidden_states=x, mask=mask)
        z = self.mlp(y, mask)
        return self.other(z)[0]


def test_forward_source_reader():
    assert read_block_call(_Layer, "attn", _Block) == BlockCall(0, "hidden_states", 2)
    assert read_block_call(_Layer, "mlp", _Block) == BlockCall(2, None, 1)
    assert read_block_call(_Layer, "other", _Block) == BlockCall(1, None, None)  # [0]: tuple of unknown length
    assert read_block_call(_Layer, "missing", _Block) is None
    # up and gate read the input; down reads an intermediate; the later up(...) reads a new value.
    assert read_input_readers(_Block) == {"up", "gate"}


# --- what cannot be sharded stays replicated, with the reason -----------------------------------


@pytest.mark.parametrize("model_type", ["olmo2", "olmoe", "flex_olmo", "minimax_m2"])
def test_whole_projection_norms_are_sharded_with_their_heads(model_type):
    model = meta(model_type)
    for sp in (False, True):
        styles = styles_of(build_synthesized_plan(model, sp))
        assert styles["model.layers.*.self_attn.q_proj"] == "ColwiseParallel"
        assert styles["model.layers.*.self_attn.q_norm"] == "ShardedNormParallel"
        assert styles["model.layers.*.self_attn.k_norm"] == "ShardedNormParallel"
        assert styles["model.layers.*.self_attn.o_proj"] == "RowwiseParallel"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_bitnets_norms_before_the_row_parallel_projections_are_sharded_with_their_slices(sequence_parallel):
    """attn_sub_norm (all heads' output, then o_proj) and ffn_sub_norm (the intermediate, then down_proj)."""
    styles = styles_of(build_synthesized_plan(meta("bitnet"), sequence_parallel))
    assert styles["model.layers.*.self_attn.attn_sub_norm"] == "ShardedNormParallel"
    assert styles["model.layers.*.mlp.ffn_sub_norm"] == "ShardedNormParallel"
    for path in ("self_attn.q_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert styles[f"model.layers.*.{path}"] == "ColwiseParallel"
    assert styles["model.layers.*.self_attn.o_proj"] == styles["model.layers.*.mlp.down_proj"] == "RowwiseParallel"


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_bitnets_quantised_linears_are_not_sharded(mode):
    """A BitNet checkpoint loads with AutoBitLinear (its quantization_config): each scales by mean |W| and
    each token's input absmax, which a shard does not hold (offline: silently wrong; online: a DTensor error)."""
    from transformers.integrations.bitnet import replace_with_bitnet_linear
    from transformers.utils.quantization_config import BitNetQuantConfig

    model = meta("bitnet")
    quantised = BitNetQuantConfig(linear_class="autobitlinear", quantization_mode=mode)
    replace_with_bitnet_linear(model, modules_to_not_convert=["lm_head"], quantization_config=quantised)
    with pytest.raises(ValueError, match="q_proj AutoBitLinear"):
        build_synthesized_plan(model, False)


class _OutputNormAttention(nn.Module):
    """A norm over all heads' output that o_proj does not read straight (it reads a sum)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(32, 32) for _ in range(4))
        self.sub_norm = nn.LayerNorm(32)

    def forward(self, hidden_states):
        out = self.q_proj(hidden_states) * self.k_proj(hidden_states) + self.v_proj(hidden_states)
        return self.o_proj(out + self.sub_norm(out))


class _OutputNormStraight(_OutputNormAttention):
    """BitNet's order: o_proj reads the norm's output."""

    def forward(self, hidden_states):
        out = self.q_proj(hidden_states) * self.k_proj(hidden_states) + self.v_proj(hidden_states)
        return self.o_proj(self.sub_norm(out))


class _IntermediateNormMLP(nn.Module):
    """A norm over the whole intermediate, before the activation (not what down_proj reads straight)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(32, 64), nn.Linear(32, 64)
        self.down_proj = nn.Linear(64, 32)
        self.sub_norm = nn.LayerNorm(64)

    def forward(self, x):
        return self.down_proj(torch.relu(self.sub_norm(self.gate_proj(x))) * self.up_proj(x))


def test_a_whole_norm_not_read_straight_by_the_row_parallel_projection_keeps_the_block_replicated():
    from plangen.plans.families.core import KeptBlock, ShardedBlock, recognize_attention, recognize_mlp
    from plangen.plans.families.dims import ModelDims

    dims = ModelDims(hidden=32, heads=4, kv_heads=4, head_dim=8, vocab=None, experts=None)
    straight = recognize_attention(_OutputNormStraight(), dims)
    assert isinstance(straight, ShardedBlock) and straight.projection_norms == ("sub_norm",)
    kept = recognize_attention(_OutputNormAttention(), dims)
    assert isinstance(kept, KeptBlock) and "not applied straight to a column-parallel projection's output" in kept.why
    mlp = recognize_mlp(_IntermediateNormMLP(), dims)
    assert isinstance(mlp, KeptBlock) and "norm sub_norm spans the whole intermediate activation" in mlp.why


def test_xlms_lists_of_blocks_are_sharded_where_its_loop_calls_them_by_index():
    """XLM's layers are attentions[i], layer_norm1[i], ffns[i], layer_norm2[i] (plangen.plans.synthesis.block_stacks)."""
    from plangen.plans.synthesis.block_stacks import read_indexed_call
    from transformers.models.xlm.modeling_xlm import MultiHeadAttention, TransformerFFN, XLMModel

    model = meta("xlm")
    analysis = analyze_model(model)
    assert analysis.layers_path == "transformer.attentions"
    assert analysis.block_stacks == ("transformer.layer_norm1", "transformer.ffns", "transformer.layer_norm2")
    assert {"transformer.layer_norm1.0", "transformer.layer_norm2.0"} <= set(analysis.norms)
    plan = build_synthesized_plan(model, False)
    attention = _entry(plan, "transformer.attentions.*")
    assert (attention.style, attention.kwargs["head_attributes"]) == ("PrepareAttentionInput", ("n_heads",))
    assert styles_of(plan)["transformer.ffns.*"] == "PrepareModuleInput"
    assert {p: styles_of(plan)[f"transformer.{p}"] for p in ("attentions.*.q_lin", "ffns.*.lin1", "ffns.*.lin2")} == {
        "attentions.*.q_lin": "ColwiseParallel",
        "ffns.*.lin1": "ColwiseParallel",
        "ffns.*.lin2": "RowwiseParallel",
    }
    assert read_indexed_call(XLMModel, "attentions", MultiHeadAttention) == BlockCall(2, None, 1)
    assert read_indexed_call(XLMModel, "ffns", TransformerFFN) == BlockCall(1, None, 1)
    # Its FFN's forward only hands ff_chunk to apply_chunking_to_forward: the readers are ff_chunk's.
    assert read_input_readers(TransformerFFN) == {"lin1"}
    with pytest.raises(ValueError, match="position_embeddings"):
        build_synthesized_plan(model, True)


def test_packed_gate_up_is_re_laid_out_and_packed_qkv_stays_replicated_with_the_reason():
    glm = build_synthesized_plan(meta("glm"), False)  # [gate; up] chunked in two: each rank its slice of both
    gate_up = next(e for e in glm.entries if e.pattern == "model.layers.*.mlp.gate_up_proj")
    assert (gate_up.style, gate_up.kwargs["part_sizes"]) == ("FusedColwiseParallel", (1, 1))
    assert styles_of(glm)["model.layers.*.mlp.down_proj"] == "RowwiseParallel"
    assert styles_of(glm)["model.layers.*.self_attn.q_proj"] == "ColwiseParallel"
    analysis = analyze_model(meta("phi4_multimodal"))  # q|k|v packed: attention kept whole
    assert {k.why.split(" (")[0] for k in analysis.kept if k.group == "attention"} == {
        "packed q|k|v projection qkv_proj"
    }


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen2_moe"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_synthesizer_rederives_every_hand_written_moe_plan(model_type, sequence_parallel):
    model = meta(model_type)
    synthesized = build_synthesized_plan(model, sequence_parallel)
    hand_written = HAND_WRITTEN[type(model).__name__](model, sequence_parallel)
    # Every block reduces its branches' input gradients once (MoeBlockParallel: the experts and a shared
    # expert leave theirs partial, the router's and the shared gate's count once), the synthesizer's too.
    assert entry_set(synthesized) == entry_set(hand_written)
    assert styles_of(synthesized)["model.layers.*.mlp"] == "MoeBlockParallel"
    if model_type == "qwen2_moe":
        assert styles_of(synthesized)["model.layers.*.mlp.shared_expert"] == "PartialGradInput"
    assert styles_of(synthesized)["model.layers.*.mlp.experts"] == "ExpertsParallel"
    assert "router" in why_of(synthesized, "model.layers.*.mlp.gate")


def test_moe_blocks_beside_dense_layers_and_router_scores_passed_through():
    # DeepSeek-V3: dense first layer(s), then MoE with shared experts; MLA attention stays replicated.
    styles = styles_of(build_synthesized_plan(meta("deepseek_v3"), False))
    assert styles["model.layers.0.mlp"] == "PrepareModuleInput" and styles["model.layers.1.mlp"] == "MoeBlockParallel"
    assert styles["model.layers.*.mlp.experts"] == "ExpertsParallel"
    assert styles["model.layers.*.mlp.shared_experts"] == "PartialGradInput"  # the block reduces its input gradient
    assert styles["model.layers.*.mlp.shared_experts.down_proj"] == "RowwiseParallel"
    # gpt-oss: the block returns (hidden, router scores); the scores pass through untouched.
    block = next(e for e in build_synthesized_plan(meta("gpt_oss"), True).entries if e.pattern == "model.layers.*.mlp")
    assert len(block.kwargs["output_layouts"]) == 2 and block.kwargs["output_layouts"][1] is None


@pytest.mark.parametrize("model_type", ["afmoe", "ernie4_5_moe"])
def test_routing_parameters_beside_the_experts_stay_whole_and_the_experts_are_split(model_type):
    # AFMoE: a per-expert routing bias on the block itself; ERNIE-4.5: a router read at the
    # experts' own width.
    styles = styles_of(build_synthesized_plan(meta(model_type), False))
    assert any(p.endswith(".mlp.experts") and s == "ExpertsParallel" for p, s in styles.items()), styles


def test_an_mlp_with_its_own_single_value_stays_whole_saying_where_the_value_may_act():
    # Inkling's dense MLP scales its reduced output by global_scale: summing that gradient over TP (as
    # for a scale of the intermediate's slice) would be wrong, and the reader does not tell the two apart.
    from plangen.plans.families.dims import ModelDims
    from plangen.plans.families.core import recognize_mlp

    class ScaledMlp(nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.up, self.down, self.scale = nn.Linear(8, 16), nn.Linear(16, 8), nn.Parameter(torch.ones(shape))

        def forward(self, x):
            return self.down(torch.relu(self.up(x))) * self.scale

    dims = ModelDims(hidden=8, heads=2, kv_heads=2, head_dim=4, vocab=None, experts=None)
    assert recognize_mlp(ScaledMlp(1), dims).why == (
        "own parameters (scale): the reader does not follow whether they scale the intermediate's slice or the reduced output"
    )
    assert (
        recognize_mlp(ScaledMlp(16), dims).why
        == "own parameters (scale): they see only a slice of the intermediate width"
    )


def test_a_router_mlp_scoring_a_skip_expert_is_a_router_and_its_experts_are_split():
    # Zaya: down_proj to a router state, an MLP, out_proj to experts + 1 classes (a skip expert); the
    # router is whole on every rank, its convolutional attention too (the reason given), the experts split.
    from plangen.plans.families.moe_parts import is_router

    router = meta("zaya").model.layers[1].mlp.gate
    rows, widths = {router.num_experts}, {router.hidden_size}
    assert router.router_mlp.out_proj.out_features == router.num_experts + 1 and is_router(router, rows, widths)
    shared_mlp = nn.Sequential(nn.Linear(router.hidden_size, 64), nn.Linear(64, router.hidden_size))
    assert not is_router(shared_mlp, rows, widths)
    plan = build_synthesized_plan(meta("zaya"), False)
    assert styles_of(plan)["model.layers.*.mlp.experts"] == "ExpertsParallel"
    kept = {r.pattern: r.why for r in plan.replicated}
    assert "router sees every token" in kept["model.layers.*.mlp.gate"]
    assert "state-space / linear-attention mixer" in kept["model.layers.*.self_attn"]


@pytest.mark.parametrize("class_name", ["Qwen3NextForCausalLM", "Qwen4ExpForCausalLM"])
def test_a_shared_expert_as_wide_as_the_expert_count_is_a_shared_expert_not_a_router(class_name):
    # At their default (and Qwen3-Next-80B's released) size the shared expert's intermediate is the
    # expert count, 512: its gate_proj [512, hidden] looked like a router, so it was kept whole while
    # the block reduced it with the experts' partial sums, once per rank (the parity case
    # qwen3_next-shared-as-wide-as-experts: logits off by 5.7e-3 at TP 2).
    from plangen.commands.catalog import build_full_size_model, list_architectures

    arch = next((a for a in list_architectures() if a.class_name == class_name), None)
    if arch is None:
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    model = build_full_size_model(arch)
    skip_unless_pinned_model_code(model)
    mlp = model.model.layers[0].mlp
    assert mlp.shared_expert.gate_proj.out_features == mlp.experts.num_experts == 512
    plan = build_synthesized_plan(model, False)
    styles = styles_of(plan)
    assert styles["model.layers.*.mlp"] == "MoeBlockParallel"
    assert styles["model.layers.*.mlp.shared_expert.gate_proj"] == "ColwiseParallel"
    assert styles["model.layers.*.mlp.shared_expert.down_proj"] == "RowwiseParallel"
    assert [r.pattern for r in plan.replicated if "router" in r.why] == ["model.layers.*.mlp.gate"]


@pytest.mark.parametrize(
    "model_type, pattern",
    [
        # 4 residual streams beside 4 experts (shrunk): block_inject_weight [4, 4 x hidden] is no router.
        ("qwen4_exp", "model.layers.*.attn_hyper_connection"),
        ("deepseek_v4", "model.layers.1.self_attn"),  # its compressor's position_bias [compress ratio 4, 16]
    ],
)
def test_a_matrix_with_as_many_rows_as_experts_does_not_make_a_block_a_mixture_of_experts(model_type, pattern):
    why = why_of(build_synthesized_plan(meta(model_type), False), pattern)
    assert why.startswith("not recognised as attention or MLP"), why


def test_qwen4_exp_and_dots3_note_from_completed_default_configs_get_their_experts_split():
    # Both build only from completed defaults (Qwen4-Exp's indexer, plangen.model.default_configs) or a
    # consistent shrink (Dots3-Note's per-layer MLA sizes); their attention with a sparse indexer stays whole.
    qwen4 = styles_of(build_synthesized_plan(meta("qwen4_exp"), False))
    assert qwen4["model.layers.*.mlp.experts"] == "ExpertsParallel"
    assert qwen4["model.layers.*.mlp.shared_expert.down_proj"] == "RowwiseParallel"
    assert qwen4["model.layers.*.linear_attn"] == "GatedDeltaNetParallel"
    dots3 = build_synthesized_plan(meta("dots3_note"), True)
    assert styles_of(dots3)["model.layers.*.mlp.experts"] == "ExpertsParallel"
    assert styles_of(dots3)["model.layers.*.mlp.shared_experts.down_proj"] == "RowwiseParallel"
    assert styles_of(dots3)["model.layers.0.mlp"] == "PrepareModuleInput"  # its first layer's dense MLP
    assert "not recognised" in why_of(dots3, "model.layers.2.self_attn")


@pytest.mark.parametrize(
    "model_type, why",
    [
        # its experts run on all tokens at once (the hand-written plan's EveryTokenMoeParallel splits them)
        ("llama4", "do not take (hidden, top-k ids, top-k weights)"),
        ("jetmoe", "several experts modules"),
    ],
)
def test_moe_blocks_the_experts_style_cannot_split_stay_replicated_with_the_reason(model_type, why):
    analysis = analyze_model(meta(model_type))
    assert any(why in k.why for k in analysis.kept), [k.why for k in analysis.kept]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_llama4_plan_splits_its_every_token_experts_and_keeps_dense_layers_dense(sequence_parallel):
    from transformers import AutoConfig

    from tiny_configs import TINY

    kwargs = dict(TINY["llama4"])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)  # layer 0 dense, layer 1 MoE
    model = build_meta_model(config, HAND_WRITTEN_CLASS["llama4"])
    plan = HAND_WRITTEN["Llama4ForCausalLM"](model, sequence_parallel)
    styles = styles_of(plan)
    assert styles["model.layers.1.feed_forward"] == "EveryTokenMoeParallel"
    assert (
        styles["model.layers.1.feed_forward.shared_expert.down_proj"] == "RowwiseParallelOwnOutput"
    )  # the block adds into it in place
    assert styles["model.layers.0.feed_forward"] == "PrepareModuleInput"
    assert styles["model.layers.0.feed_forward.down_proj"] == "RowwiseParallel"
    assert not any(p.startswith("model.layers.*.feed_forward") for p in styles)  # never across layer kinds
    assert "routing stays exact" in why_of(plan, "model.layers.1.feed_forward.router")
    # The default config (every layer MoE): one pattern for all layers.
    assert (
        styles_of(HAND_WRITTEN["Llama4ForCausalLM"](meta("llama4"), sequence_parallel))["model.layers.*.feed_forward"]
        == "EveryTokenMoeParallel"
    )


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_norm_on_the_summed_branches_takes_the_partial_sums(sequence_parallel):
    # A.X-K1: DeepSeek-V3's MoE block returning post_mlp_layernorm(experts + shared experts): the
    # partial sums are all-reduced into the norm, and the block's output is already whole.
    plan = build_synthesized_plan(meta("axk1"), sequence_parallel)
    entries = {e.pattern: e for e in plan.entries}
    norm = entries["model.layers.*.mlp.post_mlp_layernorm"]
    assert norm.style == "PrepareModuleInput"
    assert norm.kwargs["input_layouts"] == (Partial(),) and norm.kwargs["desired_input_layouts"] == (Replicate(),)
    assert entries["model.layers.1.mlp"].kwargs["output_layouts"][0] == Replicate()
    assert entries["model.layers.*.mlp.experts"].style == "ExpertsParallel"


def test_a_norm_inside_a_moe_block_not_on_its_output_keeps_it_replicated():
    from plangen.plans.source.forward import read_returned_child

    model = meta("axk1")
    assert read_returned_child(type(model.model.layers[1].mlp)) == "post_mlp_layernorm"
    assert read_returned_child(type(model.model.layers[1].self_attn)) is None  # returns (output, weights)


@pytest.mark.parametrize("model_type", ["granitemoe_swa", "granite_swa"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_attention_sinks_are_split_with_their_heads_by_the_blocks_own_style(model_type, sequence_parallel):
    # One sink logit per query head, a parameter of the attention block itself (gpt-oss's layout):
    # recognised by its shape, split by AttentionSinksParallel as the hand-written gpt-oss plan does.
    model = meta(model_type)
    analysis = analyze_model(model)
    attention = [b for b in analysis.blocks if b.path.endswith("self_attn")]
    assert attention and all(b.block.head_parameters == ("sinks",) for b in attention)
    plan = build_synthesized_plan(model, sequence_parallel)
    assert styles_of(plan)["model.layers.*.self_attn"] == "AttentionSinksParallel"
    assert not any(r.pattern.endswith("self_attn") for r in plan.replicated)


def test_attention_parameters_not_one_per_head_keep_the_block_replicated():
    from plangen.plans.families.core import KeptBlock, recognize_attention
    from plangen.plans.families.dims import read_dims

    model = meta("granitemoe_swa")
    attention = model.model.layers[0].self_attn
    heads = attention.sinks.shape[0]
    attention.sinks = nn.Parameter(torch.empty(heads + 1, device="meta"))
    found = recognize_attention(attention, read_dims(model))
    assert isinstance(found, KeptBlock) and "sinks" in found.why
    # As many heads as a head is wide: a [heads] parameter could as well be one value per feature.
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "granitemoe_swa",
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=8,
        num_hidden_layers=1,
        num_local_experts=4,
        intermediate_size=32,
        vocab_size=128,
    )
    square = build_meta_model(config, type(model))
    found = recognize_attention(square.model.layers[0].self_attn, read_dims(square))
    assert isinstance(found, KeptBlock) and "sinks (8,)" in found.why


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_differential_attention_is_split_by_whole_head_pairs(sequence_parallel):
    # DiffLlama pairs head i with i + H/2 (chunks in two along the heads) and reduces its lambdas
    # ([head_dim] each) to one scalar in sums: q/k/v laid out in two halves, the lambdas replicated
    # with their gradient summed by the block's own style, o_proj a plain row-parallel.
    model = meta("diffllama")
    skip_unless_pinned_model_code(model)
    plan = build_synthesized_plan(model, sequence_parallel)
    entries = {e.pattern: e for e in plan.entries}
    attention = "model.layers.*.self_attn"
    assert entries[attention].style == "PairedHeadsAttentionInput"
    for name in ("q_proj", "k_proj", "v_proj"):
        assert entries[f"{attention}.{name}"].style == "FusedColwiseParallel"
        assert entries[f"{attention}.{name}"].kwargs["part_sizes"] == (1, 1)
    assert entries[f"{attention}.o_proj"].style == "RowwiseParallel"
    assert not any(r.pattern.startswith(attention) for r in plan.replicated)
    found = next(b.block for b in analyze_model(model).blocks if b.path.endswith("self_attn"))
    assert (
        found.shared_parameters == ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2") and found.kv_projections == ()
    )


def test_own_head_width_parameters_without_paired_heads_keep_the_block_replicated():
    # The same [head_dim] parameters in attention that neither halves its heads nor sums them away.
    from plangen.plans.source.paired import read_paired_heads
    from plangen.plans.families.core import KeptBlock, recognize_attention
    from plangen.plans.families.dims import read_dims

    model = meta("diffllama")
    attention = model.model.layers[0].self_attn
    own = frozenset({"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"})
    assert read_paired_heads(type(attention), own)
    assert not read_paired_heads(type(attention), own | {"sinks"})  # a parameter the forward never sums

    class Scaled(nn.Module):
        def forward(self, x):
            a, b = torch.chunk(x, 2, dim=2)
            c, d = x.chunk(2, dim=1)
            return (a - b) * self.lambda_q1 + torch.sum(self.lambda_k1)

    assert not read_paired_heads(Scaled, frozenset({"lambda_q1", "lambda_k1"}))  # lambda_q1 read per feature
    llama = meta("llama")
    block = llama.model.layers[0].self_attn
    block.lambda_q1 = nn.Parameter(torch.empty(block.head_dim, device="meta"))
    found = recognize_attention(block, read_dims(llama))
    assert isinstance(found, KeptBlock) and "lambda_q1" in found.why


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_projections_that_wrap_one_linear_are_sharded_through_it(sequence_parallel):
    # MoshiForCausalLM's q/k/v/o are MoshiLinear(use_flexible_linear=False): one nn.Linear child,
    # nothing else of their own. The inner linear is the projection; names stay Hugging Face's.
    model = meta("moshi")
    skip_unless_pinned_model_code(model)
    styles = styles_of(build_synthesized_plan(model, sequence_parallel))
    attention = "model.layers.*.self_attn"
    assert styles[attention] == "PrepareModuleInput"
    assert {styles[f"{attention}.{p}.linear"] for p in ("q_proj", "k_proj", "v_proj")} == {"ColwiseParallel"}
    assert styles[f"{attention}.o_proj.linear"] == "RowwiseParallel"
    from plangen.model.module_tree import find_unmatched_keys

    assert find_unmatched_keys(model, styles) == []


def test_a_wrapper_with_more_than_one_linear_is_not_a_projection():
    from plangen.plans.families.dims import wrapped_linear

    model = meta("moshi")
    wrapper = model.model.layers[0].self_attn.q_proj
    assert wrapped_linear(wrapper) == ("linear", wrapper.linear)
    wrapper.extra = nn.Linear(2, 2, device="meta")  # two children: what the wrapper computes is its own
    assert wrapped_linear(wrapper) is None
    assert wrapped_linear(nn.Linear(2, 2)) is None
    flexible = model.model.layers[0].self_attn.k_proj
    flexible.linear = nn.Module()  # MoshiFlexibleLinear: one weight per codebook, not an nn.Linear
    flexible.linear.weight = nn.Parameter(torch.empty(2, 4, 4, device="meta"))
    assert wrapped_linear(flexible) is None


def test_heterogeneous_layers_get_per_layer_patterns():
    # Jamba: layer 0 is Mamba + dense MLP, layer 1 attention + MoE; both call their MLP block feed_forward.
    model = meta("jamba")
    plan = build_synthesized_plan(model, False)
    styles = styles_of(plan)
    assert styles["model.layers.0.feed_forward"] == "PrepareModuleInput"  # not layers.*: layer 1's is MoE
    assert "model.layers.*.feed_forward" not in styles
    assert styles["model.layers.*.mamba"] == "Mamba1MixerParallel"  # every layer that holds one
    assert styles["model.layers.1.feed_forward"] == "MoeBlockParallel"
    assert styles["model.layers.*.feed_forward.experts"] == "ExpertsParallel"  # only layer 1 holds experts
    from plangen.model.module_tree import find_unmatched_keys

    assert find_unmatched_keys(model, styles) == []


@pytest.mark.parametrize(
    "model_type, mixer, grad_reduced",
    [
        ("mamba", "backbone.layers.*.mixer", ("x_proj",)),
        ("falcon_mamba", "backbone.layers.*.mixer", ("x_proj",)),  # its dt/B/C norms have no weights
        ("jamba", "model.layers.*.mamba", ("dt_layernorm", "b_layernorm", "c_layernorm")),
    ],
)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mamba1_mixers_are_split_by_channels(model_type, mixer, grad_reduced, sequence_parallel):
    """The mixer's channels over TP (Mamba1MixerParallel), its out_proj row-parallel; the whole
    sequence in under SP (the scan runs over it), reduce-scattered out of out_proj."""
    from torch.distributed.tensor import Replicate, Shard

    plan = build_synthesized_plan(meta(model_type), sequence_parallel)
    entries = {e.pattern: e for e in plan.entries}
    seq = Shard(1) if sequence_parallel else Replicate()
    assert entries[mixer].style == "Mamba1MixerParallel"
    assert entries[mixer].kwargs == {"input_layouts": seq, "grad_reduced": grad_reduced}
    out = entries[f"{mixer}.out_proj"]
    assert out.style == "RowwiseParallel" and out.kwargs["output_layouts"] == seq
    assert not [e for e in plan.entries if e.pattern.startswith(f"{mixer}.") and e is not out]
    assert mixer not in {r.pattern for r in plan.replicated}


def test_mamba1_mixer_with_an_unpaired_norm_stays_whole_and_says_why():
    from plangen.plans.families.registry import recognize_block
    from plangen.plans.families.dims import read_dims

    model = meta("jamba")
    block = model.model.layers[0].mamba
    del block.c_layernorm  # B and C's gradient sums would miss C
    found = recognize_block("mamba", block, read_dims(model))
    assert found.kind == "mixer" and "not one norm each on dt, B and C" in found.why


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_recurrent_gemma_recurrent_blocks_are_split_by_their_rg_lru_heads(sequence_parallel):
    """RecurrentGemma's recurrent block (an MLP's shape: two projections in, one out, which the MLP
    recogniser would keep whole for its conv): linear_x/linear_y column-parallel, the conv's channels
    and the RG-LRU's heads split by the block's and the RG-LRU's own styles, linear_out row-parallel;
    nothing of it left whole."""
    from plangen.plans.families.core import KeptBlock, recognize_mlp
    from plangen.plans.families.dims import read_dims

    model = meta("recurrent_gemma")
    skip_unless_pinned_model_code(model)
    block = model.model.layers[0].temporal_block
    assert isinstance(recognize_mlp(block, read_dims(model)), KeptBlock)  # why it must be recognised first
    plan = build_synthesized_plan(model, sequence_parallel)
    seq = Shard(1) if sequence_parallel else Replicate()
    path = "model.layers.*.temporal_block"
    entries = {e.pattern: e for e in plan.entries if e.pattern.startswith(path)}
    assert {p: e.style for p, e in entries.items()} == {
        path: "GatedDeltaNetParallel",
        f"{path}.linear_x": "ColwiseParallel",
        f"{path}.linear_y": "ColwiseParallel",
        f"{path}.rg_lru": "RGLRUParallel",
        f"{path}.linear_out": "RowwiseParallel",
    }
    mixer = entries[path].kwargs
    assert (mixer["input_layouts"], mixer["head_attributes"], mixer["conv_parts"]) == (
        (seq,),
        ("lru_width", "hidden_size"),
        (1,),
    )
    assert entries[f"{path}.linear_out"].kwargs["output_layouts"] == seq
    assert not [r for r in plan.replicated if "temporal_block" in r.pattern]


def test_recurrent_block_with_another_child_is_not_taken_for_one():
    from plangen.plans.families.dims import read_dims
    from plangen.plans.families.recurrent import recognize_recurrent_block

    model = meta("recurrent_gemma")
    block = model.model.layers[0].temporal_block
    dims = read_dims(model)
    assert recognize_recurrent_block(block, dims).lru == "rg_lru"
    block.extra = nn.Linear(dims.hidden, dims.hidden, device="meta")
    assert recognize_recurrent_block(block, dims) is None


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_xlstm_mlstm_layers_are_split_by_heads(sequence_parallel):
    """xLSTM's mLSTM layer (once "not recognised as attention or MLP"): q/k/v, the output gate and the
    per-head input/forget gates column-parallel, the multi-head norm with its heads, out_proj
    row-parallel, and what its forward reshapes by made this rank's; nothing of it left whole."""
    model = meta("xlstm")
    plan = build_synthesized_plan(model, sequence_parallel)
    seq = Shard(1) if sequence_parallel else Replicate()
    path = "backbone.blocks.*.mlstm_layer"
    entries = {e.pattern: e for e in plan.entries if e.pattern.startswith(path)}
    assert {p: e.style for p, e in entries.items()} == {
        path: "PrepareAttentionInput",
        **{f"{path}.{n}": "ColwiseParallel" for n in ("q", "k", "v", "ogate_preact", "igate_preact", "fgate_preact")},
        f"{path}.multihead_norm": "MultiHeadNormParallel",
        f"{path}.out_proj": "RowwiseParallel",
    }
    layer = entries[path].kwargs
    assert layer["input_layouts"] == (seq, None) and layer["head_attributes"] == ("config.num_heads", "qk_dim", "v_dim")
    assert entries[f"{path}.out_proj"].kwargs["output_layouts"] == seq
    assert not [r for r in plan.replicated if "mlstm_layer" in r.pattern]


def test_mlstm_layer_whose_norm_is_not_per_head_is_not_taken_for_one():
    from plangen.plans.families.dims import read_dims
    from plangen.plans.families.recurrent import recognize_mlstm_layer

    model = meta("xlstm")
    layer, dims = model.backbone.blocks[0].mlstm_layer, read_dims(model)
    assert recognize_mlstm_layer(layer, dims).norm == "multihead_norm"
    layer.multihead_norm.num_heads = 1  # one "head" over all of v: a whole-projection norm
    assert recognize_mlstm_layer(layer, dims) is None


def test_tied_embeddings_are_sharded_at_both_ends_alike():
    model = meta("gemma")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    kwargs = {e.pattern: e for e in build_synthesized_plan(model, False).entries}
    # Vocabulary rows at both ends (Shard(0)), as the tied pair: one parameter without a re-tie.
    assert kwargs["model.embed_tokens"].style == "TiedEmbeddingParallel"
    assert kwargs["lm_head"].style == "TiedHeadParallel"
    untied = meta("llama")
    kwargs = {e.pattern: e for e in build_synthesized_plan(untied, False).entries}
    assert (kwargs["model.embed_tokens"].style, kwargs["lm_head"].style) == ("RowwiseParallel", "ColwiseParallel")


def test_nothing_recognised_is_a_one_line_error_with_the_reason():
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel: no synthesized plan: .*Conv1D") as err:
        build_synthesized_plan(meta("gpt2"), False)
    assert "\n" not in str(err.value)


# --- resolution and the seed for plangen init --------------------------------------------------


@pytest.fixture
def proven(monkeypatch):
    """Replace the sweep's records: {class: record}."""
    from conftest import set_proofs

    return set_proofs(monkeypatch, {})


def test_runtime_uses_a_synthesized_plan_only_where_it_is_proven(proven):

    model = meta("olmo")
    proven["OlmoForCausalLM"] = {"plan": "hf", "tp": True, "sp": None, "error": None}  # only its HF plan proven
    assert choose_plan(model, False).source == "hf"  # synthesized not proven: its Hugging Face plan
    with pytest.raises(NoPlanError, match="OlmoForCausalLM has no hand-written or proven synthesized plan"):
        choose_plan(model, True)
    proven["OlmoForCausalLM"] = {"plan": "synthesized", "tp": True, "sp": True, "error": None}
    for sp in (False, True):
        resolved = choose_plan(model, sp)
        assert resolved.source == "synthesized"
        assert resolved.styles.keys() == build_parallel_styles(build_synthesized_plan(model, sp)).keys()


def test_no_plan_at_all_points_to_plangen_init(proven):

    proven["MptForCausalLM"] = {"plan": "synthesized", "tp": False, "sp": None, "error": "tp: differs"}
    with pytest.raises(
        NoPlanError, match=r"no plan for MptForCausalLM at TP>1: write a custom plan with `plangen init MptForCausalLM`"
    ):
        choose_plan(meta("mpt"), False)  # its synthesized plan failed the check on this code


def test_a_synthesized_plan_proven_on_other_code_points_to_plangen_prove(monkeypatch, tmp_path):
    # A proof of the class's plan on another release's code (another digest) proves nothing here:
    # the runtime refuses the plan and names the command that proves it on this code; once run
    # (its record in the user's proofs file), the runtime uses it.
    import plangen.plans.proven as P

    model = meta("mpt")
    code = P.code_digest(model)
    shipped = {"MptForCausalLM": {"0" * 16: {"plan": "synthesized", "tp": True, "sp": None, "error": None}}}
    monkeypatch.setattr(P, "load_shipped_proofs", lambda: shipped)
    monkeypatch.setenv(P.PROOFS_ENV, str(tmp_path / "proofs.json"))
    message = (
        r"no plan for MptForCausalLM proven on the installed model code at TP>1: the synthesized plan of "
        r"MptForCausalLM is proven only on other model code than transformers [\d.]+'s: prove it on this code with "
        r"`plangen prove MptForCausalLM`"
    )
    with pytest.raises(NoPlanError, match=message):
        choose_plan(model, False)
    from plangen.commands.prove import record_user_proof

    record_user_proof("MptForCausalLM", code, {"plan": "synthesized", "tp": True, "sp": None, "error": None})
    assert choose_plan(model, False).source == "synthesized"
    assert P.proof_status(P.load_proven()["MptForCausalLM"], code) == P.PROVEN_HERE


def build_seed_plan(model, sequence_parallel):
    return choose_plan(model, sequence_parallel, allow_unproven=True)


def test_seed_plan_order(proven):
    assert build_seed_plan(meta("llama"), True).source == "hand-written"
    assert build_seed_plan(meta("olmo"), False).source == "hf"
    proven["OlmoForCausalLM"] = {"plan": "synthesized", "tp": True, "sp": False, "error": None}
    assert build_seed_plan(meta("olmo"), False).source == "synthesized"
    # No Hugging Face plan: the unproven synthesized plan is the best start there is.
    assert build_seed_plan(meta("mpt"), False).source == "synthesized"
    with pytest.raises(ValueError, match="no plan for XLMWithLMHeadModel"):  # its layers are parallel lists
        build_seed_plan(meta("xlm"), True)
    with pytest.raises(ValueError, match="GPT2LMHeadModel: no sequence-parallel plan"):  # hand-written, TP only
        build_seed_plan(meta("gpt2"), True)


def test_proven_records_ship_with_the_package():
    from plangen.plans.proven import code_digest

    data = json.loads(resources.files("plangen.plans").joinpath("proven.json").read_text())
    assert data["format"] == 2
    records = data["classes"]
    olmo = records["OlmoForCausalLM"][code_digest(meta("olmo"))]  # the record for the installed code
    shown = {k: v for k, v in olmo.items() if k not in ("fingerprint", "transformers", "torch")}
    assert shown == {"plan": "synthesized", "tp": True, "sp": True, "error": None}
    assert set(olmo["fingerprint"]) == {"tp", "sp"}  # the plans it proved (plangen.plans.proven.plan_fingerprint)
    # It names the release it ran on: the installed one (5.24.0 and 2.13.0 on the pinned pair).
    assert transformers.__version__ in olmo["transformers"] and torch.__version__.split("+")[0] in olmo["torch"]
    assert all(
        set(r) >= {"plan", "tp", "sp", "error", "transformers", "torch"}
        for codes in records.values()
        for r in codes.values()
    )


# --- communication: a synthesized plan at the Megatron minimum, counted exactly ------------------

AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"


def count_step(model_type: str, layers: int, sequence_parallel: bool):
    from torch.distributed.device_mesh import DeviceMesh

    from plangen.distributed.comm import CollectiveCounter, merge_c10d_counts
    from plangen.loss import vocab_parallel_cross_entropy
    from plangen.parallelize import apply_tp, resolve_tied_styles

    resolved = resolve_model(model_type)
    config = shrink_config(resolved.config, 2)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = resolved.model_class._from_config(config)
    styles = build_parallel_styles(build_synthesized_plan(model, sequence_parallel))
    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), resolve_tied_styles(model, styles))
    ids = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with CollectiveCounter() as forward:
        logits = model(input_ids=ids).logits
    loss = vocab_parallel_cross_entropy(logits, ids)
    with CollectiveCounter() as backward:
        loss.backward()
    return merge_c10d_counts(forward.counts()), merge_c10d_counts(backward.counts())


def per_layer(model_type: str, sequence_parallel: bool):
    f2, b2 = count_step(model_type, 2, sequence_parallel)
    f4, b4 = count_step(model_type, 4, sequence_parallel)
    diff = lambda a, b: {k: (b.get(k, 0) - a.get(k, 0)) // 2 for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    return diff(f2, f4), diff(b2, b4), f2, b2


def test_synthesized_tensor_parallel_costs_two_all_reduces_per_layer(fake_pg):
    forward, backward, total_forward, total_backward = per_layer("olmo", False)
    assert forward == {AR: 2} and backward == {AR: 2}  # one input-gradient reduction per block
    # Fixed: the embedding's all-reduce forward, the head's input-gradient reduction backward.
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}


def test_synthesized_sequence_parallel_gathers_once_per_block(fake_pg):
    forward, backward, total_forward, total_backward = per_layer("olmo", True)
    assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2}
    # Fixed: the embedding reduce-scatters into the sequence-sharded stream, the head gathers it.
    assert total_forward == {AG: 2 * 2 + 1, RS: 2 * 2 + 1}
    assert total_backward == {AG: 2 * 2 + 1, RS: 2 * 2 + 1}


def test_moe_under_sequence_parallel_gathers_once_per_block(fake_pg):
    # Attention and the MoE block each gather the sequence in and reduce-scatter out; backward, each
    # reduce-scatters its input gradient (the MoE block's: the experts' partial, MoeBlockParallel),
    # and the routing weights' gradient is all-reduced (tests/test_comm_counts.py).
    forward, backward, _, _ = per_layer("qwen3_moe", True)
    assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2, AR: 1}


# --- multi-head latent attention -------------------------------------------------------------------


def _attention_part(plan) -> tuple[set, set]:
    return (
        {e for e in entry_set(plan) if ".self_attn" in e[0]},
        {(r.pattern, r.why) for r in plan.replicated if ".self_attn" in r.pattern},
    )


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2", "deepseek_v2-lite"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_synthesizer_rederives_the_hand_written_latent_attention(model_type, sequence_parallel):
    if model_type == "deepseek_v2-lite":  # no query latent: q_proj reads the hidden state
        from tiny_configs import build_tiny

        model = build_tiny("deepseek_v2")
    else:
        model = meta(model_type)
    synthesized = build_synthesized_plan(model, sequence_parallel)
    hand_written = HAND_WRITTEN[type(model).__name__](model, sequence_parallel)
    assert _attention_part(synthesized) == _attention_part(hand_written)
    query = "q_proj" if model_type.endswith("lite") else "q_b_proj"
    assert styles_of(synthesized)[f"model.layers.*.self_attn.{query}"] == "ColwiseParallel"
    assert styles_of(synthesized)["model.layers.*.self_attn"] == "MlaAttentionParallel"


@pytest.mark.parametrize("model_type", ["minicpm3", "glm4_moe_lite", "mistral4", "youtu"])
def test_classes_with_deepseeks_latent_attention_get_it_sharded_by_heads(model_type):
    plan = build_synthesized_plan(meta(model_type), False)
    styles = styles_of(plan)
    assert styles["model.layers.*.self_attn"] == "MlaAttentionParallel"
    assert styles["model.layers.*.self_attn.kv_b_proj"] == "ColwiseParallel"
    assert styles["model.layers.*.self_attn.o_proj"] == "RowwiseParallel"


# Every class with transformers' MLA modules, and the share of its parameters the latent down-projections
# and their norms hold at its default size (q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm).
LATENT_DOWN_SHARES = {
    "youtu": 0.0706,
    "minicpm3": 0.0412,
    "deepseek_v2": 0.0072,
    "glm4_moe_lite": 0.0043,
    "hy_v4": 0.0035,
    "axk2": 0.0026,
    "axk1": 0.0018,
    "glm_moe_dsa": 0.0017,
    "mistral4": 0.0017,
    "dots3_note": 0.0017,
    "deepseek_v3": 0.0014,
    "deepseek_v32": 0.0014,
    "longcat_flash": 0.0010,
    "kimi_linear": 0.0002,
    "bailing_hybrid": 0.0001,
}


def longcat_experts_hold_no_identity_rows() -> bool:
    """transformers 5.25.0's LongCat-Flash experts hold the real experts only (the block computes the
    identity ones: plangen.stack.transformers_compat.block_identity_experts); 5.24.0's gate_up_proj also has
    rows for the identity experts."""
    from plangen.stack.transformers_compat import block_identity_experts

    return bool(block_identity_experts(meta("longcat_flash").model.layers[0].mlp))


def test_the_query_latent_is_split_where_the_down_projections_miss_the_goal_alone():
    """The rule (plangen.plans.families.latent.shards_query_latent): Youtu's latent down-projections hold 7.1 % of
    it, more than the 5 % issue 11's goal leaves whole, so its query latent is split; MiniCPM3 (4.1 %)
    and every MoE MLA class keep theirs whole."""
    from plangen.plans.families.latent import LEFT_WHOLE_ALLOWANCE, latent_down_share, shards_query_latent

    from absent import has_model

    shares = dict(LATENT_DOWN_SHARES)
    measured = set()  # classes whose other code's share is known
    if longcat_experts_hold_no_identity_rows():
        shares["longcat_flash"] = 0.0013  # transformers 5.25.0: [E, 2I, H] experts, fewer parameters
        measured.add("longcat_flash")
    for model_type, share in shares.items():
        if not has_model(model_type) or (
            differs_from_pinned_model_code(meta(model_type)) and model_type not in measured
        ):
            continue  # a class the installed transformers lacks, or other code (its defaults with it)
        assert latent_down_share(model_type) == pytest.approx(share, abs=5e-5), model_type
    assert {t for t, share in LATENT_DOWN_SHARES.items() if share > LEFT_WHOLE_ALLOWANCE} == {"youtu"}
    # Decided for the class at its default size, whatever size the model at hand has (the sweep's shrunk one).
    tiny = meta("youtu")
    assert tiny.config.q_lora_rank < 64 and shards_query_latent(tiny.config)
    assert not has_model("minicpm3") or not shards_query_latent(meta("minicpm3").config)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_youtu_splits_its_query_latent_and_keeps_the_kv_latent_whole(sequence_parallel):
    plan = build_synthesized_plan(meta("youtu"), sequence_parallel)
    styles, attention = styles_of(plan), "model.layers.*.self_attn"
    assert {p: s for p, s in styles.items() if p.startswith(attention)} == {
        attention: "MlaAttentionParallel",
        f"{attention}.q_a_proj": "ColwiseParallel",
        f"{attention}.q_a_layernorm": "ShardedNormParallel",
        f"{attention}.q_b_proj": "ColwiseParallel",
        f"{attention}.kv_b_proj": "ColwiseParallel",
        f"{attention}.o_proj": "RowwiseParallel",
    }
    kwargs = {e.pattern: e.kwargs for e in plan.entries}
    assert kwargs[attention]["sharded_query_latent"] is True
    assert kwargs[f"{attention}.q_b_proj"]["input_layouts"] == Shard(-1)  # the latent all-gathered
    assert {r.pattern for r in plan.replicated if r.pattern.startswith(attention)} == {
        f"{attention}.kv_a_proj_with_mqa",
        f"{attention}.kv_a_layernorm",
    }
    # MiniCPM3, below the rule: its query latent whole, as the MLA layout keeps it.
    minicpm3 = build_synthesized_plan(meta("minicpm3"), sequence_parallel)
    assert "sharded_query_latent" not in {e.pattern: e.kwargs for e in minicpm3.entries}[attention]
    assert f"{attention}.q_a_proj" in {r.pattern for r in minicpm3.replicated}


def test_latent_attention_with_a_sparse_indexer_stays_whole():
    # DeepSeek-V3.2's indexer reads the query latent and picks keys: not part of the split by heads.
    plan = build_synthesized_plan(meta("deepseek_v32"), False)
    assert not any(".self_attn" in e.pattern for e in plan.entries)
    assert "not recognised" in why_of(plan, "model.layers.*.self_attn")


# --- packed q|k|v projections: split as the forward splits them (plangen.plans.source.packed) -----


def _entry(plan, pattern: str):
    return next(e for e in plan.entries if e.pattern == pattern)


def test_packed_qkv_viewed_per_head_is_plain_column_parallel():
    # GPT-NeoX views query_key_value as [..., -1 heads, 3 x head_size] and chunks inside each head:
    # a plain Shard(0) gives each rank whole heads, nothing to re-lay out or to make local.
    neox, codegen_model = meta("gpt_neox"), meta("codegen")
    skip_unless_pinned_model_code(neox)
    skip_unless_pinned_model_code(codegen_model)
    plan = build_synthesized_plan(neox, False)
    attention = "gpt_neox.layers.*.attention"
    assert _entry(plan, f"{attention}.query_key_value").style == "ColwiseParallel"
    assert _entry(plan, f"{attention}.dense").style == "RowwiseParallel"
    assert _entry(plan, attention).style == "PrepareModuleInput"
    # CodeGen: mp_num blocks of [q; v; k], viewed as [..., -1 blocks, 3 x embed_dim // mp_num].
    codegen = build_synthesized_plan(codegen_model, True)
    assert _entry(codegen, "transformer.h.*.attn.qkv_proj").style == "ColwiseParallel"
    assert _entry(codegen, "transformer.h.*.attn").style == "PrepareModuleInput"


def test_packed_qkv_viewed_by_head_counts_makes_them_local():
    # Persimmon views it as [b, s, self.num_heads, 3, head_dim] inside a helper (_split_heads) and
    # indexes [..., i, :]; its q/k LayerNorms are one head wide.
    plan = build_synthesized_plan(meta("persimmon"), True)
    attention = "model.layers.*.self_attn"
    heads = _entry(plan, attention)
    assert (heads.style, heads.kwargs["head_attributes"]) == ("PrepareAttentionInput", ("num_heads",))
    assert _entry(plan, f"{attention}.query_key_value").style == "ColwiseParallel"
    assert _entry(plan, f"{attention}.q_layernorm").style == "ReplicatedWithGradAllReduce"


def test_packed_qkv_chunked_into_parts_is_re_laid_out():
    from plangen.plans.families.dims import read_dims
    from plangen.plans.families.packed import recognize_packed_attention

    model = meta("mpt")  # Wqkv(x).chunk(3, dim=2): [q; k; v] one after another
    block = recognize_packed_attention(model.transformer.blocks[0].attn, read_dims(model))
    assert block.fused == (("Wqkv", (1, 1, 1)),) and block.head_attributes == ("n_heads",)


def test_multi_query_packed_qkv_shards_the_query_heads_and_shares_the_kv_head():
    from tiny_configs import build_tiny

    # GPT-BigCode's split((embed_dim, kv_dim, kv_dim)): the query width made local, kv_dim kept whole.
    plan = build_synthesized_plan(meta("gpt_bigcode"), False)
    c_attn = _entry(plan, "transformer.h.*.attn.c_attn")
    assert (c_attn.style, c_attn.kwargs["part_sizes"], c_attn.kwargs["shared_parts"]) == (
        "MultiQueryColwiseParallel",
        (12, 1, 1),
        (1, 2),
    )
    attn = _entry(plan, "transformer.h.*.attn")
    # num_heads is read only in the multi-head branch, which a multi-query block never takes: not divided.
    assert (attn.style, attn.kwargs["head_attributes"]) == ("PrepareAttentionInput", ("embed_dim",))
    assert _entry(plan, "transformer.h.*.attn.c_proj").style == "RowwiseParallel"
    # Falcon's multi-query view(b, s, num_heads + 2, head_dim), then [..., :-2, :]: query heads first.
    from conftest import falcon_attention_left_whole

    plan = build_synthesized_plan(build_tiny("falcon-mqa"), True)
    if falcon_attention_left_whole() is not None:  # transformers 5.25.0's form, not read: kept whole
        assert "transformer.h.*.self_attention" in {r.pattern for r in plan.replicated}
        return
    qkv = _entry(plan, "transformer.h.*.self_attention.query_key_value")
    assert (qkv.style, qkv.kwargs["part_sizes"], repr(qkv.kwargs["input_layouts"])) == (
        "MultiQueryColwiseParallel",
        (4, 1, 1),
        "Replicate()",
    )
    assert _entry(plan, "transformer.h.*.self_attention").kwargs["head_attributes"] == ("num_heads",)


def test_multi_query_attention_with_an_odd_head_count_is_padded():
    # Falcon-7B's 71 query heads, which no even TP size divides: padded with zero heads when applied
    # (plangen.styles.padded_heads), at full size and shrunk (5 heads: plangen.model.shrink keeps the count odd).
    from conftest import falcon_attention_left_whole
    from plangen.commands.catalog import build_full_size_model, list_architectures

    if (why := falcon_attention_left_whole(meta("falcon"))) is not None:
        pytest.skip(why)
    arch = next(a for a in list_architectures() if a.class_name == "FalconForCausalLM")
    for model in (meta("falcon"), build_full_size_model(arch)):
        plan = build_synthesized_plan(model, False)
        attention = _entry(plan, "transformer.h.*.self_attention")
        assert (attention.style, attention.kwargs["padded_heads"], attention.kwargs["head_attributes"]) == (
            "PrepareAttentionInput",
            True,
            ("num_heads",),
        )
        assert _entry(plan, "transformer.h.*.self_attention.query_key_value").style == "MultiQueryColwiseParallel"
    # 5.24.0 counts Falcon-7B's KV heads as its query heads (5 and 5 shrunk); 5.25.0 counts one, and
    # the shrunk model keeps the 71:1 ratio (71 heads, still odd).
    assert meta("falcon").config.num_attention_heads in (5, 71)
    # A head count that divides needs no pad: the 4-head tiny Falcon's plan does not pad.
    from tiny_configs import build_tiny

    plan = build_synthesized_plan(build_tiny("falcon-mqa"), False)
    assert "padded_heads" not in _entry(plan, "transformer.h.*.self_attention").kwargs


def test_shrinking_an_odd_head_count_no_padded_layout_fits_is_a_one_line_error():
    # Falcon-7B's 71 heads shrink to an odd count that still pads at the TP size (31 at TP 16); at
    # TP 128 every rank would hold a pad head only: refused with the largest legal size, not StopIteration.
    from plangen.model.heads import head_counts

    resolved = resolve_model("falcon")
    if head_counts(resolved.config) != (71, 71):
        pytest.skip(
            f"the installed FalconConfig counts Falcon-7B's heads as {head_counts(resolved.config)} (transformers "
            "5.25.0 adds num_key_value_heads, 1 for multi-query; 5.24.0 has none, so the query count): the "
            "shrunk model keeps the 71:1 ratio, no odd count to shrink to"
        )
    assert shrink_config(resolved.config, 16).num_attention_heads == 31
    with pytest.raises(ValueError, match="the largest legal TP size for this model is 71"):
        shrink_config(resolved.config, 128)


def test_a_per_head_bias_stacked_with_the_batch_rows_is_cut_by_the_attentions_input_style():
    # Bloom builds its ALiBi bias for all heads from the attention mask, [batch x heads, 1, seq], and hands
    # it to every layer, which hands it on to its attention as alibi=: no plain slice is one rank's heads.
    model = meta("bloom")
    for sp in (False, True):
        plan = build_synthesized_plan(model, sp)
        attention = _entry(plan, "transformer.h.*.self_attention")
        assert attention.style == "PrepareAttentionInput"
        assert (attention.kwargs["head_attributes"], attention.kwargs["batch_head_inputs"]) == (
            ("num_heads",),
            ("alibi",),
        )
        assert _entry(plan, "transformer.h.*.self_attention.query_key_value").style == "ColwiseParallel"  # whole heads
        assert _entry(plan, "transformer.h.*.self_attention.dense").style == "RowwiseParallel"
        assert not [e for e in plan.entries if e.pattern == "transformer.h.*"]  # not MPT's slice of the layer's input
    assert analyze_model(model).sequence_parallel


def test_a_replicated_block_returning_its_own_parameter_hands_it_out_as_a_dtensor_under_sp():
    # GPT-NeoX-Japanese's last attention (kept whole: its dense_bias) returns dense_bias, which its layer
    # adds to the sequence-sharded output: a plain tensor there met a DTensor (aten.add.Tensor got mixed ...).
    model = meta("gpt_neox_japanese")
    last = f"gpt_neox_japanese.layers.{len(model.gpt_neox_japanese.layers) - 1}.attention"
    kept = _entry(build_synthesized_plan(model, True), last)
    assert kept.style == "PrepareModuleInputOutput"
    assert kept.kwargs["output_layouts"] == (Replicate(), None, Replicate())  # attn_weights (None) passes through
    assert "hands out the parameters it returns as Replicate DTensors" in kept.why


def test_a_token_embedding_added_to_a_buffer_the_model_indexes_has_no_sp_with_the_reason():
    # CTRL: hidden_states = inputs_embeds + self.pos_encoding[position_ids, :] + ..., in CTRLModel's forward.
    analysis = analyze_model(meta("ctrl"))
    assert not analysis.sequence_parallel
    assert analysis.sp_problems[0] == (
        "the token embedding is added to pos_encoding, a buffer CTRLModel indexes in its "
        "own forward, where no style can lay the sum out on sequence shards"
    )


def test_bloom_hands_its_layers_the_same_alibi_layout_without_a_mask():
    # The probe reads build_alibi_tensor (a mask given); without one Bloom builds it inline
    # (slopes x arange, repeated per batch row): the same [batch x heads, 1, seq] rows, so one cut fits both.
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(hidden_size=32, n_head=4, n_layer=1, vocab_size=64)).eval()
    seen = []
    model.transformer.h[0].register_forward_pre_hook(lambda m, a, k: seen.append(k["alibi"]), with_kwargs=True)
    ids = torch.randint(0, 64, (3, 5))
    with torch.no_grad():
        model(input_ids=ids)
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert seen[0].shape == (12, 1, 5) and torch.equal(seen[0], seen[1])


class _Biased(nn.Module):
    """The module holding the layers, building a per-head bias from the mask as Bloom does, its rows
    stacked batch row by batch row, or head by head (``head_major``)."""

    def __init__(self, head_major: bool):
        super().__init__()
        self.num_heads, self.head_major = 4, head_major
        self.layers = nn.ModuleList([nn.Identity()])

    def build_bias(self, attention_mask, num_heads, dtype):
        bias = attention_mask.cumsum(-1)[:, None, None, :] * torch.arange(1.0, num_heads + 1)[None, :, None, None]
        bias = bias.transpose(0, 1) if self.head_major else bias
        return bias.reshape(-1, 1, attention_mask.shape[-1]).to(dtype)

    def forward(self, hidden_states, attention_mask):
        bias = self.build_bias(attention_mask, self.num_heads, dtype=hidden_states.dtype)
        for layer in self.layers:
            hidden_states = layer(hidden_states, bias=bias)
        return hidden_states


def test_a_bias_builder_taking_the_mask_is_read_off_a_probe_mask():
    from plangen.plans.families.per_head_inputs import PerHeadInput, read_per_head_arguments

    found = read_per_head_arguments(_Biased(head_major=False), {4})
    assert found == PerHeadInput("bias", 0, "self.build_bias(self.num_heads, ...)", batch_major=True)
    # Its rows head by head: cutting each batch row's heads' rows would hand a rank other rows' bias.
    assert read_per_head_arguments(_Biased(head_major=True), {4}) == "self.build_bias(self.num_heads, ...)"


def test_a_per_head_bias_built_for_all_heads_is_sliced_to_each_ranks_heads():
    # MPT: position_bias = self.build_mpt_alibi_tensor(self.num_heads, ...), [heads, 1, seq], handed to
    # every layer by keyword; its builder, on the meta device, shows the head dimension.
    plan = build_synthesized_plan(meta("mpt"), True)
    layer = _entry(plan, "transformer.blocks.*")
    assert layer.style == "PrepareModuleInput"
    assert layer.kwargs["desired_input_kwarg_layouts"] == {"position_bias": torch.distributed.tensor.Shard(0)}
    assert layer.kwargs["input_layouts"] is None  # the hidden state passes untouched
    wqkv = _entry(plan, "transformer.blocks.*.attn.Wqkv")
    assert (wqkv.style, wqkv.kwargs["part_sizes"]) == ("FusedColwiseParallel", (1, 1, 1))


class _Packed(nn.Module):
    """A packed attention under other names, viewed as [b, s, heads + 2, head_dim] (multi-query)."""

    def __init__(self, hidden=64, heads=4, head_dim=16, multi_query=True):
        super().__init__()
        self.heads, self.head_dim, self.multi_query = heads, head_dim, multi_query
        self.mix = nn.Linear(hidden, (heads + 2) * head_dim if multi_query else 3 * hidden)
        self.back = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        packed = self.mix(x)
        if self.multi_query:
            packed = packed.view(b, s, self.heads + 2, self.head_dim)
            q, k, v = packed[..., :-2, :], packed[..., [-2], :], packed[..., [-1], :]
        else:
            packed = packed.view(b, s, self.heads, 3, self.head_dim)
            q, k, v = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
        scores = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2), -1)
        return self.back((scores @ v.transpose(1, 2)).transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def test_packed_reader_follows_the_forward_not_the_names():
    from plangen.plans.source.packed import PackedSplit, Refused, read_packed_split

    mqa = read_packed_split(_Packed(), "mix", 96, {4, 1}, 16)  # one k and one v head after every q head
    assert mqa == PackedSplit("parts", parts=(64, 16, 16), head_attributes=("heads",))
    # Not one head each (the groups 8 features wide, the head 16): split across the groups, refused.
    assert isinstance(read_packed_split(_Packed(), "mix", 96, {4, 1}, 8), Refused)
    mha = read_packed_split(_Packed(multi_query=False), "mix", 192, {4})  # the dead branch is left out
    assert mha == PackedSplit("groups", groups=4, head_attributes=("heads",))


class _PackedByHeadsThenSplit(nn.Module):
    """transformers 5.25's Falcon attention under other names: the packed output viewed as heads by a
    shape held in a local, then split on the heads dim (multi-query) or viewed again as KV groups."""

    def __init__(self, hidden=64, heads=4, kv=1, head_dim=16, grouped=False):
        super().__init__()
        self.heads, self.kv, self.head_dim, self.grouped = heads, kv, head_dim, grouped
        self.mix = nn.Linear(hidden, (heads + 2 * kv) * head_dim)
        self.back = nn.Linear(hidden, hidden)

    def forward(self, x):
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        packed = self.mix(x).view(hidden_shape)
        if self.grouped:
            groups = packed.view(*input_shape, self.kv, -1, self.head_dim)
            q, k, v = groups[..., :-2, :].flatten(-3, -2), groups[..., -2, :], groups[..., -1, :]
        else:
            q, k, v = packed.split([self.heads, 1, 1], dim=-2)
        scores = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2), -1)
        return self.back((scores @ v.transpose(1, 2)).transpose(1, 2).reshape(*input_shape, -1))


def test_packed_reader_follows_a_split_on_the_heads_dim_and_a_second_view():
    """Multi-query: the query heads, then one key and one value head, split on the heads dim; GQA:
    viewed again as KV groups, its -1 what the features leave (3 heads of a group: 1 query, k, v).
    The KV count read in the GQA branch is no shape of the multi-query block, whose branch is dead."""
    from plangen.plans.source.packed import PackedSplit, read_packed_split

    mqa = read_packed_split(_PackedByHeadsThenSplit(), "mix", 96, {4, 1}, 16)
    assert mqa == PackedSplit("parts", parts=(64, 16, 16), head_attributes=("heads",))
    gqa = read_packed_split(_PackedByHeadsThenSplit(kv=2, grouped=True), "mix", 128, {4, 2}, 16)
    assert gqa == PackedSplit("groups", groups=2, head_attributes=("kv",))


def test_a_block_output_the_layer_modifies_in_place_gets_a_copy():
    from plangen.plans.source.forward import read_modified_in_place

    model = meta("falcon")  # parallel attention: mlp_output += attention_output
    assert read_modified_in_place(type(model.transformer.h[0])) == {"mlp"}
    assert (
        _entry(build_synthesized_plan(model, False), "transformer.h.*.mlp.dense_4h_to_h").style
        == "RowwiseParallelOwnOutput"
    )
    # Under SP the output stays a DTensor (no view handed out): torch's style as it is.
    assert _entry(build_synthesized_plan(model, True), "transformer.h.*.mlp.dense_4h_to_h").style == "RowwiseParallel"


@pytest.mark.parametrize(
    ("model_type", "embedding", "owner"),
    [("ctrl", "transformer.w", "transformer"), ("git", "git.embeddings.word_embeddings", "git.embeddings")],
)
def test_an_embedding_output_the_model_modifies_in_place_gets_a_copy(model_type, embedding, owner):
    """CTRL scales its token embedding in place (inputs_embeds *= sqrt(d)), Git adds the positions
    into it (embeddings += position_embeddings): torch's row-parallel output is to_local's view."""
    from plangen.plans.source.forward import read_modified_in_place

    model = meta(model_type)
    assert embedding.rpartition(".")[2] in read_modified_in_place(type(model.get_submodule(owner)))
    assert _entry(build_synthesized_plan(model, False), embedding).style == "RowwiseParallelOwnOutput"
    assert _entry(build_synthesized_plan(meta("llama"), False), "model.embed_tokens").style == "RowwiseParallel"


def test_attention_inside_a_thin_wrapper_is_sharded_by_heads_where_the_wrapper_calls_it():
    # GPT-Neo: attn (GPTNeoAttention) hands its input to attn.attention (q/k/v/out_proj), whose
    # _split_heads(query, self.num_heads, self.head_dim) shapes by the module's head count.
    plan = build_synthesized_plan(meta("gpt_neo"), False)
    inner = "transformer.h.*.attn.attention"
    assert (_entry(plan, inner).style, _entry(plan, inner).kwargs["head_attributes"]) == (
        "PrepareAttentionInput",
        ("num_heads",),
    )
    assert {_entry(plan, f"{inner}.{p}").style for p in ("q_proj", "k_proj", "v_proj")} == {"ColwiseParallel"}
    assert (
        repr(_entry(plan, f"{inner}.q_proj").kwargs["input_layouts"]) == "Replicate()"
    )  # prepared once, where the wrapper calls it
    assert _entry(plan, f"{inner}.out_proj").style == "RowwiseParallel"


def test_packed_qkv_grouped_per_kv_head_makes_both_head_counts_local():
    from tiny_configs import build_tiny

    # Falcon-40B's layout: view(b, s, -1, num_heads // num_kv_heads + 2, head_dim), split inside each
    # KV group; num_heads and num_kv_heads only as a ratio there (kept when both are divided) and
    # num_heads again in later reshapes: both made local, whole groups per rank. transformers 5.25.0
    # views it by num_kv_heads alone (view(*shape, num_kv_heads, -1, head_dim)); num_heads is read
    # only in its multi-query branch, which this block never takes.
    from conftest import falcon_attention_left_whole

    if (why := falcon_attention_left_whole(build_tiny("falcon-gqa"))) is not None:
        pytest.skip(why)
    plan = build_synthesized_plan(build_tiny("falcon-gqa"), False)
    heads = _entry(plan, "transformer.h.*.self_attention")
    from transformers.models.falcon.modeling_falcon import FalconAttention

    grouped_view_alone = "view(*input_shape, self.num_kv_heads, -1" in inspect.getsource(FalconAttention.forward)
    expected = ("num_kv_heads",) if grouped_view_alone else ("num_heads", "num_kv_heads")
    assert (heads.style, heads.kwargs["head_attributes"]) == ("PrepareAttentionInput", expected)
    assert _entry(plan, "transformer.h.*.self_attention.query_key_value").style == "ColwiseParallel"


# --- BART-family decoders: cross-attention's alias, fc1/fc2 in the layer, head counts, positions --------


@pytest.mark.parametrize(
    "model_type, layers",
    [
        ("bart", "model.decoder.layers.*"),
        ("xglm", "model.layers.*"),
        ("biogpt", "biogpt.layers.*"),
        ("whisper", "model.decoder.layers.*"),
        ("musicgen", "model.decoder.layers.*"),
    ],
)
def test_bart_family_attention_and_the_layer_level_mlp_are_sharded(model_type, layers):
    styles = styles_of(build_synthesized_plan(meta(model_type), False))
    for proj in ("q_proj", "k_proj", "v_proj"):  # k/v read `current_states`, the input under self-attention
        assert styles[f"{layers}.self_attn.{proj}"] == "ColwiseParallel"
    assert styles[f"{layers}.self_attn.out_proj"] == "RowwiseParallel"
    # No block around fc1/fc2: fc1 takes the layer's hidden state itself (one gradient reduction).
    assert (styles[f"{layers}.fc1"], styles[f"{layers}.fc2"]) == ("ColwiseParallel", "RowwiseParallel")
    assert f"{layers}" not in styles


def test_cross_attention_that_a_causal_lm_never_runs_is_sharded_like_self_attention():
    styles = styles_of(build_synthesized_plan(meta("bart"), True))
    assert styles["model.decoder.layers.*.encoder_attn.k_proj"] == "ColwiseParallel"
    assert styles["model.decoder.layers.*.encoder_attn.out_proj"] == "RowwiseParallel"


def test_input_readers_follow_the_cross_attention_alias():
    from transformers.models.bart.modeling_bart import BartAttention

    assert read_input_readers(BartAttention) == {"q_proj", "k_proj", "v_proj"}


class _GatedLayer(nn.Module):
    """fc1/fc2 in the layer, but fc2 reads fc1's output times another projection: not a plain MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc1, self.gate, self.fc2 = nn.LayerNorm(4), nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)
        self.act = nn.GELU()

    def forward(self, hidden_states):
        x = self.norm(hidden_states)
        y = self.act(self.fc1(x))
        y = nn.functional.dropout(y, p=0.1, training=self.training)
        return hidden_states + self.fc2(y * self.gate(x))


class _PlainLayer(_GatedLayer):
    def forward(self, hidden_states):
        x = self.norm(hidden_states)
        y = self.act(self.fc1(x))
        if hidden_states.shape[0] > 1:
            x = self.gate(x)  # bound in a branch: unknown after it
        y = nn.functional.dropout(y, p=0.1, training=self.training)
        return hidden_states + self.fc2(y) + self.fc1(x)


def test_argument_chains_pair_fc1_and_fc2_only_through_parameter_free_steps():
    from plangen.plans.source.forward import read_argument_chains
    from plangen.plans.families.core import recognize_layer_mlp
    from plangen.plans.families.dims import ModelDims

    dims = ModelDims(hidden=4, heads=None, kv_heads=None, head_dim=None, vocab=None, experts=None)
    assert read_argument_chains(_GatedLayer)["fc2"] == ("?",)
    assert recognize_layer_mlp(_GatedLayer(), dims) == ()
    chains = read_argument_chains(_PlainLayer)
    assert chains["fc2"] == ("act", "fc1", "norm")
    # fc1 is called on two different things (`x` is unknown after the branch): no single chain.
    assert "fc1" not in chains and chains["act"] == ("fc1", "norm")
    assert recognize_layer_mlp(_PlainLayer(), dims) == (("fc1", "fc2"),)


@pytest.mark.parametrize(
    "model_type, layers, attributes",
    [
        ("opt", "model.decoder.layers.*", ("num_heads",)),
        ("xglm", "model.layers.*", ("embed_dim", "num_heads")),
        ("bart", "model.decoder.layers.*", None),
    ],
)
def test_attention_that_views_by_its_head_count_gets_it_made_local(model_type, layers, attributes):
    """OPT's ``view(bsz, -1, self.num_heads, self.head_dim)``: with this rank's half of the heads the
    -1 takes the missing heads into the sequence, no error. The plan divides such attributes."""
    attention = next(
        e for e in build_synthesized_plan(meta(model_type), False).entries if e.pattern == f"{layers}.self_attn"
    )
    if attributes is None:  # BART views by (-1, head_dim) only: nothing to change
        assert attention.style == "PrepareModuleInput"
    else:
        assert (attention.style, attention.kwargs["head_attributes"]) == ("PrepareAttentionInput", attributes)


def test_prepare_attention_input_divides_the_head_attributes(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh

    from plangen.styles import build_style

    attention = meta("opt").model.decoder.layers[0].self_attn
    heads, width = attention.num_heads, attention.embed_dim
    style = build_style("PrepareAttentionInput", {"head_attributes": ("num_heads",), "input_kwarg_layouts": None})
    style._apply(attention, DeviceMesh("cpu", torch.arange(2)))
    assert (attention.num_heads, attention.embed_dim, attention.head_dim) == (heads // 2, width, width // heads)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_attention_reshaped_by_the_inputs_own_width_is_handed_its_slice_of_the_hidden_dimension(sequence_parallel):
    # TrOCR: `bsz, tgt_len, embed_dim = hidden_states.size()` ... `reshape(bsz, tgt_len, embed_dim)`:
    # handed this rank's slice of its input, embed_dim is this rank's heads' width; q/k/v all-gather it.
    plan = build_synthesized_plan(meta("trocr"), sequence_parallel)
    for attention in ("self_attn", "encoder_attn"):
        path = f"model.decoder.layers.*.{attention}"
        prepared = next(e for e in plan.entries if e.pattern == path)
        assert prepared.style == "PrepareAttentionInput" and prepared.kwargs["head_attributes"] == ("num_heads",)
        assert prepared.kwargs["input_kwarg_layouts"] == {
            "hidden_states": Shard(1) if sequence_parallel else Replicate()
        }
        assert prepared.kwargs["desired_input_kwarg_layouts"] == {"hidden_states": Shard(-1)}
        assert prepared.kwargs["use_local_output"] is True  # a DTensor would report the whole width
        for projection in ("q_proj", "k_proj", "v_proj"):
            colwise = next(e for e in plan.entries if e.pattern == f"{path}.{projection}")
            assert (colwise.style, colwise.kwargs["input_layouts"]) == ("ColwiseParallel", Shard(-1))
    assert not any(r.pattern.endswith("_attn") for r in plan.replicated)


class _WidthAttention(nn.Module):
    """TrOCR-like attention that also adds its input back: a slice of the input would be wrong there."""

    def __init__(self, width: int = 8, heads: int = 2):
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(width, width) for _ in range(4))

    def forward(self, hidden_states):
        bsz, tgt_len, embed_dim = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, tgt_len, self.num_heads, -1)
        k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
        out = (q.flatten(2) * k * v).reshape(bsz, tgt_len, embed_dim)
        return self.out_proj(out) + hidden_states


def test_attention_reading_its_input_otherwise_too_is_not_handed_a_slice():
    from transformers.models.prophetnet import modeling_prophetnet
    from transformers.models.trocr import modeling_trocr

    from plangen.plans.families.core import recognize_attention
    from plangen.plans.families.dims import ModelDims
    from plangen.plans.source.width import read_input_only_sized_and_projected

    qkv = frozenset({"q_proj", "k_proj", "v_proj"})
    assert read_input_only_sized_and_projected(modeling_trocr.TrOCRAttention, qkv)
    # ProphetNet also asserts the input's size against the unpacked one: an assert only passes or raises.
    assert read_input_only_sized_and_projected(
        modeling_prophetnet.ProphetNetAttention, frozenset({"query_proj", "key_proj", "value_proj"})
    )
    # Reading the input with anything else (k_proj left out here, or a residual add) is not followed.
    assert not read_input_only_sized_and_projected(modeling_trocr.TrOCRAttention, frozenset({"q_proj", "v_proj"}))
    assert not read_input_only_sized_and_projected(_WidthAttention, qkv)
    kept = recognize_attention(
        _WidthAttention(), ModelDims(hidden=8, heads=2, kv_heads=2, head_dim=4, vocab=None, experts=None)
    )
    assert "the input's own width" in kept.why and "reads its input otherwise too" in kept.why


@pytest.mark.parametrize(
    "model_type, path", [("bart", "model.decoder.embed_positions"), ("xglm", "model.embed_positions")]
)
def test_position_embeddings_added_to_the_token_embedding_are_laid_out_under_sp(model_type, path):
    model = meta(model_type)
    assert analyze_model(model).positions == (path,) and analyze_model(model).sequence_parallel
    entry = next(e for e in build_synthesized_plan(model, True).entries if e.pattern == path)
    assert entry.style == "PrepareModuleOutput" and not entry.kwargs["use_local_output"]
    assert path not in styles_of(build_synthesized_plan(model, False))


def test_an_embedding_narrower_than_the_hidden_size_is_still_vocabulary_parallel():
    # OPT-350m: a 512-wide embedding, project_in to 1024; the head reads project_out's 512.
    resolved = resolve_model("opt")
    config = shrink_config(resolved.config, 2, attn_implementation="eager")
    config.word_embed_proj_dim = config.hidden_size // 2
    analysis = analyze_model(build_meta_model(config, resolved.model_class))
    assert (analysis.embedding, analysis.head) == ("model.decoder.embed_tokens", "lm_head")
    assert any("not the hidden size" in p for p in analysis.sp_problems)
    # shrink_config keeps an embedding as wide as the hidden size as wide (no projection appears).
    assert shrink_config(resolved.config, 2).word_embed_proj_dim == shrink_config(resolved.config, 2).hidden_size


def test_per_codebook_embeddings_and_heads_are_each_vocabulary_parallel():
    # Musicgen: a ModuleList of one embedding and one head per codebook; the embeddings are summed.
    plan = build_synthesized_plan(meta("musicgen"), True)
    assert styles_of(plan)["model.decoder.embed_tokens.*"] == "RowwiseParallel"
    assert styles_of(plan)["lm_heads.*"] == "ColwiseParallel"
    assert styles_of(plan)["model.decoder.embed_positions"] == "PrepareModuleOutput"  # sinusoids, no parameters


def test_a_head_width_is_not_a_head_count_even_where_one_kv_head_is_as_wide():
    # Granite with one KV head: kv_heads x head_dim == head_dim; view(..., -1, self.head_dim) stays as it is.
    from tiny_configs import build_tiny

    plan = build_synthesized_plan(build_tiny("granite-1kv"), False)
    attention = next(e for e in plan.entries if e.pattern == "model.layers.*.self_attn")
    assert attention.style == "PrepareAttentionInput" and "head_attributes" not in attention.kwargs


# --- blocks split over two sibling modules (the BERT family as causal decoders) --------------------


@pytest.mark.parametrize(
    "model_type, layers",
    [
        ("bert", "bert.encoder.layer.*"),
        ("roberta", "roberta.encoder.layer.*"),
        ("electra", "electra.encoder.layer.*"),
        ("xlm-roberta-xl", "roberta.encoder.layer.*"),  # pre-norms beside attention.self and intermediate
    ],
)
def test_bert_blocks_split_over_sibling_modules_are_sharded_megatron_style(model_type, layers):
    # attention.self holds q/k/v, attention.output the projection back; intermediate the up-projection,
    # output the down-projection: paired by what the parent feeds from one to the other.
    plan = build_synthesized_plan(meta(model_type), False)
    styles = styles_of(plan)
    for inner, colwise, outer in (
        ("attention.self", ("query", "key", "value"), "attention.output.dense"),
        ("intermediate", ("dense",), "output.dense"),
    ):
        assert styles[f"{layers}.{inner}"] == "PrepareModuleInput"  # one Replicate DTensor: one gradient reduction
        assert all(styles[f"{layers}.{inner}.{c}"] == "ColwiseParallel" for c in colwise)
        assert styles[f"{layers}.{outer}"] == "RowwiseParallel"
    # The post-norms after the residual add see the whole hidden state; the tied head is vocabulary-parallel.
    assert not any(p.endswith("LayerNorm") for p in styles)
    assert styles[next(p for p in styles if p.endswith("word_embeddings"))] == "TiedEmbeddingParallel"
    from plangen.model.module_tree import find_unmatched_keys

    assert find_unmatched_keys(meta(model_type), styles) == []


def test_a_norm_inside_the_column_half_sees_the_whole_input():
    # RoBERTa-PreLayerNorm: intermediate = LayerNorm then dense; the norm takes a plain tensor.
    plan = build_synthesized_plan(meta("roberta-prelayernorm"), False)
    prepared = next(e for e in plan.entries if e.pattern == "roberta_prelayernorm.encoder.layer.*.intermediate")
    assert prepared.style == "PrepareModuleInput" and prepared.kwargs["use_local_output"] is True
    assert styles_of(plan)["roberta_prelayernorm.encoder.layer.*.intermediate.dense"] == "ColwiseParallel"
    assert "before its column-parallel projections" in why_of(
        plan, "roberta_prelayernorm.encoder.layer.*.intermediate.LayerNorm"
    )


def test_bert_has_no_sequence_parallel_plan_and_says_why():
    with pytest.raises(
        ValueError,
        match=r"BertLMHeadModel: no sequence-parallel synthesized plan: the token embedding is "
        r"combined with position_embeddings, token_type_embeddings inside bert.embeddings \(BertEmbeddings\)",
    ):
        build_synthesized_plan(meta("bert"), True)
    # An embedding module holding only a norm beside the token embedding is not such a sum.
    assert not analyze_model(meta("modernbert-decoder")).sp_problems[0].startswith("the token embedding is combined")


@pytest.mark.parametrize("model_type, layers", [("roformer", "roformer"), ("megatron-bert", "bert")])
def test_attention_reshaping_with_its_built_in_width_gets_local_head_counts(model_type, layers):
    # Their k/v read `encoder_hidden_states if is_cross_attention else hidden_states` (an input either
    # way), and the context is viewed as (..., self.all_head_size): that width is made this rank's.
    plan = build_synthesized_plan(meta(model_type), False)
    attention = next(e for e in plan.entries if e.pattern == f"{layers}.encoder.layer.*.attention.self")
    assert (attention.style, attention.kwargs) == ("LocalHeadCounts", {"attributes": ("all_head_size",)})
    styles = styles_of(plan)
    assert all(
        styles[f"{layers}.encoder.layer.*.attention.self.{p}"] == "ColwiseParallel" for p in ("query", "key", "value")
    )
    assert styles[f"{layers}.encoder.layer.*.output.dense"] == "RowwiseParallel"


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)

    def forward(self, hidden_states):
        return self.up(hidden_states), None


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down, self.norm = nn.Linear(8, 4), nn.LayerNorm(4)

    def forward(self, hidden_states, residual):
        hidden_states = self.down(hidden_states)
        return self.norm(hidden_states + residual)


class _Choosing(_Inner):
    def forward(self, hidden_states, encoder_states=None):
        states = encoder_states if encoder_states is not None else hidden_states
        return self.up(states), None


class _TwiceRead(_Outer):
    def forward(self, hidden_states, residual):
        return self.norm(self.down(hidden_states) + hidden_states.sum())


class _Split(nn.Module):
    def __init__(self, outer=_Outer) -> None:
        super().__init__()
        self.inner, self.outer = _Inner(), outer()

    def forward(self, x):
        h, _ = self.inner(x)
        h = self.outer(h, x)
        return h


class _SplitByIndex(_Split):
    def forward(self, x):
        out = self.inner(x)
        return (self.outer(out[0], x),) + out[1:]


class _Leaky(_Split):
    def forward(self, x):
        h, _ = self.inner(x)
        return self.outer(h, x) + h.mean()  # the column-parallel half's output read elsewhere: its shard


class _Chunked(_Split):
    def forward(self, x):
        return self.chunk(x)

    def chunk(self, x):
        h, _ = self.inner(x)
        return self.outer(h, x)


def test_forward_source_reader_pairs_split_halves():
    from plangen.plans.source.split import read_choice_readers, read_fed_by, read_helper_block_call, read_sole_reader

    assert read_fed_by(_Split) == read_fed_by(_SplitByIndex) == read_fed_by(_Chunked) == {"outer": "inner"}
    assert read_fed_by(_Leaky) == {}
    assert read_helper_block_call(_Chunked, "inner", _Inner) == BlockCall(1, None, 2)  # found in a helper method
    assert read_sole_reader(_Outer) == "down" and read_sole_reader(_TwiceRead) is None
    assert read_choice_readers(_Choosing) == {"up"} and read_choice_readers(_Inner) == frozenset()


@pytest.mark.parametrize("parent, found", [(_Split, True), (_Chunked, True), (_Leaky, False)])
def test_split_blocks_are_recognised_only_where_the_data_flow_allows(parent, found):
    from plangen.plans.families.dims import ModelDims
    from plangen.plans.families.split import SplitBlock, recognize_split_blocks

    dims = ModelDims(hidden=4, heads=2, kv_heads=2, head_dim=2, vocab=None, experts=None)
    blocks = recognize_split_blocks(parent(), dims)
    assert blocks == ([SplitBlock("mlp", "inner", ("up",), "outer", "down")] if found else [])
    assert recognize_split_blocks(_Split(_TwiceRead), dims) == []  # the row half reads its input twice


def test_shared_parameters_stay_one_after_tp_and_in_one_fsdp_unit(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from plangen.model.module_tree import find_separable_units, find_transformer_layers
    from plangen.parallelize import apply_tp, resolve_tied_styles

    resolved = resolve_model("bert")
    model = resolved.model_class._from_config(shrink_config(resolved.config, 2))
    predictions = model.cls.predictions
    assert predictions.bias is predictions.decoder.bias  # transformers ties the output bias too
    # BERT declares its embeddings a block; tied to the head, they stay in the root's FSDP2 unit.
    layers = find_transformer_layers(model)
    assert model.bert.embeddings in layers and model.bert.embeddings not in find_separable_units(model, layers)
    styles = build_parallel_styles(build_synthesized_plan(model, False))
    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), resolve_tied_styles(model, styles))
    assert predictions.bias is predictions.decoder.bias and isinstance(predictions.bias, DTensor)
    assert model.bert.embeddings.word_embeddings.weight is predictions.decoder.weight


def test_ctrl_attention_called_with_one_variable_thrice_and_its_sequential_mlp_are_sharded():
    # CTRL: self.multi_head_attention(normed, normed, normed, ...) into forward(v, k, q, ...); the MLP
    # is nn.Sequential(Linear, ReLU, Linear), whose children run in order.
    ctrl = meta("ctrl")
    skip_unless_pinned_model_code(ctrl)
    styles = styles_of(build_synthesized_plan(ctrl, False))
    layer = "transformer.h.*"
    assert all(styles[f"{layer}.multi_head_attention.{p}"] == "ColwiseParallel" for p in ("Wq", "Wk", "Wv"))
    assert styles[f"{layer}.multi_head_attention.dense"] == "RowwiseParallel"
    assert (styles[f"{layer}.ffn.0"], styles[f"{layer}.ffn.2"]) == ("ColwiseParallel", "RowwiseParallel")


class _ThreeInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, y, z):
        return self.a(x) + self.b(y) + self.c(z)


class _CallsAlike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _ThreeInputs()

    def forward(self, h, other):
        return self.block(h, other, h)


def test_forward_source_reader_follows_one_variable_into_several_parameters():
    from plangen.plans.source.split import read_alike_readers

    assert read_alike_readers(_CallsAlike, "block", _ThreeInputs) == {"a", "c"}  # y gets another value


def test_verify_pairs_the_halves_of_a_split_block_across_sibling_modules(tmp_path):
    # PG205 looks for the row-parallel partner in the column-parallel projection's own block; for
    # BERT it is in the sibling the parent feeds (intermediate -> output).
    from typer.testing import CliRunner

    from plangen.commands.cli import app

    runner, plan = CliRunner(), tmp_path / "bert_plan.py"
    assert runner.invoke(app, ["init", "bert", "-o", str(plan)]).exit_code == 0
    assert runner.invoke(app, ["verify", str(plan)]).exit_code == 0
    text = plan.read_text()
    row = next(line for line in text.splitlines() if line.strip().startswith('"bert.encoder.layer.*.output.dense"'))
    plan.write_text(text.replace(row, ""))  # the MLP's row half left out: its column half feeds a slice on
    result = runner.invoke(app, ["verify", str(plan)])
    assert result.exit_code != 0 and "PG205 column-parallel `bert.encoder.layer.*.intermediate.dense`" in result.output


def test_an_activation_with_single_valued_parameters_runs_on_the_ranks_slice():
    # Apertus' xIELU: alpha_p and alpha_n, shape (1,), the same for every feature of the intermediate.
    plan = build_synthesized_plan(meta("apertus"), False)
    assert _entry(plan, "model.layers.*.mlp.up_proj").style == "ColwiseParallel"
    assert _entry(plan, "model.layers.*.mlp.act_fn").style == "AllReduceParamGrads"  # gradient summed over TP
    assert _entry(plan, "model.layers.*.mlp.down_proj").style == "RowwiseParallel"


def test_gemma4_attention_is_sharded_in_every_layer_kind_and_its_per_layer_table_by_vocabulary():
    """Gemma 4's config states head sizes per layer (full-attention layers: twice the sliding ones'
    head_dim; its global head_dim raises): each layer is recognised with its own sizes, also in a
    sample of the layers that renumbers them (plangen list's). Its per-layer embedding table (40 %
    of the parameters) is vocabulary-parallel, reduced to the whole output the model reshapes."""
    from plangen.commands.catalog import apply_layer_sample
    from plangen.plans.families.dims import layer_dims, read_dims

    model = meta("gemma4_text")
    skip_unless_pinned_model_code(model)
    sliding, full = model.model.layers
    dims = read_dims(model)
    assert (layer_dims(model, dims, sliding).head_dim, layer_dims(model, dims, full).head_dim) == (16, 32)
    plan = build_synthesized_plan(model, False)
    assert not [r.pattern for r in plan.replicated if "self_attn" in r.pattern]
    assert styles_of(plan)["model.layers.*.self_attn.q_proj"] == "ColwiseParallel"
    table = _entry(plan, "model.embed_tokens_per_layer")
    assert table.style == "ScaledEmbeddingParallel"
    assert table.kwargs == dict(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True)
    apply_layer_sample(model)  # one layer of each kind, renumbered from 0: the full one stands at 1 here too
    assert not [r.pattern for r in build_synthesized_plan(model, False).replicated if "self_attn" in r.pattern]


def test_gemma4_per_layer_inputs_stay_whole_under_tp_and_on_the_sequence_shard_under_sp():
    """Gemma 4's per-layer inputs (plans/per_layer_inputs.py): without SP the projection and its norm
    outside the layers stay whole with their reason and the table is all-reduced; under SP the
    table is reduce-scattered into sequence shards, and the projection, its norm and each layer's
    gate and projection run on the shard (SequenceParallel): no all-gather for them."""
    model = meta("gemma4_text")
    skip_unless_pinned_model_code(model)
    found = analyze_model(model).per_layer_inputs
    assert found is not None and (found.table, found.projection, found.norm) == (
        "model.embed_tokens_per_layer",
        "model.per_layer_model_projection",
        "model.per_layer_projection_norm",
    )
    assert found.layer_linears[:2] == ("model.layers.0.per_layer_input_gate", "model.layers.0.per_layer_projection")
    plan = build_synthesized_plan(model, False)
    assert "per token and small, whole on every rank" in why_of(plan, "model.per_layer_model_projection")
    assert _entry(plan, "model.embed_tokens_per_layer").kwargs["output_layouts"] == Replicate()
    sp = build_synthesized_plan(model, True)
    table = _entry(sp, "model.embed_tokens_per_layer")
    assert table.kwargs == dict(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
    for path in (
        "model.per_layer_model_projection",
        "model.per_layer_projection_norm",
        "model.layers.*.per_layer_input_gate",
        "model.layers.*.per_layer_projection",
    ):
        assert (_entry(sp, path).style, _entry(sp, path).kwargs) == (
            "SequenceParallel",
            dict(sequence_dim=1, use_local_output=False),
        )
    assert "PrepareModuleInputOutput" not in styles_of(sp).values()


def test_an_embedding_whose_rows_the_model_reads_itself_is_vocab_parallel_with_the_reader_styled():
    """Gemma 4's multimodal model takes the pad token's row of the token embedding's weight in its own
    forward: the embedding and its tied head are vocabulary-parallel, the reader gets
    EmbeddingRowReadParallel (the row read whole), and SP is refused for it. A forward reading the
    weight otherwise (a matmul, a slice) keeps the embedding and its tied head whole, with the
    reason; its dtype or shape is no read."""
    from plangen.plans.source.forward import read_weight_reads, read_weight_row_reads

    class ReadsDtype(nn.Module):
        def forward(self, x):
            return x.to(self.embed_tokens.weight.dtype)

    class ReadsRow(nn.Module):
        def forward(self, x):
            return self.language_model.embed_tokens.weight[self.config.pad_token_id, :] + x

    class ReadsSlice(nn.Module):
        def forward(self, x):
            return self.embed_tokens.weight[:, 0] + self.embed_tokens.weight[0] + x

    class Multiplies(nn.Module):
        def forward(self, x):
            return torch.nn.functional.linear(x, self.embed_tokens.weight)

    cases = (ReadsDtype, ReadsRow, ReadsSlice, Multiplies)
    assert [read_weight_reads(c, "embed_tokens") for c in cases] == [False, True, True, True]
    assert [read_weight_row_reads(c, "embed_tokens") for c in cases] == [False, True, False, False]
    model = meta("gemma4")
    plan = build_synthesized_plan(model, False)
    assert styles_of(plan)["model.language_model.embed_tokens"] == "TiedEmbeddingParallel"
    assert styles_of(plan)["lm_head"] == "TiedHeadParallel"
    assert _entry(plan, "model").style == "EmbeddingRowReadParallel"
    assert _entry(plan, "model").kwargs == {"embedding": "language_model.embed_tokens"}
    assert "model.language_model.embed_tokens_per_layer" in styles_of(plan)
    # Under SP the reader's torch.where mixes the whole row with the sequence-sharded embedding
    # (tied_styles._RowReads takes the row and the mask as Replicate DTensors): the same reader style.
    assert not analyze_model(model).sp_problems
    sp = build_synthesized_plan(model, True)
    assert _entry(sp, "model").style == "EmbeddingRowReadParallel"
    assert _entry(sp, "model.language_model.embed_tokens").kwargs["output_layouts"] == Shard(1)


def test_experts_the_layer_calls_itself_are_split_and_reduced_at_their_own_output():
    """Gemma 4's MoE form (enable_moe_block, 26B-A4B): router and packed experts are children of the
    decoder layer, which normalises the experts' output: ExpertsParallel all-reduces it there, the
    router stays whole with its reason. Under SP the router and the experts' input norm (read from
    the layer's forward) take the flattened residual whole, gathered once for both (SharedInputGather
    on the layer), and the experts' sum is left a Partial
    DTensor that the norm on it (SequenceParallel, as every norm) reduce-scatters. Their input's
    gradient is left partial (sum_input_grad=False) for the gather's backward to reduce-scatter."""
    from plangen.plans.families.layer_experts import read_experts_norms
    from tiny_configs import build_tiny

    model = build_tiny("gemma4-moe")
    plan = build_synthesized_plan(model, False)
    experts = _entry(plan, "model.layers.*.experts")
    assert experts.style == "ExpertsParallel" and experts.kwargs == {"output_layouts": Replicate()}
    assert "routing stays exact" in why_of(plan, "model.layers.*.router")
    assert not [e for e in plan.entries if "router" in e.pattern]
    layer = type(model.model.layers[0])
    assert read_experts_norms(layer, "experts") == ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")
    assert not analyze_model(model).sp_problems
    sp = build_synthesized_plan(model, True)
    assert _entry(sp, "model.layers.*.experts").kwargs == {
        "output_layouts": Partial(),
        "use_local_output": False,
        "sum_input_grad": False,
    }
    # The router and the experts' input norm read the flattened residual: gathered once for both, the
    # norm's gradient (the experts' input's) partial, reduce-scattered by the gather's backward.
    shared = _entry(sp, "model.layers.*")
    assert (shared.style, shared.kwargs) == (
        "SharedInputGather",
        {"readers": ("router", "pre_feedforward_layernorm_2"), "partial_readers": ("pre_feedforward_layernorm_2",)},
    )
    assert not [e for e in sp.entries if e.pattern.endswith((".router", ".pre_feedforward_layernorm_2"))]
    assert styles_of(sp)["model.layers.*.post_feedforward_layernorm_2"] == "SequenceParallel"


def test_experts_whose_output_no_norm_takes_are_refused_under_sequence_parallel():
    """The reader follows the experts' input and output through names and reshapes only: a layer
    adding their output straight to the residual has no norm to reduce-scatter it (and an input
    normed inline is not read), so the analysis finds no SP layout for the layer."""
    from plangen.plans.families.layer_experts import read_experts_norms

    class Unnormed(nn.Module):
        def forward(self, hidden_states):
            flat = hidden_states.reshape(-1, 8)
            weights, index = self.router(flat)
            out = self.experts(self.norm(flat), index, weights)
            return hidden_states + out.reshape(hidden_states.shape)

    assert read_experts_norms(Unnormed, "experts") == (None, None)  # self.norm(...) inline, no norm after


# --- gated-delta-net linear attention (plangen.plans.families.linear_attention) -------------------


@pytest.mark.parametrize(
    "model_type, colwise, packed",
    [
        (
            "qwen3_5",
            ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
            "in_proj_qkv",
        ),  # [q; k; v] as the conv takes it
        ("qwen3_next", ("in_proj_qkvz", "in_proj_ba"), None),  # grouped per key head: a plain row split
        ("qwen3_5_moe", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), "in_proj_qkv"),
        ("olmo_hybrid", ("q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj"), None),  # o_proj is as wide
    ],
)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gated_delta_nets_are_sharded_by_heads(model_type, colwise, packed, sequence_parallel):
    from plangen.plans.families.linear_attention import GatedDeltaNetBlock

    model = meta(model_type)
    skip_unless_pinned_model_code(model)
    mixers = [b for b in analyze_model(model).blocks if b.path.endswith("linear_attn")]
    assert mixers and all(isinstance(b.block, GatedDeltaNetBlock) for b in mixers)
    block = mixers[0].block
    assert block.colwise == colwise and block.packed == packed
    assert set(block.head_parameters) == {"A_log", "dt_bias"} and block.rowwise in ("out_proj", "o_proj")
    plan = build_synthesized_plan(model, sequence_parallel)
    styles = styles_of(plan)
    assert styles["model.layers.*.linear_attn"] == "GatedDeltaNetParallel"
    assert styles[f"model.layers.*.linear_attn.{block.norm}"] == "AllReduceParamGrads"
    assert styles[f"model.layers.*.linear_attn.{block.rowwise}"] == "RowwiseParallel"
    assert {styles[f"model.layers.*.linear_attn.{p}"] for p in colwise if p != packed} == {"ColwiseParallel"}
    assert packed is None or styles[f"model.layers.*.linear_attn.{packed}"] == "FusedColwiseParallel"
    assert not any(r.pattern.endswith("linear_attn") for r in plan.replicated)


def test_a_mixer_that_is_not_a_gated_delta_net_stays_replicated_with_the_reason():
    from plangen.plans.families.core import KeptBlock
    from plangen.plans.families.registry import recognize_block
    from plangen.plans.families.dims import read_dims

    model = meta("qwen3_5")
    mixer = model.model.layers[0].linear_attn
    mixer.num_v_heads += 1  # no longer the conv's channels and the [value heads] parameters' shape
    found = recognize_block("linear_attn", mixer, read_dims(model))
    assert isinstance(found, KeptBlock) and found.kind == "mixer" and "linear-attention mixer" in found.why


def test_gemma3n_kv_shared_layers_and_sparse_gates_are_sharded():
    """Gemma 3n's last layers reuse earlier layers' keys and values (no k/v projections): their
    queries split by heads with the storing layers' KV heads, the grouping made this rank's; its
    MLPs keep the gate's Gaussian top-k, taken over TP by ActivationSparsityParallel. Before, the
    KV-shared layers stayed whole and met sharded keys (a shape error), and the sparse gates took
    their statistics over one rank's slice (logits off by 0.12)."""
    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import build_tiny_model

    model = build_tiny_model(resolve_model("gemma3n_text"))
    skip_unless_pinned_model_code(model)  # 5.5.x's KV-shared layers keep their (unused) k/v projections
    shared = [i for i, layer in enumerate(model.model.layers) if layer.self_attn.is_kv_shared_layer]
    assert shared and not hasattr(model.model.layers[shared[0]].self_attn, "k_proj")
    plan = build_synthesized_plan(model, False)
    styles = styles_of(plan)
    # One entry for every layer: the KV-shared ones are laid out as the others (their k/v keys match nothing).
    assert styles["model.layers.*.self_attn"] == "PrepareAttentionInput"
    assert styles["model.layers.*.self_attn.q_proj"] == "ColwiseParallel"
    assert styles["model.layers.*.self_attn.o_proj"] == "RowwiseParallel"
    assert not [p for p in styles if p.startswith(tuple(f"model.layers.{i}." for i in shared))]
    assert styles["model.layers.*.mlp"] == "ActivationSparsityParallel"
    assert not [r for r in plan.replicated if "self_attn" in r.pattern]


# --- heads and adapters the BERT family adds ---------------------------------------------------


def test_a_head_from_a_narrower_projection_is_vocabulary_parallel_and_refuses_sp_with_the_reason():
    # RemBERT: cls.predictions.dense maps the hidden size to output_embedding_size, the decoder that to the vocabulary.
    model = meta("rembert")
    assert model.cls.predictions.decoder.in_features != model.config.hidden_size
    plan = build_synthesized_plan(model, False)
    head = next(e for e in plan.entries if e.pattern == "cls.predictions.decoder")
    assert (head.style, head.kwargs["input_layouts"], head.kwargs["output_layouts"]) == (
        "ColwiseParallel",
        Replicate(),
        Shard(-1),
    )
    assert not any(r.pattern == "cls.predictions.decoder" for r in plan.replicated)
    problems = analyze_model(model).sp_problems
    assert any(
        p.startswith(f"the output head reads {model.config.output_embedding_size} features, not the hidden size")
        for p in problems
    )


def test_big_bird_attention_called_on_either_branch_is_split_and_its_rebuilt_child_gets_local_counts():
    # BigBirdAttention calls self.self on both branches of `if self.attention_type == "original_full"`
    # (one call site), and set_attention_type rebuilds self.self as full or block-sparse attention: the
    # model's forward does so for sequences too short for block-sparse. The counts either class reshapes
    # by are made this rank's from the parent; the block-sparse one, which draws each head's random
    # key blocks from numpy's seeded stream, is refused in training.
    from transformers.models.big_bird import modeling_big_bird as big_bird

    from plangen.plans.source.split import read_draws_numpy_random, read_fed_by, read_rebuilt_child_classes

    assert read_fed_by(big_bird.BigBirdAttention) == {"output": "self"}
    assert set(read_rebuilt_child_classes(big_bird.BigBirdAttention, "self")) == {
        big_bird.BigBirdSelfAttention,
        big_bird.BigBirdBlockSparseAttention,
    }
    assert read_draws_numpy_random(big_bird.BigBirdBlockSparseAttention)
    assert not read_draws_numpy_random(big_bird.BigBirdSelfAttention)
    assert read_rebuilt_child_classes(big_bird.BigBirdAttention, "output") == ()
    plan = build_synthesized_plan(meta("big_bird"), False)
    layers = "bert.encoder.layer.*"
    attention = next(e for e in plan.entries if e.pattern == f"{layers}.attention")
    assert (attention.style, attention.kwargs) == (
        "RebuiltChildHeadCounts",
        {
            "child": "self",
            "attributes": ("all_head_size", "num_attention_heads"),
            "refused_in_training": ("BigBirdBlockSparseAttention",),
        },
    )
    styles = styles_of(plan)
    assert all(styles[f"{layers}.attention.self.{p}"] == "ColwiseParallel" for p in ("query", "key", "value"))
    assert styles[f"{layers}.attention.output.dense"] == "RowwiseParallel"
    assert f"{layers}.attention.self" not in styles  # the child the plan saw is rebuilt at the first forward


def test_prophetnet_ngram_attention_is_sharded_by_heads_with_its_bucket_major_projection():
    # relative_pos_embeddings [num_buckets * num_heads, H] is viewed (..., num_buckets, num_attn_heads):
    # bucket major, so each rank takes its heads of every bucket (num_buckets equal parts). The forward
    # unpacks its width from its input and views by it after out_proj too; the predict stream's helper
    # projects its input transposed (rows in another order than the heads' index): run for all heads.
    from transformers.models.prophetnet import modeling_prophetnet as prophetnet

    from plangen.plans.families.bucketed_attention import read_bucket_major_view, read_transposed_projection_helper

    attention = prophetnet.ProphetNetNgramSelfAttention
    assert read_bucket_major_view(attention, "relative_pos_embeddings") == ("num_buckets", "num_attn_heads")
    assert read_transposed_projection_helper(attention, "relative_pos_embeddings", "num_attn_heads") == (
        "get_predict_relative_pos_embeddings",
        2,
    )
    assert read_bucket_major_view(attention, "query_proj") is None
    model = meta("prophetnet")
    plan = build_synthesized_plan(model, False)
    layers = "prophetnet.decoder.layers.*"
    block = next(e for e in plan.entries if e.pattern == f"{layers}.self_attn")
    assert block.style == "BucketedAttentionInputOutput"
    assert block.kwargs["desired_input_kwarg_layouts"] == {"hidden_states": Shard(-1)}
    assert (
        block.kwargs["output_layouts"] == (Shard(-1), None, None)
        and block.kwargs["desired_output_layouts"][0] == Replicate()
    )
    assert (block.kwargs["head_attributes"], block.kwargs["head_inputs"]) == (
        ("num_attn_heads",),
        ("attention_mask", "extended_predict_attention_mask"),
    )
    assert (block.kwargs["all_heads_helper"], block.kwargs["all_heads_dim"]) == (
        "get_predict_relative_pos_embeddings",
        2,
    )
    entries = {e.pattern: e for e in plan.entries}
    relative = entries[f"{layers}.self_attn.relative_pos_embeddings"]
    assert relative.style == "FusedColwiseParallel" and relative.kwargs["part_sizes"] == (1,) * model.config.num_buckets
    out = entries[f"{layers}.self_attn.out_proj"]
    assert (out.style, out.kwargs["output_layouts"]) == ("RowwiseParallel", Shard(-1))
    assert all(
        entries[f"{layers}.self_attn.{p}"].style == "ColwiseParallel" for p in ("query_proj", "key_proj", "value_proj")
    )
    assert not any(r.pattern == f"{layers}.self_attn" for r in plan.replicated)


def test_xmod_mlp_halves_through_a_chunked_helper_and_its_language_adapters_are_sharded():
    # XmodLayer: apply_chunking_to_forward(self.feed_forward_chunk, ...) returns self.intermediate(x),
    # then self.output(that, residual, lang_ids); output's adapters are MLPs run after the reduction.
    from transformers.models.xmod import modeling_xmod

    from plangen.plans.source.split import read_fed_by

    assert read_fed_by(modeling_xmod.XmodLayer) == {"output": "intermediate"}
    model = meta("xmod")
    styles = styles_of(build_synthesized_plan(model, False))
    layers = "roberta.encoder.layer.*"
    assert styles[f"{layers}.intermediate.dense"] == "ColwiseParallel"
    assert styles[f"{layers}.output.dense"] == "RowwiseParallel"
    for language in model.config.languages:
        assert styles[f"{layers}.output.adapter_modules.{language}.dense1"] == "ColwiseParallel"
        assert styles[f"{layers}.output.adapter_modules.{language}.dense2"] == "RowwiseParallel"
    assert any("adapter_modules runs on the tokens it selects" in p for p in analyze_model(model).sp_problems)


def test_an_adapter_container_with_a_member_that_is_no_mlp_stays_whole():
    from plangen.plans.synthesis.analysis_split import _analyze_adapters
    from plangen.plans.families.dims import read_dims
    from plangen.plans.synthesis.findings import Findings

    model = meta("xmod")
    dims = read_dims(model)
    adapters = model.roberta.encoder.layer[0].output.adapter_modules
    adapters["odd"] = nn.Linear(dims.hidden, dims.hidden)
    found = Findings()
    assert not _analyze_adapters(adapters, "adapters", dims, found) and found.blocks == []


def test_doge_dynamic_mask_projection_is_row_parallel_onto_this_ranks_heads():
    # dt_proj: (kv_heads x head_dim) -> kv_heads from value_states; A: one value per head.
    from transformers.models.doge import modeling_doge

    from plangen.plans.source.split import read_fed_from

    plan = build_synthesized_plan(meta("doge"), False)
    gate = next(e for e in plan.entries if e.pattern == "model.layers.*.self_attn.dt_proj")
    assert (gate.style, gate.kwargs) == (
        "RowwiseParallel",
        {"input_layouts": Shard(-1), "output_layouts": Shard(-1), "use_local_output": True},
    )
    assert styles_of(plan)["model.layers.*.self_attn"] == "AttentionSinksParallel"  # A split with the heads
    assert styles_of(plan)["model.layers.*.self_attn.o_proj"] == "RowwiseParallel"
    assert "input_residual, post_attention_residual" in why_of(plan, "model.layers.*")
    # Under SP they meet the sequence-sharded residual as Replicate DTensors, gradient summed over TP.
    assert "model.layers.*" not in styles_of(plan)
    assert styles_of(build_synthesized_plan(meta("doge"), True))["model.layers.*"] == "SequenceParallelOwnParameters"
    projections = frozenset({"q_proj", "k_proj", "v_proj"})
    assert read_fed_from(modeling_doge.DogeAttention, "dt_proj", projections)
    # Fed from the attention's input instead (a shape-alike Linear), it is no such gate.
    assert not read_fed_from(modeling_doge.DogeAttention, "dt_proj", frozenset({"o_proj"}))


def test_prophetnet_cross_attention_is_handed_its_slice_of_the_hidden_dimension():
    plan = build_synthesized_plan(meta("prophetnet"), False)
    prepared = next(e for e in plan.entries if e.pattern == "prophetnet.decoder.layers.*.cross_attn")
    assert prepared.kwargs["desired_input_kwarg_layouts"] == {"hidden_states": Shard(-1)}
    assert styles_of(plan)["prophetnet.decoder.layers.*.cross_attn.query_proj"] == "ColwiseParallel"
    # The n-gram self-attention beside it too (test_prophetnet_ngram_attention_is_sharded_by_heads_...).
    assert styles_of(plan)["prophetnet.decoder.layers.*.self_attn"] == "BucketedAttentionInputOutput"


def test_a_model_of_several_stacks_names_them_as_its_reason():
    """BLT sizes its patcher, local encoder, global transformer and local decoder each in a sub-config:
    the reason says so instead of only "no hidden size"."""
    analysis = analyze_model(meta("blt"))
    assert not analysis.synthesizable
    assert analysis.problem == (
        "its config states no hidden size of its own, only its stacks' (decoder_config,"
        " encoder_config, global_config, patcher_config): a model of several stacks is not recognised"
    )
    # A module with no config at all: the plain reason, and synthesizing it is a ValueError (choose_plan's NoPlanError).
    assert analyze_model(nn.Sequential(nn.Linear(2, 2))).problem == "its config states no hidden size"
    with pytest.raises(ValueError, match="no hidden size"):
        build_synthesized_plan(nn.Sequential(nn.Linear(2, 2)), False)


# ---------------------------------------------------------------------------------------------
# The families' registry


@pytest.mark.parametrize(
    "model_type, path, owner, broader",
    [
        # Bloom's packed [q; k; v]: attention's own recognizer keeps it whole, the packed family shards it.
        ("bloom", "transformer.h.0.self_attention", "packed attention", "attention"),
        # FalconMamba's mixer: a Mamba1 mixer before the generic state-space mixer kept whole.
        ("falcon_mamba", "backbone.layers.0.mixer", "Mamba1 mixer", "state-space mixer kept whole"),
    ],
)
def test_the_first_family_in_the_registry_owns_a_block_another_would_keep_whole(model_type, path, owner, broader):
    from plangen.plans.families.core import KeptBlock
    from plangen.plans.families.dims import read_dims
    from plangen.plans.families.registry import FAMILIES, recognize_block

    model = meta(model_type)
    dims, block = read_dims(model), model.get_submodule(path)
    answers = {family.name: family.recognize(block, dims) for family in FAMILIES}
    names = [family.name for family in FAMILIES]
    assert names.index(owner) < names.index(broader)
    assert isinstance(answers[broader], KeptBlock) and not isinstance(answers[owner], KeptBlock)
    assert recognize_block(path.rsplit(".", 1)[1], block, dims) == answers[owner]


def test_every_block_a_family_shards_writes_its_own_entries():
    """A block the synthesizer places (FamilyBlock) answers ``entries`` itself: a new family that
    forgets to would fail only when a model with its block is synthesized."""
    import plangen.plans.families.registry  # noqa: F401 - imports every family
    import plangen.plans.families.split  # noqa: F401 - blocks split across children
    from plangen.plans.families.block import FamilyBlock
    from plangen.plans.families.packed import WrappedBlock

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    blocks = set(subclasses(FamilyBlock)) - {WrappedBlock}  # a wrapper is unwrapped before its entries
    assert len(blocks) >= 10, blocks
    assert not [b.__name__ for b in blocks if b.entries is FamilyBlock.entries]


class _HelperShapedAttention(nn.Module):
    """transformers 5.5-5.8's GPT-J attention, its shaping alone: the helpers view by the head count
    ``forward`` passes them (a parameter, not ``self.num_attention_heads``)."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.num_attention_heads, self.head_dim = heads, hidden // heads

    def _split_heads(self, tensor, num_attention_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_attention_heads, attn_head_size)
        return tensor.view(new_shape)

    def _merge_heads(self, tensor, num_attention_heads, attn_head_size):
        new_shape = tensor.size()[:-2] + (num_attention_heads * attn_head_size,)
        return tensor.view(new_shape)

    def forward(self, hidden_states):
        query = self._split_heads(hidden_states, self.num_attention_heads, attn_head_size=self.head_dim)
        return self._merge_heads(query, self.num_attention_heads, self.head_dim)


def test_a_helper_that_views_by_the_head_count_forward_passes_it_reads_that_count():
    """The count reaches the view as the helper's parameter (by position; the width by keyword), and
    through ``x.size()[:-1] + (heads, width)``: read, so the plan makes it this rank's (unread, GPT-J's
    synthesized plan failed its parity check on 5.8.1: ``shape '[4, 8, 2, 32]' is invalid``)."""
    from plangen.plans.source.shape import read_shape_sizes

    shapes = read_shape_sizes(_HelperShapedAttention)
    assert shapes.attributes == {"num_attention_heads", "head_dim"}
    assert shapes.last == {"head_dim"}  # the per-head width, never divided
    assert not shapes.input_width


def test_gptj_attention_of_5_5_to_5_8_gets_its_head_count_made_local():
    from transformers.models.gptj import modeling_gptj

    if not hasattr(modeling_gptj.GPTJAttention, "_split_heads"):
        pytest.skip("this transformers' GPT-J attention views by -1 (no helper reads the head count)")
    from plangen.model.shrink import build_tiny_model

    plan = build_synthesized_plan(build_tiny_model(resolve_model("gptj"), seed=0), sequence_parallel=False)
    entry = next(e for e in plan.entries if e.pattern == "transformer.h.*.attn")
    assert (entry.style, entry.kwargs["head_attributes"]) == ("PrepareAttentionInput", ("num_attention_heads",))

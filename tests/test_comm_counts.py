"""Communication of the hand-written plans at the Megatron minimum, counted exactly.

A single-process fake process group runs TP at any size; ``CollectiveCounter`` (torch's
``CommDebugMode``) counts the collectives that DTensor issues, with the same numbers as gloo.
Counts at 2 and 4 layers give the per-layer cost and the fixed cost (embedding, head).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModelForCausalLM, NemotronHConfig, Zamba2Config

from conftest import skip_unless_pinned_model_code, stack_cannot_run
from plangen.distributed.comm import CollectiveCounter, merge_c10d_counts
from plangen.loss import vocab_parallel_cross_entropy
from plangen.plans.choice import choose_plan
from plangen.runtime.tensor_parallel import apply_tp
from plangen.stack.transformers_compat import installed_layer_kinds
from tiny_configs import TINY

BATCH, SEQ = 2, 8
AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"


def run_step(
    name: str,
    layers: int,
    sequence_parallel: bool,
    tp: int = 2,
    variant: str = "optimized",
    source: str = "hand-written",
    edit_styles=None,
):
    why = stack_cannot_run(f"{name}{'-sp' if sequence_parallel else ''}")
    if why:
        pytest.skip(why)
    kwargs = dict(TINY[name], num_hidden_layers=layers)
    if "layer_types" in kwargs:
        kwargs["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if name.startswith(PER_MODEL_CODE):
        skip_unless_pinned_model_code(model)
    mesh = DeviceMesh("cpu", torch.arange(tp))
    chosen = choose_plan(model, sequence_parallel, variant=variant)
    assert chosen.source == source
    styles = chosen.build_styles()
    if edit_styles is not None:
        edit_styles(styles)
    apply_tp(model, mesh, styles)
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with CollectiveCounter() as forward:
        logits = model(input_ids=ids).logits
    loss = vocab_parallel_cross_entropy(logits, ids)
    with CollectiveCounter() as backward:
        loss.backward()
    return config, logits, forward, backward


# Counts read off one class's model code as the pinned transformers has it (the blocks it calls, in
# which order and how often): on other code the class's own proof is the sweep's.
PER_MODEL_CODE = ("longcat_flash", "gemma4")


def per_layer(
    name: str, sequence_parallel: bool, variant: str = "optimized", source: str = "hand-written", edit_styles=None
):
    _, _, f2, b2 = run_step(name, 2, sequence_parallel, variant=variant, source=source, edit_styles=edit_styles)
    _, _, f4, b4 = run_step(name, 4, sequence_parallel, variant=variant, source=source, edit_styles=edit_styles)
    diff = lambda a, b: {k: (b.get(k, 0) - a.get(k, 0)) // 2 for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    f2, b2, f4, b4 = (merge_c10d_counts(c.counts()) for c in (f2, b2, f4, b4))
    return diff(f2, f4), diff(b2, b4), f2, b2


DENSE = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"]


# Conv1D projections and a fused c_attn; CpmAnt's blocks one level down, its position bias split by
# heads with no communication; no sequence-parallel plan.
TP_ONLY = ["gpt2", "openai-gpt", "cpmant"]


@pytest.mark.parametrize("name", DENSE + TP_ONLY)
def test_tensor_parallel_costs_two_all_reduces_per_layer(fake_pg, name):
    forward, backward, total_forward, total_backward = per_layer(name, False)
    assert forward == {AR: 2}
    assert backward == {AR: 2}  # one input-gradient reduction per block, not one per projection
    # Fixed cost: the embedding's all-reduce forward, the head's input-gradient reduction backward.
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}


@pytest.mark.parametrize("name", DENSE)
def test_sequence_parallel_gathers_once_per_block(fake_pg, name):
    forward, backward, total_forward, total_backward = per_layer(name, True)
    assert forward == {AG: 2, RS: 2}
    assert backward == {AG: 2, RS: 2}
    # Fixed: the embedding reduce-scatters into the sequence-sharded stream, the head gathers it.
    # Gemma3 too, though it scales its embedding inside the module: the scale acts on the partial
    # lookup first (TiedEmbeddingParallel(local_lookup=True)), so nothing all-reduces.
    assert total_forward == {AG: 2 * 2 + 1, RS: 2 * 2 + 1}
    assert total_backward == {AG: 2 * 2 + 1, RS: 2 * 2 + 1}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_no_collective_moves_the_vocabulary(fake_pg, sequence_parallel):
    config, logits, forward, backward = run_step("llama", 2, sequence_parallel)
    hidden_bytes = BATCH * SEQ * config.hidden_size * 4
    for name, size in forward.records + backward.records:
        assert size <= hidden_bytes, f"{name} moves {size} bytes; the hidden state is {hidden_bytes}"
    assert logits.placements[0].is_shard(-1) or logits.placements[0].is_shard(2)
    assert logits.to_local().shape[-1] == config.vocab_size // 2


# --- mixture of experts: experts split over TP on the expert dimension -------------------------

# gpt-oss: its attention sinks are split with the heads at no communication, so its layer costs
# exactly what the others' do.
# mixtral-3-experts: 3 experts at TP 2, each expert's intermediate split (plangen.styles.experts): the
# same collectives, of the same sizes, as the expert split.
MOE = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "mixtral-3-experts"]
# Qwen2-MoE's shared expert: its gate's output gradient (one value per token, scaling the shared
# expert's partial output). Its input gradient adds to the experts' locally, reduced once by the
# block (MoeBlockParallel; it was a second B·S·H all-reduce, 3 in all).
SHARED_BACKWARD = {"qwen2_moe": 1}


def _moe_payloads(name: str, sequence_parallel: bool):
    return _moe_payloads_of(name, sequence_parallel)


def _moe_payloads_of(name: str, sequence_parallel: bool, source: str = "hand-written"):
    """(forward, backward) collective names and byte sizes of a 2-layer step, and the sizes B·S·H, B·S·k."""
    config, _, forward, backward = run_step(name, 2, sequence_parallel, source=source)
    return (
        forward.records,
        backward.records,
        BATCH * SEQ * config.hidden_size * 4,
        BATCH * SEQ * config.num_experts_per_tok * 4,
    )


@pytest.mark.parametrize("name", MOE)
def test_moe_layer_costs_what_a_dense_layer_costs_plus_the_routing_weights(fake_pg, name):
    """Per layer: the MoE block's branches (routed experts, shared experts) leave partial sums that the
    block reduces once, as one row-parallel MLP would: 2 all-reduces of B·S·H forward. Backward: the
    attention block's and the experts' input gradients (B·S·H each), and the routing weights' (B·S·k:
    each rank's gradient covers its own experts' routes), so the router's gradient is exact."""
    forward, backward, total_forward, total_backward = per_layer(name, False)
    shared = SHARED_BACKWARD.get(name, 0)
    assert forward == {AR: 2}
    assert backward == {AR: 3 + shared}
    # Fixed: the embedding forward, the head's input gradient backward. Qwen3-MoE's layer 0 is dense
    # here (mlp_only_layers): under the MoE block's style (MoeBlockParallel) its gate and up
    # projections add their partial input gradients on the block's input, reduced once: 2 there.
    dense_first = 1 if name == "qwen3_moe" else 0
    assert total_forward == {AR: 2 * 2 + 1}
    assert total_backward == {AR: (3 + shared) * 2 + 1 - dense_first}
    fwd, bwd, bsh, bsk = _moe_payloads(name, False)
    assert sorted({size for _, size in fwd}) == [bsh]  # nothing moves more than the hidden state
    assert {size for _, size in bwd} - {bsh, bsk} <= ({BATCH * SEQ * 4} if name in SHARED_BACKWARD else set())


@pytest.mark.parametrize("name", MOE)
def test_moe_layer_under_sequence_parallel_gathers_in_and_reduce_scatters_out(fake_pg, name):
    forward, backward, _, _ = per_layer(name, True)
    assert forward == {AG: 2, RS: 2}  # per block: gather the sequence in, reduce-scatter the sum out
    # Backward: each block's output gradient is gathered; attention reduce-scatters its input
    # gradient; the MoE block's (MoeBlockParallel: the experts' partial, with the shared expert's
    # summed locally, the router's counted once) is one reduce-scatter, the gather's backward (it was
    # an all-reduce of B·S·H per branch), beside the routing weights' all-reduce and a shared
    # expert's gate's output gradient.
    assert backward == {AG: 2, RS: 2, AR: 1 + SHARED_BACKWARD.get(name, 0)}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_synthesized_moe_block_with_a_shared_mlp_reduces_its_input_gradient_once(fake_pg, sequence_parallel):
    """HunYuan-MoE-V1's block (synthesized: router, experts, an nn.Linear shared MLP) as the hand-written
    Qwen2-MoE's: the experts' and the shared MLP's input gradients summed locally, reduced once by the
    block (MoeBlockParallel + PartialGradInput): backward 4 AR -> 3 (the attention's, the block's, the
    routing weights'), under SP 2 AG + 1 RS + 3 AR -> 2 AG + 2 RS + 1 AR."""
    forward, backward, _, _ = per_layer("hunyuan_v1_moe", sequence_parallel, source="synthesized")
    if sequence_parallel:
        assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2, AR: 1}
    else:
        assert forward == {AR: 2} and backward == {AR: 3}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_longcat_flash_layer_costs_its_five_blocks_at_their_minimum(fake_pg, sequence_parallel):
    """Per LongCat-Flash layer: two latent attentions (MLA: one reduction forward, three backward),
    two dense MLPs (one each way) and the shortcut MoE block, its experts split on each expert's
    intermediate beside the identity experts (one forward; the hidden states' and the routing
    weights' gradients backward). With SP every block gathers its input once and reduce-scatters
    its output; backward each block's output gradient is gathered, the MLPs reduce-scatter their
    input gradients, and the attentions' three reductions and the experts' two stay all-reduces (they
    take a local, whole input), but the MoE block's input gradient (the experts' and the identity
    experts' partial shares, the router's counted once) is one reduce-scatter, its gather's backward."""
    # num_hidden_layers counts sublayers, two per LongCat layer: 2 and 4 build one layer and two.
    one, two = (run_step("longcat_flash", n, sequence_parallel) for n in (2, 4))
    counts = [[merge_c10d_counts(c.counts()) for c in step[2:]] for step in (one, two)]
    forward, backward = ({k: counts[1][i][k] - counts[0][i].get(k, 0) for k in counts[1][i]} for i in (0, 1))
    forward, backward = ({k: v for k, v in d.items() if v} for d in (forward, backward))
    if not sequence_parallel:
        assert forward == {AR: 5} and backward == {AR: 2 * 3 + 2 + 2}
    else:
        assert forward == {AG: 5, RS: 5}
        assert backward == {AG: 5, RS: 3, AR: 2 * 3 + 1}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_dbrx_layer_with_split_kv_heads_costs_what_every_moe_layer_costs(fake_pg, sequence_parallel):
    """DBRX with 2 KV heads (Wqkv by heads, FusedColwiseParallel; the flat experts by whole experts,
    FlatExpertsParallel): per layer exactly the other MoE plans' minimum, with and without SP."""
    forward, backward, _, _ = per_layer("dbrx-2kv", sequence_parallel)
    if not sequence_parallel:
        assert forward == {AR: 2} and backward == {AR: 3}
    else:
        assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2, AR: 1}
    config, _, _, backward_step = run_step("dbrx-2kv", 2, sequence_parallel)
    bsk = BATCH * SEQ * config.ffn_config.moe_top_k * 4  # the routing weights' gradient, once per MoE layer
    assert sorted(size for _, size in backward_step.records).count(bsk) == config.n_layers


@pytest.mark.parametrize("name", ["dbrx", "dbrx-3-experts"])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_dbrx_layer_with_one_kv_head_adds_the_kv_rows_gather(fake_pg, sequence_parallel, name):
    """DBRX's default layout, one KV head: MultiQueryColwiseParallel computes it whole on every rank,
    its weight rows all-gathered per forward and their gradient reduce-scattered: one more of each
    per layer than the MoE minimum above, nothing else. With 3 experts at TP 2 (each expert's ffn
    rows split) the same: the layouts leave the same partial sums and input gradients."""
    forward, backward, _, _ = per_layer(name, sequence_parallel)
    if not sequence_parallel:
        assert forward == {AG: 1, AR: 2} and backward == {RS: 1, AR: 3}
    else:
        assert forward == {AG: 3, RS: 2} and backward == {AG: 2, RS: 3, AR: 1}


def test_gemma4_moe_layer_reduces_its_experts_like_a_third_row_parallel_block(fake_pg):
    """Gemma 4's MoE form (synthesized): the layer calls its experts itself, beside the dense MLP, and
    normalises their output: ExpertsParallel all-reduces it there. Per layer, forward: o_proj's,
    down_proj's and the experts' all-reduces of B·S·H; backward: the attention's, the MLP's and the
    experts' input gradients (B·S·H) and the routing weights' (B·S·k), so the router stays exact."""
    forward, backward, _, _ = per_layer("gemma4-moe", False, source="synthesized")
    assert forward == {AR: 3} and backward == {AR: 4}
    config, _, forward_step, backward_step = run_step("gemma4-moe", 2, False, source="synthesized")
    bsh, bsk = BATCH * SEQ * config.hidden_size * 4, BATCH * SEQ * config.top_k_experts * 4
    per_layer_table = BATCH * SEQ * config.num_hidden_layers * config.hidden_size_per_layer_input * 4
    assert sorted(size for _, size in forward_step.records) == sorted([bsh] * (3 * 2 + 1) + [per_layer_table])
    assert sorted(size for _, size in backward_step.records) == sorted([bsh] * (3 * 2 + 1) + [bsk] * 2)  # + the head's


def test_gemma4_moe_layer_under_sp_reduce_scatters_its_experts_into_the_sequence_shards(fake_pg):
    """Under SP (plans/layer_experts.py) the experts' partial sum is reduce-scattered by the norm on it,
    as a row-parallel MLP's is: forward, per layer, the attention's, the MLP's and the experts' three
    reduce-scatters, and three all-gathers of B·S·H (the attention's and the MLP's inputs, and the
    flattened residual once for both the router and the experts' input norm, SharedInputGather: they
    compute on every token as without SP; gathered for each it was 4). Backward: the three blocks'
    output gradients gathered, their three input gradients reduce-scattered into the sequence shards
    (the experts' left partial and reduce-scattered with the router's by the shared gather's backward:
    it was an all-reduce of B·S·H, 2 all-reduces per layer), and the routing weights' all-reduced."""
    forward, backward, _, _ = per_layer("gemma4-moe", True, source="synthesized")
    assert forward == {AG: 3, RS: 3}
    assert backward == {AG: 3, RS: 3, AR: 1}
    config, _, forward_step, backward_step = run_step("gemma4-moe", 2, True, source="synthesized")
    bsh, bsk = BATCH * SEQ * config.hidden_size * 4, BATCH * SEQ * config.top_k_experts * 4
    table = BATCH * SEQ * config.num_hidden_layers * config.hidden_size_per_layer_input * 4
    # Reduce-scatters leave this rank half; the embedding's and the per-layer table's are the fixed ones.
    assert sorted(forward_step.records) == sorted(
        [(AG, bsh)] * (3 * 2 + 1) + [(RS, bsh // 2)] * (3 * 2 + 1) + [(RS, table // 2)]
    )
    assert sorted(backward_step.records) == sorted(
        [(AG, bsh)] * (3 * 2 + 1) + [(AG, table)] + [(RS, bsh // 2)] * (3 * 2 + 1) + [("allreduce_", bsk)] * 2
    )


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gemma4_dense_layer_with_per_layer_inputs_costs_the_megatron_minimum(fake_pg, sequence_parallel):
    """Gemma 4's dense form (E2B/E4B): the per-layer inputs (plans/per_layer_inputs.py) add nothing per
    layer: their gate and projection stay whole (TP) or run on the sequence shard (SP). The per-layer
    table is one more fixed reduction of B·S·L·P: an all-reduce, or under SP a reduce-scatter into the
    sequence shards the layers take (and its gradient gathered back)."""
    forward, backward, total_forward, total_backward = per_layer(
        "gemma4-dense", sequence_parallel, source="synthesized"
    )
    if not sequence_parallel:
        assert forward == {AR: 2} and backward == {AR: 2}
        assert total_forward == {AR: 2 * 2 + 2} and total_backward == {AR: 2 * 2 + 1}
    else:
        assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2}
        assert total_forward == {AG: 2 * 2 + 1, RS: 2 * 2 + 2} and total_backward == {AG: 2 * 2 + 2, RS: 2 * 2 + 1}


def test_jetmoe_layer_reduces_each_block_once_at_the_hidden_size(fake_pg):
    """JetMoE without SP (RoutedBlockParallel): each block (the attention's mixture of heads, the MoE
    MLP) sums its experts' top-k outputs locally and all-reduces its output once, B·S·H, as a dense
    row-parallel layer does (it all-reduced each output_linear's routed tokens, B·S·k × H: k times
    that). Backward: each block's input gradient (kv_proj's, the routed tokens', the router's) reduced
    once (B·S·H), and the gates' gradient (B·S·k): the gates scale partial sums, so the router stays
    exact. Was forward 2 all-reduces of B·S·k·H, backward 2 of B·S·k·H and 1 of B·S·H per layer."""
    forward, backward, _, _ = per_layer("jetmoe", False)
    assert forward == {AR: 2} and backward == {AR: 4}
    config, _, forward_step, backward_step = run_step("jetmoe", 2, False)
    bsh = BATCH * SEQ * config.hidden_size * 4
    bsk = BATCH * SEQ * config.num_experts_per_tok * 4
    assert sorted(size for _, size in forward_step.records) == [bsh] * (2 * 2 + 1)  # + the embedding's
    assert sorted(size for _, size in backward_step.records) == sorted(
        [bsh] * (2 * 2 + 1) + [bsk] * (2 * 2)
    )  # + the head's


def test_jetmoe_layer_under_sequence_parallel_reduce_scatters_each_block_out(fake_pg):
    """JetMoE under SP (RoutedBlockSequenceParallel): each block (the attention's mixture of heads,
    the MoE MLP) ends as a dense row-parallel layer does, its experts' partial sums reduce-scattered
    onto the sequence-sharded residual, so per layer forward is the dense SP minimum: 2 all-gathers
    and 2 reduce-scatters of B·S·H (no all-reduce of the routed tokens, B·S·k × H, any more).
    Backward: each block's output gradient all-gathered, its input gradient (kv_proj's, the routed
    tokens', the router's) reduce-scattered once, and the gates' gradient all-reduced (B·S·k): the
    gates scale partial sums, so theirs is partial, and the router stays exact. The bias, added once
    on the shard, costs no collective in the step (a Replicate() DTensor, as a norm's weight)."""
    forward, backward, _, _ = per_layer("jetmoe", True)
    assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2, AR: 2}
    config, _, forward_step, backward_step = run_step("jetmoe", 2, True)
    bsh = BATCH * SEQ * config.hidden_size * 4
    bsk = BATCH * SEQ * config.num_experts_per_tok * 4
    # The embedding's reduce-scatter and the head's all-gather: B·S·H each.
    assert merge_c10d_counts(forward_step.counts()) == {AG: 2 * 2 + 1, RS: 2 * 2 + 1}
    # Sizes of the results: a reduce-scatter leaves this rank its sequence half.
    assert sorted(size for _, size in forward_step.records) == sorted([bsh // 2] * (2 * 2 + 1) + [bsh] * (2 * 2 + 1))
    assert sorted(size for _, size in backward_step.records) == sorted(
        [bsk] * (2 * 2) + [bsh // 2] * (2 * 2 + 1) + [bsh] * (2 * 2 + 1)
    )


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_llama4_moe_layer_costs_one_reduction_forward_and_the_scores_and_inputs_backward(fake_pg, sequence_parallel):
    """Llama-4's every-token experts (EveryTokenMoeParallel): forward, the block's one reduction with
    the shared expert's (a reduce-scatter under SP). Backward per MoE block: the scores' gradient
    (B·S·E) and the block's input gradient once (B·S·H, input_grad_once: the repeated hidden state's
    and the shared expert's input's summed locally; they were two all-reduces), under SP one
    reduce-scatter."""
    forward, backward, _, _ = per_layer("llama4-moe", sequence_parallel)
    config, _, _, backward_step = run_step("llama4-moe", 2, sequence_parallel)
    if sequence_parallel:
        assert forward == {AG: 2, RS: 2}
        assert backward == {AG: 2, RS: 2, AR: 1}
    else:
        assert forward == {AR: 2}
        assert backward == {AR: 3}
    bsh, bse = BATCH * SEQ * config.hidden_size * 4, BATCH * SEQ * config.num_local_experts * 4
    sizes = Counter(size for name, size in backward_step.records if name in (AR, "allreduce_"))
    assert sizes[bse] == 2  # one per MoE layer: nothing moves E x H per token
    assert set(sizes) <= {bsh, bse}


# --- KV heads replicated where TP exceeds them (plangen.styles.kv_heads) -----------------------------

# (tiny model, TP size, k/v parameters per layer whose gradients are summed over TP)
KV_REPLICATED = [("gemma3-1kv", 2, 2), ("qwen2", 4, 4)]  # Qwen2: k/v weights and biases


@pytest.mark.parametrize("name, tp, kv_params", KV_REPLICATED)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_replicated_kv_heads_add_one_gradient_all_reduce_per_kv_parameter(
    fake_pg, name, tp, kv_params, sequence_parallel
):
    """More TP ranks than KV heads: the forward is the Megatron minimum unchanged (each rank computes
    its KV head locally); backward adds one all-reduce per replicated k/v parameter and layer, of
    exactly that parameter's size (weight [kv_heads * head_dim, hidden], bias [kv_heads * head_dim])."""
    counts = [run_step(name, layers, sequence_parallel, tp=tp) for layers in (2, 4)]
    (config, _, f2, b2), (_, _, f4, b4) = counts
    diff = lambda a, b: {k: (b[k] - a.get(k, 0)) // 2 for k in b if b[k] != a.get(k, 0)}  # noqa: E731
    minimum = {AG: 2, RS: 2} if sequence_parallel else {AR: 2}
    assert diff(f2.counts(), f4.counts()) == minimum
    backward = dict(minimum)
    backward[AR] = backward.get(AR, 0) + kv_params
    assert diff(b2.counts(), b4.counts()) == backward
    # The sizes of every backward all-reduce of the 2-layer step: the input-gradient reductions of
    # the blocks and the head (no SP), then each layer's k and v weights (and biases).
    kv_rows = config.num_key_value_heads * config.head_dim
    expected = Counter({BATCH * SEQ * config.hidden_size * 4: 0 if sequence_parallel else 2 * 2 + 1})
    expected[kv_rows * config.hidden_size * 4] += 2 * 2
    if kv_params == 4:
        expected[kv_rows * 4] += 2 * 2
    assert Counter(size for op, size in b2.records if op == AR) == +expected


# --- multi-head latent attention (DeepSeek-V2/V3): sharded by heads --------------------------------

LATENT = ["deepseek_v3", "deepseek_v2"]  # V3 with a query latent, V2-Lite's shape without (q_proj)


def _latent_sizes(name: str) -> dict[str, int]:
    """Bytes of the per-layer attention reductions: the query input's, the KV latent's, the rope key's."""
    c = dict(TINY[name])
    query = c["q_lora_rank"] or c["hidden_size"]  # q_b_proj reads the query latent, q_proj the hidden state
    return {
        "query": BATCH * SEQ * query * 4,
        "kv": BATCH * SEQ * c["kv_lora_rank"] * 4,
        "rope": BATCH * SEQ * c["qk_rope_head_dim"] * 4,
    }


@pytest.mark.parametrize("name", LATENT)
def test_latent_attention_layer_costs_one_all_reduce_forward_and_three_backward(fake_pg, name):
    """Per DeepSeek layer (MLA + MoE with a shared expert), forward: o_proj's all-reduce and the MoE
    block's, as a dense layer. Backward, attention: three reductions of activation gradients, the
    query up-projection's input (column-parallel), the KV latent (kv_b_proj's input) and the shared
    rope key (MlaAttentionParallel), each as small as the tensor it reduces; the replicated
    down-projections' weight gradients then need none. MoE: the block's input gradient once, the
    experts' and the shared experts' summed locally (MoeBlockParallel; they were two all-reduces),
    and the routing weights'."""
    forward, backward, total_forward, total_backward = per_layer(name, False)
    assert forward == {AR: 2}
    assert backward == {AR: 3 + 2}
    # Fixed: the embedding forward, the head backward; layer 0 is dense (first_k_dense_replace): its
    # gate and up read the block's Replicate DTensor and reduce their input gradients once (3 + 1;
    # each reduced its own before).
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: (3 + 1) + (3 + 2) + 1}
    config, _, forward_step, backward_step = run_step(name, 2, False)
    bsh, bsk = BATCH * SEQ * config.hidden_size * 4, BATCH * SEQ * config.num_experts_per_tok * 4
    assert sorted({size for _, size in forward_step.records}) == [bsh]
    sizes = _latent_sizes(name)
    moe_layer = sorted(size for _, size in backward_step.records[1:6])  # after the head's; the last layer first
    assert moe_layer == sorted([sizes["query"], sizes["kv"], sizes["rope"], bsh, bsk])


@pytest.mark.parametrize("name", LATENT)
def test_latent_attention_under_sequence_parallel_gathers_once_per_block(fake_pg, name):
    """Forward as a dense layer: one all-gather in and one reduce-scatter out per block. Backward: the
    blocks' output gradients gathered; the attention's three reductions stay all-reduces (the
    down-projections take a local, whole input); the MoE block's input gradient, the experts' and
    the shared experts' summed locally, is one reduce-scatter (it was two all-reduces), beside the
    routing weights' all-reduce."""
    forward, backward, _, _ = per_layer(name, True)
    assert forward == {AG: 2, RS: 2}
    assert backward == {AG: 2, RS: 1, AR: 3 + 1}


# --- Youtu: latent attention with its query latent split over TP ----------------------------------
# q_a_proj column-parallel, q_a_layernorm's statistics summed over TP, the latent all-gathered into
# q_b_proj (plangen.plans.families.latent.shards_query_latent); the KV latent and the rope key whole as above.


def _sizes_by_kind(counter) -> Counter:
    return Counter((merge_c10d_counts({op: 1}).popitem()[0], size) for op, size in counter.records)


def test_sharded_query_latent_trades_its_all_reduce_for_a_gather_and_a_reduce_scatter(fake_pg):
    """Forward: o_proj's and the MLP's all-reduces as a dense layer, plus the norm's statistics (B·S)
    and the query latent gathered (B·S·Lq). Backward: the query latent's all-reduce (B·S·Lq) becomes
    its gather's reduce-scatter, the norm's statistics add one of B·S, and q_a_proj's partial input
    gradient makes the attention's input gradient one reduction of B·S·H (beside the MLP's); the KV
    latent and the rope key as before. 2 layers: every size, exactly."""
    forward, backward, total_forward, total_backward = per_layer("youtu", False, source="synthesized")
    assert forward == {AR: 3, AG: 1}
    assert backward == {AR: 5, RS: 1}
    assert total_forward == {AR: 3 * 2 + 1, AG: 2} and total_backward == {AR: 5 * 2 + 1, RS: 2}
    c = TINY["youtu"]
    bsh, bs = BATCH * SEQ * c["hidden_size"] * 4, BATCH * SEQ * 4
    lq, lkv, rope = (BATCH * SEQ * c[k] * 4 for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim"))
    _, _, forward_step, backward_step = run_step("youtu", 2, False, source="synthesized")
    assert _sizes_by_kind(forward_step) == Counter({(AR, bsh): 5, (AR, bs): 2, (AG, lq): 2})
    assert _sizes_by_kind(backward_step) == Counter(
        {(AR, bsh): 5, (AR, lkv): 2, (AR, rope): 2, (AR, bs): 2, (RS, lq // 2): 2}
    )


def test_sharded_query_latent_under_sequence_parallel_reduces_the_block_input_once(fake_pg):
    """Under SP the attention's input gradient (q_a_proj's partial, the KV latent's whole one counted
    on the first rank) is the reduce-scatter of its gather: one more reduce-scatter and no all-reduce of
    B·S·H per layer. q_a_proj reducing its own input gradient instead (sharded_query_latent=False,
    still exact) adds an all-reduce of B·S·H to the gather's free slice."""
    forward, backward, _, _ = per_layer("youtu", True, source="synthesized")
    assert forward == {AG: 2 + 1, RS: 2, AR: 1}
    assert backward == {AG: 2, RS: 3, AR: 3}

    def unflagged(styles):
        styles["model.layers.*.self_attn"].sharded_query_latent = False

    _, backward, _, _ = per_layer("youtu", True, source="synthesized", edit_styles=unflagged)
    assert backward == {AG: 2, RS: 2, AR: 4}


# --- norms over the whole q/k projection (OLMo-2/3): two small all-reduces per layer each way ----
# BitNet (synthesized): its attn_sub_norm over all heads' output before o_proj, and its ffn_sub_norm
# over the intermediate before down_proj, cost the same two.

PROJECTION_NORMS = {"olmo2": "hand-written", "olmo3": "hand-written", "bitnet": "synthesized"}


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("name", PROJECTION_NORMS)
def test_whole_projection_norms_add_two_all_reduces_of_one_value_per_token_per_layer(fake_pg, name, sequence_parallel):
    """The two norms sum their statistics over TP: one all-reduce of B·S values each, forward
    (the sum of squares) and backward (its gradient); everything else is the Megatron minimum."""
    forward, backward, total_forward, total_backward = per_layer(name, sequence_parallel, source=PROJECTION_NORMS[name])
    megatron = {AG: 2, RS: 2} if sequence_parallel else {AR: 2}
    assert forward == {**megatron, AR: megatron.get(AR, 0) + 2}
    assert backward == {**megatron, AR: megatron.get(AR, 0) + 2}
    _, _, f2, b2 = run_step(name, 2, sequence_parallel, source=PROJECTION_NORMS[name])
    tokens = BATCH * SEQ * 4  # one float32 per token
    assert [size for op, size in f2.records if op == AR and size == tokens] == [tokens] * 2 * 2
    assert [size for op, size in b2.records if op == AR and size == tokens] == [tokens] * 2 * 2


def test_xlm_blocks_called_by_index_cost_the_megatron_minimum(fake_pg):
    """XLM's layer i is attentions[i], ffns[i] and their norms, called by index from the model's loop
    (plangen.plans.synthesis.block_stacks): each block entered where the loop calls it, so its q/k/v (lin1) share
    one input-gradient reduction; per layer two all-reduces each way, as Llama's."""
    forward, backward, total_forward, total_backward = per_layer("xlm", False, source="synthesized")
    assert forward == {AR: 2} and backward == {AR: 2}
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}


@pytest.mark.parametrize("name", ["llama", "gemma3", "phi3", "gpt2", "openai-gpt", "qwen2_moe"])
def test_stable_variant_forward_only_gathers(fake_pg, name):
    """The stable variant (plangen.plans.variants): no cross-rank sum in a layer's forward. o_proj
    and down_proj all-gather their input and their output; the one all-reduce left is the
    vocab-parallel embedding's, exact (one rank holds each token's row, the others add zeros)."""
    forward, backward, total_forward, total_backward = per_layer(name, False, "stable")
    assert forward == {AG: 4}
    # Backward still sums: each block's input gradient (as optimized), and the column-parallel
    # o_proj/down_proj input gradient reduce-scattered back to their Shard(-1) input.
    assert backward == {AR: 2, RS: 2}
    assert total_forward == {AG: 2 * 4, AR: 1} and total_backward == {AR: 2 * 2 + 1, RS: 2 * 2}


def test_stable_variant_gathers_whole_projection_norms_instead_of_summing_their_statistics(fake_pg):
    """OLMo-2: q_norm and k_norm all-gather their projection's slices (GatheredNormParallel), two
    more gathers per layer forward and no all-reduce of statistics; backward, the gathers'
    reduce-scatters and the two norms' weight gradients (head_dim x heads values) summed."""
    config, _, _, backward_step = run_step("olmo2", 2, False, variant="stable")
    forward, backward, total_forward, _ = per_layer("olmo2", False, "stable")
    assert forward == {AG: 4 + 2} and total_forward == {AG: 2 * 6, AR: 1}
    assert backward == {AR: 2 + 2, RS: 2 + 2}
    norm_grad = config.num_attention_heads * config.head_dim * 4
    kv_norm_grad = config.num_key_value_heads * config.head_dim * 4
    sizes = sorted(size for op, size in backward_step.records if op == AR)
    assert sizes.count(norm_grad) == 2 and sizes.count(kv_norm_grad) == 2


def test_stable_variant_of_llama4_keeps_its_every_token_experts_whole(fake_pg):
    """Llama-4 (EveryTokenMoeParallel in the optimized plan): the stable variant drops the block's
    style and keeps its experts whole; forward per MoE layer, o_proj's and the shared expert's
    down_proj's gathers (input and output each), nothing summed; backward, attention's and the
    shared expert's input gradients and the two column-parallel input gradients' reduce-scatters."""
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY["llama4-moe"]))
    plan = choose_plan(model, variant="stable").plan
    assert not [e for e in plan.entries if e.style in ("EveryTokenMoeParallel", "RowwiseParallelOwnOutput")]
    down = next(e for e in plan.entries if e.pattern.endswith("shared_expert.down_proj"))
    assert down.style == "ColwiseParallelOwnOutput"
    assert "model.layers.*.feed_forward.experts" in {r.pattern for r in plan.replicated}
    forward, backward, total_forward, _ = per_layer("llama4-moe", False, "stable")
    assert forward == {AG: 4}
    assert backward == {AR: 2, RS: 2}
    assert total_forward.get(AR) == 1 and RS not in total_forward


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "gpt_oss", "mixtral-3-experts"])
def test_stable_variant_keeps_experts_whole_so_a_moe_layer_sums_nothing(fake_pg, name):
    """Experts whole over TP (plangen.plans.variants): a MoE layer without shared experts has only
    attention's o_proj gathers forward; backward, attention's input gradient and o_proj's
    reduce-scatter, and nothing for the experts (every rank computed every route: exact grads)."""
    forward, backward, total_forward, _ = per_layer(name, False, "stable")
    assert forward == {AG: 2}
    assert backward == {AR: 1, RS: 1}
    assert total_forward.get(AR) == 1 and RS not in total_forward


def test_stable_variant_refuses_what_it_cannot_make_sum_free(fake_pg):
    from plangen.plan import Plan, PlanEntry
    from plangen.plans.variants import build_stable_plan
    from plangen.plan import VariantError

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY["llama"]))
    packed = Plan((PlanEntry("layers.*.mlp.down_proj", "PackedRowwiseParallel", {}, "mlp", ""),), "custom", (), False)
    with pytest.raises(VariantError, match="down_proj: its style PackedRowwiseParallel sums across TP ranks"):
        build_stable_plan(packed)
    jetmoe = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY["jetmoe"]))
    with pytest.raises(VariantError, match="input_linear|output_linear: its style GroupedRowwiseParallel sums across"):
        choose_plan(jetmoe, variant="stable")
    with pytest.raises(VariantError, match="stable variant has no sequence parallel"):
        choose_plan(model, True, variant="stable")
    with pytest.raises(VariantError, match="unknown plan variant 'fast': expected one of optimized, stable"):
        choose_plan(model, variant="fast")


# --- gated-delta-net linear attention by heads (plangen.styles.linear_attention) ------------------


def _linear_attention_step(layers: int, sequence_parallel: bool, variant: str = "optimized"):
    """Qwen3.5 with gated-delta-net layers only, under its synthesized plan (as the runtime picks it
    for the class; built here on this all-linear-attention model)."""
    from plangen.plans.synthesis.synthesize import build_synthesized_plan
    from plangen.plans.variants import build_plan_variant

    kwargs = dict(TINY["qwen3_5-linear"], num_hidden_layers=layers, layer_types=["linear_attention"] * layers)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    plan = build_plan_variant(build_synthesized_plan(model, sequence_parallel), variant)
    return (plan, *_tp2_step_counts(model, plan))


def _tp2_step_counts(model, plan) -> tuple[dict[str, int], dict[str, int]]:
    """``plan`` applied to ``model`` at TP 2: the collectives of one forward and of its backward."""
    from plangen.styles import build_parallel_styles

    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), build_parallel_styles(plan))
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with CollectiveCounter() as forward:
        logits = model(input_ids=ids).logits
    with CollectiveCounter() as backward:
        vocab_parallel_cross_entropy(logits, ids).backward()
    return merge_c10d_counts(forward.counts()), merge_c10d_counts(backward.counts())


def _linear_attention_per_layer(sequence_parallel: bool, variant: str = "optimized"):
    _, f2, b2 = _linear_attention_step(2, sequence_parallel, variant)
    _, f4, b4 = _linear_attention_step(4, sequence_parallel, variant)
    diff = lambda a, b: {k: (b.get(k, 0) - a.get(k, 0)) // 2 for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    return diff(f2, f4), diff(b2, b4)


def test_gated_delta_net_layer_costs_a_dense_layer_plus_its_norm_gradient(fake_pg):
    """Per layer (mixer + MLP), forward: out_proj's and down_proj's all-reduces; backward: each
    block's input gradient once (the mixer's four input projections share one), plus the gated
    norm's weight gradient (one head's width, shared by the heads). A_log, dt_bias and the conv's
    channels are split with the heads: no communication."""
    forward, backward = _linear_attention_per_layer(False)
    assert forward == {AR: 2}
    assert backward == {AR: 2 + 1}


def test_gated_delta_net_under_sequence_parallel_gathers_the_sequence_once(fake_pg):
    """The recurrence needs the whole sequence: gathered once at the mixer's input, reduce-scattered
    out of out_proj, as attention is; the norm's weight gradient still all-reduced."""
    forward, backward = _linear_attention_per_layer(True)
    assert forward == {AG: 2, RS: 2}
    assert backward == {AG: 2, RS: 2, AR: 1}


def test_stable_variant_of_a_gated_delta_net_forward_only_gathers(fake_pg):
    """The stable variant maps the mixer like attention: out_proj column-parallel on its gathered
    input (all-gathers in and out), nothing summed in forward; the conv, A_log and dt_bias stay
    split by heads (no cross-rank sum touches them)."""
    plan, _, _ = _linear_attention_step(2, False, "stable")
    styles = {e.pattern.rsplit(".", 1)[-1]: e.style for e in plan.entries if ".linear_attn" in e.pattern}
    assert styles["out_proj"] == "ColwiseParallel" and styles["linear_attn"] == "GatedDeltaNetParallel"
    forward, backward = _linear_attention_per_layer(False, "stable")
    assert forward == {AG: 4}
    assert backward == {AR: 2 + 1, RS: 2}


# Mamba1 mixers split by channels (plangen.styles.mamba1), in their proven synthesized plans.
MAMBA1_LAYERS = ["mamba", "falcon_mamba"]
ALL_REDUCES = (AR, "allreduce_")  # DTensor's, and the c10d one of the gradient sums (merge_c10d_counts)


def _x_proj_sums(records, config) -> list[int]:
    """The all-reduces of x_proj's [dt_rank + 2 state] output per token (float32), in order."""
    width = BATCH * SEQ * (config.time_step_rank + 2 * config.state_size) * 4
    return [size for op, size in records if op in ALL_REDUCES and size == width]


@pytest.mark.parametrize("name", MAMBA1_LAYERS)
def test_mamba1_mixer_costs_two_all_reduces_per_layer_as_a_dense_block(fake_pg, name):
    """Forward: x_proj's small partial sum and out_proj's; backward: dt/B/C's gradient at x_proj's
    output and the block input's gradient. Nothing else (conv1d, dt_proj, the scan are per channel)."""
    forward, backward, total_forward, total_backward = per_layer(name, False, source="synthesized")
    assert forward == {AR: 2} and backward == {AR: 2}
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}
    config, _, f2, b2 = run_step(name, 2, False, source="synthesized")
    assert len(_x_proj_sums(f2.records, config)) == 2 and len(_x_proj_sums(b2.records, config)) == 2


@pytest.mark.parametrize("name", MAMBA1_LAYERS)
def test_mamba1_mixer_under_sequence_parallel_gathers_in_and_reduce_scatters_out(fake_pg, name):
    """The scan needs the whole sequence: one all-gather in, one reduce-scatter out (backward: the
    reverse), and x_proj's small all-reduce each way."""
    forward, backward, _, _ = per_layer(name, True, source="synthesized")
    assert forward == {AG: 1, RS: 1, AR: 1}
    assert backward == {AG: 1, RS: 1, AR: 1}


def test_jamba_mixer_sums_its_dt_b_c_gradients_after_their_norms(fake_pg):
    """Jamba's dt/B/C norms have weights: the gradient is summed at each norm's output (three small
    all-reduces backward instead of one at x_proj), so the norms' weight gradients are whole. With its
    dense MLP: forward 2 + 1, backward 3 + 1 + 1 (the MLP's input gradient)."""
    forward, backward, _, _ = per_layer("jamba-mamba", False, source="synthesized")
    assert forward == {AR: 2 + 1} and backward == {AR: 3 + 1 + 1}
    # Under SP the mixer and the MLP each gather in and reduce-scatter out; x_proj's sums stay all-reduces.
    forward, backward, _, _ = per_layer("jamba-mamba", True, source="synthesized")
    assert forward == {AG: 2, RS: 2, AR: 1} and backward == {AG: 2, RS: 2, AR: 3}
    config, _, _, b2 = run_step("jamba-mamba", 2, False, source="synthesized")
    per_token = {config.mamba_dt_rank * BATCH * SEQ * 4, config.mamba_d_state * BATCH * SEQ * 4}
    assert sorted(size for op, size in b2.records if op in ALL_REDUCES and size in per_token) == sorted(
        [config.mamba_dt_rank * BATCH * SEQ * 4] * 2 + [config.mamba_d_state * BATCH * SEQ * 4] * 4
    )


@pytest.mark.parametrize("name", MAMBA1_LAYERS)
def test_stable_variant_keeps_mamba1_mixers_whole_so_a_layer_sums_nothing(fake_pg, name):
    """plangen.plans.variants: the mixer and its out_proj whole over TP; a Mamba layer has no
    collective at all (only the embedding's exact all-reduce and the head's input gradient remain)."""
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY[name]))
    plan = choose_plan(model, variant="stable").plan
    assert not [e for e in plan.entries if "mixer" in e.pattern]
    assert "backbone.layers.*.mixer" in {r.pattern for r in plan.replicated}
    forward, backward, total_forward, _ = per_layer(name, False, "stable", source="synthesized")
    assert forward == {} and backward == {}
    assert total_forward == {AR: 1}


# --- Mamba2 mixers split by heads (plangen.styles.mamba2) ---------------------------------------


def _mamba_step(n_groups: int, layers: int, sequence_parallel: bool, variant: str = "optimized", kinds=()):
    kinds = installed_layer_kinds(NemotronHConfig, ["linear_attention"] * layers + list(kinds))
    kwargs = dict(TINY["nemotron_h"], n_groups=n_groups, layers_block_type=kinds)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    chosen = choose_plan(model, sequence_parallel, variant=variant)
    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), chosen.build_styles())
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with CollectiveCounter() as forward:
        logits = model(input_ids=ids).logits
    loss = vocab_parallel_cross_entropy(logits, ids)
    with CollectiveCounter() as backward:
        loss.backward()
    return config, forward, backward


def _per_mixer(n_groups: int, sequence_parallel: bool, variant: str = "optimized"):
    counts = [_mamba_step(n_groups, layers, sequence_parallel, variant) for layers in (1, 2)]
    (_, f1, b1), (config, f2, b2) = counts
    c1, d1, c2, d2 = (merge_c10d_counts(c.counts()) for c in (f1, b1, f2, b2))
    diff = lambda a, b: {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    return diff(c1, c2), diff(d1, d2), config, f2, b2


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_nemotron_h_moe_mixer_reduces_its_branches_input_gradient_once(fake_pg, sequence_parallel):
    """Nemotron-H's MoE mixer (MoeBlockParallel): forward, its one reduction of the experts' and the
    shared expert's partial sums (under SP the sequence gathered in, reduce-scattered out). Backward:
    their input gradients summed locally and reduced once (B·S·H; under SP a reduce-scatter, after
    the output gradient's gather), and the routing weights' (B·S·k). Each branch reduced its own
    before: two all-reduces of B·S·H."""
    (_, f1, b1), (config, f2, b2) = (_mamba_step(2, 1, sequence_parallel, kinds=kinds) for kinds in ((), ("moe",)))
    c1, d1, c2, d2 = (merge_c10d_counts(c.counts()) for c in (f1, b1, f2, b2))
    diff = lambda a, b: {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    assert diff(c1, c2) == ({AG: 1, RS: 1} if sequence_parallel else {AR: 1})
    assert diff(d1, d2) == ({AG: 1, RS: 1, AR: 1} if sequence_parallel else {AR: 2})
    bsk = BATCH * SEQ * config.num_experts_per_tok * 4
    assert Counter(size for op, size in b2.records if op in (AR, "allreduce_"))[bsk] == 1


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mamba2_mixer_split_by_groups_costs_what_a_row_parallel_block_costs(fake_pg, sequence_parallel):
    """n_groups divisible by TP: each rank's heads read only its groups and the norm's groups lie whole
    on one rank, so a mixer costs the Megatron minimum of one block: its out_proj's all-reduce forward,
    its input gradient's backward (under SP: the sequence gathered in, reduce-scattered out)."""
    forward, backward, _, _, _ = _per_mixer(2, sequence_parallel)
    megatron = {AG: 1, RS: 1} if sequence_parallel else {AR: 1}
    assert forward == megatron and backward == megatron


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mamba2_mixer_with_one_group_gathers_its_rows_and_sums_the_norm(fake_pg, sequence_parallel):
    """One B/C group: its rows of in_proj.weight, conv1d.weight and conv1d.bias are all-gathered
    (weights: 2·N·hidden, 2·N·kernel, 2·N values) forward and their gradient reduce-scattered backward;
    the gated norm's one group spans both ranks: one all-reduce of B·S values each way. The rest is
    the Megatron minimum."""
    forward, backward, config, f2, b2 = _per_mixer(1, sequence_parallel)
    megatron = {AG: 1, RS: 1} if sequence_parallel else {AR: 1}
    assert forward == {**megatron, AG: megatron.get(AG, 0) + 3, AR: megatron.get(AR, 0) + 1}
    assert backward == {**megatron, RS: megatron.get(RS, 0) + 3, AR: megatron.get(AR, 0) + 1}
    state, hidden, kernel = config.ssm_state_size, config.hidden_size, config.conv_kernel
    gathered = Counter(size for op, size in f2.records if op == AG)
    rows = Counter([2 * state * hidden * 4, 2 * state * kernel * 4, 2 * state * 4] * 2)  # two mixers
    assert rows <= gathered and gathered.total() == rows.total() + (2 + 1 if sequence_parallel else 0)
    tokens = BATCH * SEQ * 4  # one float32 per token
    assert [size for op, size in f2.records if op == AR and size == tokens] == [tokens] * 2
    assert [size for op, size in b2.records if op == AR and size == tokens] == [tokens] * 2


@pytest.mark.parametrize("n_groups", [2, 1])
def test_stable_variant_of_a_mamba2_mixer_only_gathers_forward(fake_pg, n_groups):
    """Stable variant: out_proj gathers its input and output (column-parallel on the gathered input);
    with one group the gated norm gathers the group's slices (GatheredGatedRMSNormParallel) beside
    the three weight gathers: nothing is summed across ranks in forward."""
    forward, backward, _, _, _ = _per_mixer(n_groups, False, "stable")
    shared = 3 + 1 if n_groups == 1 else 0
    assert forward == {AG: 2 + shared}
    assert backward == {AR: 1, RS: 1 + shared}  # the input gradient; out_proj's and the gathers' reduce-scatters


# --- LFM's short-conv mixers split by channels (plangen.plans.families.short_conv) ---------------


def _short_conv_step(layers: int, sequence_parallel: bool):
    """LFM3 with short-conv layers only, under its synthesized plan (built on this all-conv model)."""
    from plangen.model.resolve import resolve_model
    from plangen.plans.synthesis.synthesize import build_synthesized_plan
    from plangen.model.shrink import shrink_config

    config = shrink_config(resolve_model("lfm3").config, 2)
    config.num_hidden_layers, config.layer_types = layers, ["conv"] * layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    plan = build_synthesized_plan(model, sequence_parallel)
    assert "GatedDeltaNetParallel" in {e.style for e in plan.entries}
    return _tp2_step_counts(model, plan)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_short_conv_layer_costs_a_dense_layer(fake_pg, sequence_parallel):
    """Per layer (mixer + MLP): the Megatron minimum, as a dense layer. B, C, x and the conv's channels
    are split alike, so nothing between in_proj and out_proj communicates, and there is no norm
    weight to reduce (unlike a gated delta net)."""
    f2, b2 = _short_conv_step(2, sequence_parallel)
    f4, b4 = _short_conv_step(4, sequence_parallel)
    per_layer = lambda a, b: {
        k: (b.get(k, 0) - a.get(k, 0)) // 2 for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)
    }  # noqa: E731
    if sequence_parallel:
        assert per_layer(f2, f4) == {AG: 2, RS: 2} and per_layer(b2, b4) == {AG: 2, RS: 2}
    else:
        assert per_layer(f2, f4) == {AR: 2} and per_layer(b2, b4) == {AR: 2}


# RecurrentGemma's recurrent blocks split by their RG-LRU heads (plangen.styles.recurrent).
def test_recurrent_block_costs_what_a_dense_attention_block_does(fake_pg):
    """linear_x/linear_y column-parallel, conv_1d and the RG-LRU per rank (no communication: its gates
    are block-diagonal), linear_out row-parallel: one all-reduce forward and one for the block input's
    gradient backward, the MLP's the same; under SP one all-gather in and one reduce-scatter out each."""
    forward, backward, total_forward, total_backward = per_layer("recurrent_gemma", False, source="synthesized")
    assert forward == {AR: 2} and backward == {AR: 2}
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}
    forward, backward, _, _ = per_layer("recurrent_gemma", True, source="synthesized")
    assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2}


# xLSTM's mLSTM layers split by heads (plangen.plans.families.recurrent).
def test_mlstm_layer_costs_what_a_dense_attention_block_does(fake_pg):
    """Six column-parallel projections that share one input-gradient reduction, the per-head norm
    without communication, out_proj row-parallel: a dense layer's two all-reduces each way; under
    SP one all-gather in and one reduce-scatter out per block."""
    forward, backward, total_forward, total_backward = per_layer("xlstm-4h", False, source="synthesized")
    assert forward == {AR: 2} and backward == {AR: 2}
    assert total_forward == {AR: 2 * 2 + 1} and total_backward == {AR: 2 * 2 + 1}
    forward, backward, _, _ = per_layer("xlstm-4h", True, source="synthesized")
    assert forward == {AG: 2, RS: 2} and backward == {AG: 2, RS: 2}


# --- Zamba2: the shared transformer block of a hybrid layer (plangen.plans.zamba2) -------------


def _zamba2_counts(block_types: list[str], sequence_parallel: bool):
    kinds = installed_layer_kinds(Zamba2Config, block_types)
    kwargs = dict(TINY["zamba2"], num_hidden_layers=len(block_types), layers_block_type=kinds)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    chosen = choose_plan(model, sequence_parallel)
    assert chosen.source == "hand-written"
    counts = _tp2_step_counts(model, chosen.plan)
    return config, counts


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_zamba2_shared_block_reduces_each_projections_input_gradient(fake_pg, sequence_parallel):
    """A hybrid layer costs its Mamba2 mixer (as a Mamba layer does) plus its shared block: o_proj's
    and down_proj's all-reduces forward; backward, each column-parallel projection's input gradient
    (q, k, v, gate|up and the four adapters' up-projections, whose rank-wide input the replicated
    down-projection computes): 8 all-reduces. Under SP the block first gathers its input and the token
    embeddings (2 all-gathers), and ``linear``'s output gradient is gathered back (1) in backward."""
    mamba = ["linear_attention", "linear_attention"]
    _, (f_mamba, b_mamba) = _zamba2_counts(mamba, sequence_parallel)
    config, (f_hybrid, b_hybrid) = _zamba2_counts(["linear_attention", "hybrid"], sequence_parallel)
    diff = lambda a, b: {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}  # noqa: E731
    gathered = {AG: 2} if sequence_parallel else {}
    assert diff(f_mamba, f_hybrid) == {**gathered, AR: 2}
    assert diff(b_mamba, b_hybrid) == {**({AG: 1} if sequence_parallel else {}), AR: 8}


def test_inkling_layer_costs_its_attention_and_moe_blocks_at_their_minimum(fake_pg):
    """Inkling (synthesized): attention split by heads, its k/v short convs with their channels, and
    the MoE block's routed and shared experts. Per MoE layer, forward: o_proj's all-reduce and the MoE
    block's one all-reduce of B·S·H (the routed and the shared experts' partial sums together).
    Backward: the attention's input gradient, the MoE block's input gradient once for both branches
    (B·S·H, MoeBlockParallel: the routed and the shared experts reduced theirs separately, 6 in all),
    the relative-logits bank's (read by every head: d_rel x extent), the routing weights' (B·S·k) and
    the shared experts' per-token scales' (B·S·2), so the router over both stays exact. (The per-head
    norms' gradients are Partial DTensors, reduced when read, as Qwen3's.)"""
    forward, backward, _, _ = per_layer("inkling", False, source="synthesized")
    assert forward == {AR: 2} and backward == {AR: 5}
    config, _, forward_step, backward_step = run_step("inkling", 4, False, source="synthesized")
    bsh, bs = BATCH * SEQ * config.hidden_size * 4, BATCH * SEQ * 4
    layers, moe_layers = config.num_hidden_layers, config.num_hidden_layers - 1  # layer 0: a dense MLP, whole
    assert sorted(size for _, size in forward_step.records) == sorted([bsh] * (layers + moe_layers))
    bank = [config.d_rel * config.sliding_window_size * 4] + [config.d_rel * config.rel_extent * 4] * moe_layers
    expected = [bsh] * (layers + moe_layers + 1) + bank  # + the head's input gradient
    expected += [bs * config.num_experts_per_tok] * moe_layers + [bs * config.n_shared_experts] * moe_layers
    assert sorted(size for _, size in backward_step.records) == sorted(expected)


def test_zaya_layer_reduces_its_experts_once_and_its_routes(fake_pg):
    """Zaya (synthesized): its attention (CCA: convolved q/k, delayed values) stays whole on every
    rank, so only the MoE block communicates: forward one all-reduce of B·S·H (the experts' partial
    sum), backward the experts' input gradient (B·S·H) and the routing weights' (B·S·k)."""
    forward, backward, total_forward, total_backward = per_layer("zaya", False, source="synthesized")
    assert forward == {AR: 1} and backward == {AR: 2}
    assert total_forward == {AR: 2 + 1} and total_backward == {AR: 2 * 2 + 1}  # + the embedding's, the head's
    fwd, bwd, bsh, bsk = _moe_payloads_of("zaya", False, source="synthesized")
    assert sorted({size for _, size in fwd}) == [bsh]
    assert {size for _, size in bwd} == {bsh, bsk}


def test_rwkv_layer_splits_both_mixers_by_channels(fake_pg):
    """RWKV-4 (plangen.styles.rwkv). Forward: the time mixing's output all-reduce; the channel mixing's
    value reduce-scattered onto the receptance's channels and the gated product all-gathered
    (B·S·H each). Backward: each mixer's input gradient (B·S·H), its time_mix_* gradients stacked
    into one small all-reduce (3·H, 2·H), and the all-gather of the value's reduce-scatter."""
    forward, backward, total_forward, total_backward = per_layer("rwkv", False)
    assert forward == {AR: 1, RS: 1, AG: 1}
    assert backward == {AR: 4, AG: 1}
    # Fixed: the embedding's all-reduce forward, the head's input-gradient reduction backward.
    assert total_forward == {AR: 2 + 1, RS: 2, AG: 2} and total_backward == {AR: 4 * 2 + 1, AG: 2}
    config, _, _, b2 = run_step("rwkv", 2, False)
    sums = sorted(size for op, size in b2.records if op in ALL_REDUCES)
    h, tokens = config.hidden_size, BATCH * SEQ
    assert sums == sorted([2 * h * 4, 3 * h * 4] * 2 + [tokens * h * 4] * 5)

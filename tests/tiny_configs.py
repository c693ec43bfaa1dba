"""Tiny random models of real architectures, identical on every process for the same seed."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, NemotronHConfig, Zamba2Config

from plangen.stack.transformers_compat import installed_layer_kinds

COMMON = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    use_cache=False,
)

TINY = {
    "llama": dict(model_type="llama", **COMMON),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True, **COMMON),
    "mistral": dict(model_type="mistral", sliding_window=None, **COMMON),
    "qwen2": dict(model_type="qwen2", **COMMON),
    "qwen3": dict(model_type="qwen3", **COMMON),
    "qwen3-tied": dict(model_type="qwen3", tie_word_embeddings=True, **COMMON),
    "olmo2": dict(model_type="olmo2", **COMMON),
    "olmo3": dict(model_type="olmo3", sliding_window=4, layer_types=["sliding_attention", "full_attention"], **COMMON),
    "gemma3": dict(
        model_type="gemma3_text",
        tie_word_embeddings=True,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=8,
        **COMMON,
    ),
}
# BitNet: RMSNorms over all heads' output (attn_sub_norm) and the intermediate (ffn_sub_norm), synthesized.
TINY["bitnet"] = dict(model_type="bitnet", **COMMON)
# XLM: its layers are lists of blocks (attentions[i], ffns[i], ...) that the model's loop calls by index.
TINY["xlm"] = dict(
    model_type="xlm", vocab_size=128, emb_dim=32, n_heads=4, n_layers=2, causal=True, max_position_embeddings=32
)  # under half the vocabulary: not a token table
# One KV head (Gemma-3-1B's layout): TP 2 replicates it (plangen.styles.kv_heads).
TINY["gemma3-1kv"] = {**TINY["gemma3"], "num_key_value_heads": 1}
TINY["qwen3-1kv"] = {**TINY["qwen3"], "num_key_value_heads": 1}
# Every TP-local matmul at TP 2 at least 16 columns wide: on this CPU's MKL a narrower one (the 8
# columns of a 2-KV-head k_proj) takes another kernel than the full width (plangen.plans.variants).
for _name in ("llama", "qwen3", "gemma3", "olmo2"):
    TINY[f"{_name}-4kv"] = {**TINY[_name], "num_key_value_heads": 4}
# Gemma 4's MoE form (26B-A4B: enable_moe_block): the layer routes to its own experts beside the
# dense MLP; per-layer embeddings kept as in the default config; a sliding and a full layer.
TINY["gemma4-moe"] = dict(
    model_type="gemma4_text",
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=128,
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=8,
    global_head_dim=16,
    **COMMON,
)
# Gemma 4's dense form (E2B/E4B): the same layers and per-layer embeddings without the experts.
TINY["gemma4-dense"] = {
    k: v
    for k, v in TINY["gemma4-moe"].items()
    if k not in ("enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size")
}
TINY["granite-1kv"] = dict(model_type="granite", **{**COMMON, "num_key_value_heads": 1})  # a synthesized plan
# Falcon-40B's layout: packed q|k|v grouped by KV head, [q x heads/kv_heads; k; v] per group.
TINY["falcon-gqa"] = dict(
    model_type="falcon",
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    new_decoder_architecture=True,
    alibi=False,
    bias=False,
    use_cache=False,
)

# Falcon-7B's layout: multi-query, [q of all heads; one k head; one v head] (Falcon-7B itself has 71 heads).
# FalconH1 with distinct MuP multipliers per in_proj part (z, x, B, C, dt): its mup_vector buffer must be
# cut to each rank's features; two B/C groups, Mamba and attention in parallel in every layer.
TINY["falcon_h1-mup"] = dict(
    model_type="falcon_h1",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    mamba_d_ssm=64,
    mamba_n_heads=4,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=8,
    mamba_chunk_size=8,
    ssm_multipliers=[0.5, 1.5, 0.25, 2.0, 0.75],
    use_cache=False,
    max_position_embeddings=64,
)
TINY["falcon-mqa"] = dict(
    model_type="falcon",
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    multi_query=True,
    new_decoder_architecture=False,
    alibi=False,
    bias=False,
    use_cache=False,
)

# Falcon-7B's odd query head count (71) in small: 5 heads, padded with a zero head at TP 2 (plangen.styles.padded_heads).
TINY["falcon-mqa-5h"] = {**TINY["falcon-mqa"], "hidden_size": 40, "num_attention_heads": 5}


def build_tiny(name: str, seed: int = 0, attn_implementation: str = "sdpa") -> torch.nn.Module:
    kwargs = dict(TINY[name])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


# Mamba1 mixers, split by channels (plangen.styles.mamba1): intermediate 64, dt_rank 4, state 8.
MAMBA1 = dict(vocab_size=128, hidden_size=32, state_size=8, expand=2, conv_kernel=4, time_step_rank=4, use_cache=False)
TINY["mamba"] = dict(model_type="mamba", num_hidden_layers=2, **MAMBA1)
TINY["falcon_mamba"] = dict(model_type="falcon_mamba", num_hidden_layers=2, **MAMBA1)
# Jamba with Mamba layers and dense MLPs only (no attention layer below 8 layers, one expert): its
# mixers' dt/B/C norms have weights.
TINY["jamba-mamba"] = dict(
    model_type="jamba",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=1,
    attn_layer_period=8,
    attn_layer_offset=7,
    mamba_d_state=8,
    mamba_dt_rank=4,
    use_mamba_kernels=False,
    use_cache=False,
)
# RecurrentGemma with recurrent blocks only: lru_width 32 in 4 RG-LRU heads of 8 (TP 2: two whole
# heads and 16 channels per rank); its MLP is intermediate_size // 2 wide.
TINY["recurrent_gemma"] = dict(
    model_type="recurrent_gemma",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    block_types=["recurrent"],
    use_cache=False,
)
# Its released layout: two recurrent blocks, then local attention (per-layer plan entries).
TINY["recurrent_gemma-mixed"] = dict(
    TINY["recurrent_gemma"],
    num_hidden_layers=3,
    block_types=["recurrent", "recurrent", "attention"],
    num_key_value_heads=2,
    attention_window_size=4,
)
# xLSTM's mLSTM layers: 4 heads, q/k 16 wide (4 per head), v 32 (8 per head); TP 2 keeps two whole heads.
TINY["xlstm-4h"] = dict(
    model_type="xlstm",
    vocab_size=128,
    hidden_size=32,
    num_heads=4,
    num_hidden_layers=2,
    use_cache=False,
)
TINY["nemotron_h"] = dict(
    model_type="nemotron_h",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    layers_block_type=installed_layer_kinds(NemotronHConfig, ["linear_attention", "moe", "full_attention", "mlp"]),
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    mamba_num_heads=4,
    mamba_head_dim=16,
    ssm_state_size=8,
    n_groups=2,
    chunk_size=8,
    use_mamba_kernels=False,
    max_position_embeddings=64,
    use_cache=False,
)
# One B/C group (GraniteMoeHybrid, Bamba, Zamba2): every TP rank's heads read it, so its rows are
# gathered whole per forward and the gated norm's one group spans the ranks.
TINY["nemotron_h-1g"] = dict(TINY["nemotron_h"], n_groups=1)
# The GPU check's Mamba2 case: every mixer but the MLP, which 5.5.x's NemotronH has not (its config
# refuses the kind), so the case builds on every release of the window.
TINY["nemotron_h-no-mlp"] = dict(
    TINY["nemotron_h"],
    layers_block_type=installed_layer_kinds(NemotronHConfig, ["linear_attention", "moe", "full_attention"]),
)
# Zamba2: Mamba2 layers and hybrid layers whose shared transformer block (one module, num_mem_blocks
# 1) both hybrid layers reuse, with per-layer adapters on q, k, v and gate|up; one B/C group; rotary.
TINY["zamba2"] = dict(
    model_type="zamba2",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    layers_block_type=installed_layer_kinds(Zamba2Config, ["linear_attention", "hybrid", "linear_attention", "hybrid"]),
    num_mem_blocks=1,
    use_shared_attention_adapter=True,
    adapter_rank=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_mamba_heads=4,
    mamba_ngroups=1,
    mamba_d_state=8,
    chunk_size=8,
    use_mem_rope=True,
    max_position_embeddings=64,
    use_cache=False,
)

# Mixture-of-experts: 8 experts, top-2, so that with a 2-rank TP group every rank's experts get
# tokens and, in the parity tests' batches, some expert gets none (the tests check both).
MOE = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.01)
TINY["qwen3_moe"] = dict(
    model_type="qwen3_moe",
    num_experts=8,
    moe_intermediate_size=16,
    norm_topk_prob=True,
    mlp_only_layers=[0],
    decoder_sparse_step=1,
    **MOE,
    **COMMON,
)
# The stable variant's bitwise check (every TP-local matmul at least 16 columns wide, as above).
TINY["qwen3_moe-4kv"] = {**TINY["qwen3_moe"], "num_key_value_heads": 4}
TINY["mixtral"] = dict(model_type="mixtral", num_local_experts=8, sliding_window=None, **MOE, **COMMON)
# One expert per TP rank at TP 2 (Mixtral-8x7B at TP 8 in miniature): FSDP2 must split each expert
# on another dim than the expert dim over DP, or DP 2 holds one expert and one pad of its size.
TINY["mixtral-2-experts"] = dict(TINY["mixtral"], num_local_experts=2)
# 3 experts at TP 2: ExpertsParallel splits each expert's intermediate instead (plangen.styles.experts).
TINY["mixtral-3-experts"] = dict(TINY["mixtral"], num_local_experts=3)
# LongCat-Flash: per layer two latent attentions and two dense MLPs (ModuleLists) and a shortcut MoE
# whose router picks among 4 real and 2 zero-compute (identity) experts.
TINY["longcat_flash"] = dict(
    model_type="longcat_flash",
    vocab_size=128,
    hidden_size=32,
    ffn_hidden_size=64,
    expert_ffn_hidden_size=16,
    num_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    zero_expert_num=2,
    moe_topk=2,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    head_dim=4,
    routed_scaling_factor=1.0,
    max_position_embeddings=64,
    use_cache=False,
)
# JetMoE: experts (one [E, out, in] weight each, called with per-expert token counts) in the MLP and
# in the attention (a mixture of attention heads: 2 query heads per expert, shared k and v).
TINY["jetmoe"] = dict(
    model_type="jetmoe",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_key_value_heads=2,
    kv_channels=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    use_cache=False,
    output_router_logits=True,
)
# HunYuan-MoE-V1's default layout: one routed expert (top-1) beside a shared MLP; a synthesized plan.
TINY["hunyuan_v1_moe"] = dict(model_type="hunyuan_v1_moe", num_experts=1, moe_topk=1, **COMMON)
TINY["qwen2_moe"] = dict(
    model_type="qwen2_moe",
    num_experts=8,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=32,
    **MOE,
    **COMMON,
)
TINY["glm4_moe"] = dict(
    model_type="glm4_moe",
    n_routed_experts=8,
    moe_intermediate_size=16,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    use_qk_norm=True,
    partial_rotary_factor=0.5,
    **MOE,
    **COMMON,
)
TINY["deepseek_v3"] = dict(
    model_type="deepseek_v3",
    n_routed_experts=8,
    moe_intermediate_size=16,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    rope_interleave=True,
    **MOE,
    **dict(COMMON, head_dim=4, num_key_value_heads=4),
)
# gpt-oss: biases everywhere (q/k/v/o, router, experts), one sink logit per head, sliding-window
# layers (window 4 < the tests' 8 tokens) alternating with full ones; eager attention (no sdpa).
TINY["gpt_oss"] = dict(
    model_type="gpt_oss",
    num_local_experts=8,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"],
    **MOE,
    **dict(COMMON, intermediate_size=16),
)
# The four with 32 experts: 32 routes per layer on a DP rank's 16 tokens leave about a third of the
# experts without a token (the empty path) while each TP rank's 16 still get some (8 experts rarely
# leave one idle at these batches). Expert counts live under the class's own key.
EXPERT_KEY = {
    "qwen3_moe": "num_experts",
    "mixtral": "num_local_experts",
    "deepseek_v3": "n_routed_experts",
    "gpt_oss": "num_local_experts",
}
for _name, _key in EXPERT_KEY.items():
    TINY[f"{_name}-32e"] = {**TINY[_name], _key: 32}
# DeepSeek-V2-Lite's shape: no query latent (q_proj straight from the hidden state), dense first layer.
TINY["deepseek_v2"] = dict(
    model_type="deepseek_v2",
    n_routed_experts=8,
    moe_intermediate_size=16,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    topk_method="greedy",
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    **MOE,
    **dict(COMMON, head_dim=4, num_key_value_heads=4),
)

# Youtu: dense MLA whose query latent is sharded over TP (plangen.plans.families.latent.shards_query_latent); its
# query and KV latents of distinct widths, so their collectives tell apart by size; tied embeddings.
TINY["youtu"] = dict(
    model_type="youtu",
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    tie_word_embeddings=True,
    **dict(COMMON, head_dim=4, num_key_value_heads=4),
)

# Inkling: a router over 8 routed and 2 shared experts (its weight [10, H], a learned global_scale),
# the shared experts 3-D weights applied by bmm and scaled per token by the router; attention with
# short convs on k and v and relative logits; layer 0 sliding-window with a dense MLP (its own
# global_scale), the other layers full attention with the MoE block.
TINY["inkling"] = dict(
    model_type="inkling_text",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
    d_rel=4,
    rel_extent=8,
    sliding_window_size=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=2,
    max_position_embeddings=64,
    use_cache=False,
    local_layer_ids=[0],
    dense_mlp_idx=1,
)

# Zaya: a router MLP scoring 4 experts and a skip expert (no compute) from a 16-wide router state
# that each layer hands the next; its convolutional attention (CCA) stays whole; top-1 (all ZAYA supports).
TINY["zaya"] = dict(
    model_type="zaya",
    vocab_size=128,
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=1,
    router_hidden_size=16,
    max_position_embeddings=64,
    use_cache=False,
)
# Qwen3-Next-80B-A3B's shared expert is exactly as wide as its expert count (512 and 512): its
# gate_proj, [experts, hidden] like a router's weight, once made the synthesizer keep the shared
# expert whole as a router, whose whole output the block's reduction then summed once per TP rank.
TINY["qwen3_next-shared-as-wide-as-experts"] = dict(
    model_type="qwen3_next",
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention", "full_attention"],
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=4,
    **COMMON,
)

# Fused projections: qkv_proj packs [q; k; v] with GQA (4 heads, 2 kv heads), gate_up_proj [gate; up].
TINY["phi3"] = dict(model_type="phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON)
# The same with 8 heads of 4 and 4 KV heads: its fused layout at TP 4 too (a checkpoint resumed there).
TINY["phi3-8h"] = {**TINY["phi3"], "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4}
# GPT-2-style Conv1D projections (weights [in, out]) and a fused c_attn of equal q, k, v; tied head.
GPT = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=64)
TINY["gpt2"] = dict(model_type="gpt2", n_inner=64, use_cache=False, **GPT)
TINY["openai-gpt"] = dict(model_type="openai-gpt", **GPT)
# Llama-4: every expert runs on every token (scores 0 off the top-k), a shared expert, top-1; layer 0
# dense (interleave step 2, Maverick's pattern), layer 1 MoE.
TINY["llama4"] = dict(
    model_type="llama4_text",
    num_local_experts=8,
    num_experts_per_tok=1,
    intermediate_size=16,
    intermediate_size_mlp=64,
    interleave_moe_layer_step=2,
    attention_chunk_size=4,
    **{k: v for k, v in COMMON.items() if k != "intermediate_size"},
)
TINY["llama4-moe"] = dict(TINY["llama4"], interleave_moe_layer_step=1)  # every layer MoE (Scout's pattern)
# The stable variant's bitwise check: 4 KV heads, and the shared expert 32 wide (16 columns per rank at TP 2).
TINY["llama4-4kv"] = dict(TINY["llama4"], num_key_value_heads=4, intermediate_size=32)
# Qwen3.5 with only gated-delta-net layers (the mixer's cost alone): 2 key heads, 2 value heads each.
TINY["qwen3_5-linear"] = dict(
    model_type="qwen3_5_text",
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention"] * 2,
    **COMMON,
)
# The same at TP 4 (benchmarks/gpu_check.py): 4 key heads, 8 value heads, 4 KV heads.
TINY["qwen3_5-linear-4h"] = {
    **TINY["qwen3_5-linear"],
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "num_key_value_heads": 4,
}
# DBRX: a norm-attention-norm wrapper around a fused Wqkv (one KV head, the default config's
# layout, and 2 KV heads split with the queries) and experts as flat [E * ffn, H] weights; top-2 of
# 4 experts so every TP-2 rank's experts get routes.
TINY["dbrx"] = dict(
    model_type="dbrx",
    vocab_size=128,
    d_model=32,
    n_heads=4,
    n_layers=2,
    max_seq_len=64,
    use_cache=False,
    attn_config=dict(kv_n_heads=1, clip_qkv=8.0, rope_theta=10000.0),
    ffn_config=dict(ffn_hidden_size=16, moe_num_experts=4, moe_top_k=2),
    output_router_logits=True,
)
TINY["dbrx-2kv"] = dict(TINY["dbrx"], attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0))
# 3 experts at TP 2: each expert's ffn rows split (the w1/v1/w2 rows re-laid out per rank inside).
TINY["dbrx-3-experts"] = dict(TINY["dbrx"], ffn_config=dict(ffn_hidden_size=16, moe_num_experts=3, moe_top_k=2))
# CpmAnt: attention and MLP one level down in each layer, a [buckets, heads] relative position bias
# table (16 + 4 x 4 segment rows, 4 heads) computed once and handed to every layer; 4 prompt tokens
# of type 2 are prepended (the token embedding has 128 + 4 x 4 rows).
TINY["cpmant"] = dict(
    model_type="cpmant",
    vocab_size=128,
    hidden_size=32,
    num_attention_heads=4,
    dim_head=8,
    dim_ff=64,
    num_hidden_layers=2,
    prompt_types=4,
    prompt_length=4,
    segment_types=4,
    position_bias_num_buckets=16,
    position_bias_max_distance=32,
    init_std=0.02,
    use_cache=False,
)
# RWKV-4: time mixing 32 channels wide (16 per rank at TP 2), channel mixing 64; rescale_every off.
TINY["rwkv"] = dict(
    model_type="rwkv",
    vocab_size=128,
    hidden_size=32,
    attention_hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    context_length=64,
    rescale_every=0,
    use_cache=False,
)

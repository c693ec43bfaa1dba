"""Config keys by what they size, across the architectures of transformers.

One table, read by the shrinker (:mod:`plangen.model.shrink`: what to make tiny and what to keep) and by
``plangen cost``'s probes and depth extrapolation (:mod:`plangen.cost.probe_configs`,
:mod:`plangen.cost.depth`: which widths and layer counts to vary).
"""

from __future__ import annotations

# (attention heads, key/value heads or None) pairs. The first present pair fixes the head size.
HEAD_KEYS: tuple[tuple[str, str | None], ...] = (
    ("num_attention_heads", "num_key_value_heads"),
    ("num_attention_heads", "num_kv_heads"),
    ("num_attention_heads", "n_head_kv"),
    ("num_attention_heads", "multi_query_group_num"),
    ("num_attention_heads", None),
    ("num_heads", "num_key_value_heads"),
    ("num_heads", None),
    ("n_head", None),
    ("n_heads", "kv_n_heads"),
    ("n_heads", None),
    ("decoder_attention_heads", None),
    ("encoder_attention_heads", None),
    ("swa_num_attention_heads", "swa_num_key_value_heads"),
    ("linear_num_value_heads", "linear_num_key_heads"),
    ("linear_num_heads", None),
    ("index_n_heads", None),
)
# Differential attention (DiffLlama's lambda initialisation): head i is paired with head i + H/2.
PAIRED_HEADS_KEYS = ("lambda_std_dev",)
# Models whose own code views the attention heads in a fixed number of blocks: a head count that
# many blocks do not divide leaves a block without heads. CodeGen's mp_num is 4 in every release
# (5.5.x-5.8.x view n_head // 4 heads per block: 2 heads give 0).
HEAD_BLOCKS = {"codegen": 4}
HEAD_DIM_KEYS = (
    "head_dim",
    "attention_head_dim",
    "d_kv",
    "kv_channels",
    "swa_head_dim",
    "v_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_head_dim",
    "index_head_dim",
    "qk_head_dim",
    "d_head",
    "dim_head",
)
HIDDEN_KEYS = (
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "dim",
    "embedding_size",
    "embedding_dim",
    "lru_width",
)
# The token embedding's own width, where a model may project it to the hidden size (OPT-350m's
# 512 into 1024): equal to the hidden size stays equal (no projection the real model lacks),
# different stays different.
EMBEDDING_WIDTH_KEYS = ("word_embed_proj_dim",)
# Widths of side inputs that only need to stay small (Gemma-3n per-layer embeddings).
SMALL_WIDTH_KEYS = ("hidden_size_per_layer_input",)
INTERMEDIATE_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "decoder_ffn_dim",
    "encoder_ffn_dim",
    "d_ff",
    "ffn_hidden_size",
    "dim_ff",
)
EXPERT_COUNT_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "zero_expert_num",
)
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "top_k_experts")
SHARED_EXPERT_KEYS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
EXPERT_GROUP_KEYS = ("n_group", "num_expert_group", "topk_group")
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
OTHER_LAYER_COUNT_KEYS = (
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
    "depth",
    "num_blocks",
)
# Scalars counting leading layers of one kind (dense before MoE, and so on) or trailing ones.
LEADING_LAYER_KEYS = ("first_k_dense_replace", "num_dense_layers")
TRAILING_LAYER_KEYS = ("num_kv_shared_layers",)
# Every n-th layer is of another kind; 2 keeps both kinds inside the tiny layer count.
LAYER_PERIOD_KEYS = (
    "sliding_window_pattern",
    "no_rope_layer_interval",
    "global_attn_every_n_layers",
    "attn_layer_period",
    "expert_layer_period",
    "full_attention_interval",
    "layer_group_size",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
)
# (heads, head size, expansion) of state-space mixers, whose inner width is expansion x hidden.
STATE_SPACE_HEADS = (
    ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
    ("num_heads", "head_dim", "expand"),
    ("mamba_num_heads", "mamba_head_dim", "expand"),
)
STATE_SIZE_KEYS = ("state_size", "mamba_d_state", "ssm_state_size")
# A state-space mixer's B/C groups and the rank of its time-step projection.
STATE_SPACE_GROUP_KEYS = ("n_groups", "mamba_n_groups")
TIME_STEP_RANK_KEYS = ("time_step_rank", "mamba_dt_rank")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
# Musicgen's input rows are batch x codebooks: two codebooks keep the layout and let a DP rank's
# two rows of the checks' batch of four be one sample.
CODEBOOK_KEYS = ("num_codebooks",)
SLIDING_WINDOW_KEYS = (
    "sliding_window",
    "sliding_window_size",
    "attention_window",
    "attention_chunk_size",
)


def sets_layer_kinds(key: str, value: object) -> bool:
    """Whether config entry ``key`` = ``value`` lays out layers of other kinds by count: leading or
    trailing layers of another kind, or every n-th layer (a period of 1 is every layer: no other kind)."""
    if key in LEADING_LAYER_KEYS + TRAILING_LAYER_KEYS:
        return bool(value)
    return key in LAYER_PERIOD_KEYS and isinstance(value, int) and not isinstance(value, bool) and value > 1

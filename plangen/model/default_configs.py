"""Fields that transformers' default configs leave unset although their model classes read them.

A class named without a config (``plangen list``, the sweep, ``plangen init dots1``) is built from
its default config. A few of transformers' defaults (5.x) leave a field ``None`` that the modeling
code then reads as a number or a list, so the class does not build at all. Each fix here states the
value of the released model the class is for (or, where none is documented, the rule used), and is
applied to default configs only, never to a config the user gave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PretrainedConfig


def _hunyuan_head_dim(config: Any) -> dict[str, Any]:
    # The attention reads getattr(config, "head_dim", hidden // heads): the field exists, so None.
    return {"head_dim": config.hidden_size // config.num_attention_heads}


def _dots1_experts(config: Any) -> dict[str, Any]:
    # dots.llm1: 128 routed experts, 6 per token, 2 shared, the first layer dense.
    return {"n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2, "first_k_dense_replace": 1}


def _lfm2_moe_layer_types(config: Any) -> dict[str, Any]:
    # No default pattern: one attention layer in four (LFM2-8B-A1B has 6 in 24), the rest conv.
    count = config.num_hidden_layers
    return {"layer_types": ["full_attention" if i % 4 == 3 else "conv" for i in range(count)]}


def _xmod_language(config: Any) -> dict[str, Any]:
    # X-MOD runs one language adapter per input, chosen by lang_ids or the default language, which
    # the default config leaves unset (users call set_default_language): its first language.
    return {"default_language": config.languages[0]}


def _dbrx_rope_theta(config: Any) -> dict[str, Any]:
    # DBRX (databricks/dbrx-base): attn_config.rope_theta 500000. transformers 5.x's attention
    # config has no such field, yet the attention reads it (and the rotary embedding reads the same
    # value from rope_parameters, whose default is 10000): both get the released value.
    config.attn_config.rope_theta = 500000.0
    # clip_qkv 8 as released: at None the attention clamps with neither bound, which torch refuses.
    if config.attn_config.clip_qkv is None:
        config.attn_config.clip_qkv = 8.0
    return {"rope_parameters": {**(config.rope_parameters or {}), "rope_theta": 500000.0}}


def _qwen4_exp_indexer(config: Any) -> dict[str, Any]:
    # Qwen4-Exp's released text config: a QSA indexer of 4 query heads and the 1 key head its
    # validation requires, 128 wide, selecting 2048 tokens in blocks of 4. Its attention rotates a
    # quarter of each 256-wide head (partial_rotary_factor 0.25), which is what lets the 64 rotary
    # dims fit the 128-wide index head (validated once the indexer is set; the default rotates all).
    rope = {**(config.rope_parameters or {}), "partial_rotary_factor": 0.25}
    return {
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 128,
        "indexer_budget": 2048,
        "indexer_compress_ratio": 4,
        "rope_parameters": rope,
    }


# model_type -> (the field that is None or missing, dotted below the config; what to set).
_FIXES: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "hunyuan_v1_moe": ("head_dim", _hunyuan_head_dim),
    "dots1": ("n_routed_experts", _dots1_experts),
    "lfm2_moe": ("layer_types", _lfm2_moe_layer_types),
    "xmod": ("default_language", _xmod_language),
    "dbrx": ("attn_config.rope_theta", _dbrx_rope_theta),
    "qwen4_exp_text": ("indexer_n_heads", _qwen4_exp_indexer),
}


def _read_field(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name, None)
    return config


def complete_default_config(config: "PretrainedConfig") -> "PretrainedConfig":
    """``config`` (a default one) with the fields its class needs filled in where they are unset."""
    fix = _FIXES.get(getattr(config, "model_type", ""))
    if fix is None or _read_field(config, fix[0]) is not None:
        return config
    for name, value in fix[1](config).items():
        setattr(config, name, value)
    return config

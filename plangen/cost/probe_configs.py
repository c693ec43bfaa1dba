"""The configs ``plangen cost``'s probes measure: a shrunk config at odd base widths, scaled by each
probe's factors, with more layers or with the real model's small widths; and the dimensions
collective sizes are made of, read off a config.

Pure functions of a config (copies, never the caller's); :mod:`plangen.cost.measure` runs them.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any, Mapping

from plangen.model.config_keys import (
    EXPERTS_PER_TOKEN_KEYS,
    LEADING_LAYER_KEYS,
    STATE_SIZE_KEYS,
    STATE_SPACE_GROUP_KEYS,
    STATE_SPACE_HEADS,
    TIME_STEP_RANK_KEYS,
    sets_layer_kinds,
)
from plangen.cost.settings import CostError
from plangen.cost.widths import apply_width_relations, width_relations
from plangen.model.resolve import text_config

# Base widths of the measured model, in units of the TP size: odd multiples, so that a logits
# gather (B·S·V) and an MLP gather (B·S·I) cannot have the same size by accident, as the powers of
# two of shrink_config would (V = 2 I). The vocabulary stays above shrink_config's special token ids.
BASE_VOCAB_PER_RANK = 139
BASE_INTERMEDIATE_PER_RANK = 67
MIN_BASE_VOCAB = 256
# Config attributes of each scaled dimension (on the text config).
DIMENSION_KEYS = {
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads", "num_key_value_heads"),
    # Latent attention (DeepSeek, Kimi, GLM-MoE-DSA...) has several head sizes, with head_dim the rotary
    # part's: a probe scales them together, or rotary and projections disagree. So does the sparse
    # attention's indexer (DeepSeek-V3.2, GLM-MoE-DSA), whose heads hold a rotary part as wide: left
    # at the shrunk width, the latent base sizes (x3) made it narrower than its rotary part.
    "head_dim": ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim", "v_head_dim", "index_head_dim"),
    "intermediate": ("intermediate_size",),
    "vocab": ("vocab_size",),
    # Latent attention's low ranks: its sharded plan all-reduces gradients of B·S·rank.
    "q_latent": ("q_lora_rank",),
    "kv_latent": ("kv_lora_rank",),
    # The expert count, under whichever name the class gives it: Llama-4's every-token experts
    # all-reduce the gradient of the router's scores (B·S·E) in backward.
    # (DBRX keeps both in its ffn_config: a dotted key is a sub-config's.)
    "experts": (
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "moe_num_experts",
        "ffn_config.moe_num_experts",
    ),
    # The experts each token is routed to: the routing weights' gradient is B·S·k (all-reduced backward).
    "topk": (*EXPERTS_PER_TOKEN_KEYS, "ffn_config.moe_top_k"),
    # Gemma 4's per-layer inputs: each token looks up layers x hidden_size_per_layer_input in a
    # vocabulary-parallel table (all-reduced once per step: B·S·L·Hp, the layer count L read off the run
    # with more layers, plangen.cost.scaling.layer_exponents), and each layer's gate and projection
    # are Hp x H (their gradients all-reduced under sequence parallel).
    "layer_inputs": ("hidden_size_per_layer_input",),
}
# Gemma 4's per-layer input width at the base: odd, so that B·S·L·Hp meets no other product.
BASE_LAYER_INPUTS = 9
# Tokens a model prepends to every sequence inside its forward (CpmAnt's prompt): its layers see
# S + P tokens, its head S ("tokens" in plangen.cost.scaling.LETTERS).
PROMPT_KEYS = ("prompt_length",)
# Dimensions whose keys are alternative names of one attribute (the first the config has counts),
# not companions read from the first and scaled together.
ALTERNATIVE_KEYS = frozenset({"experts", "topk"})
# Base ranks of latent attention: distinct, so the query and KV latents' gradients (and nothing else)
# have the sizes they have, the query's an odd multiple of the TP size (a plan may split it:
# plangen.plans.families.latent.shards_query_latent); and an odd multiple of its head sizes, so the rope key's
# gradient (B·S·rope in bf16) does not meet the routing weights' (B·S·k in fp32) at rope = 2k.
BASE_Q_LATENT_PER_RANK, BASE_KV_LATENT = 37, 29
# The head size's factor at the base, where heads x head size is the hidden size or a head size meets
# the hidden size or a head count: the first that leaves every head size apart (config_with_base_sizes).
HEAD_DIM_FACTORS = (2, 3, 5, 7)
LATENT_HEAD_FACTOR = 3


def read_dimensions(config: Any, batch: int, seq: int) -> dict[str, int]:
    """The dimensions collective sizes are made of, as this config has them."""
    text = text_config(config)
    dims = {"batch": batch, "seq": seq}
    for name in DIMENSION_KEYS:
        value = dimension_value(text, name)
        if isinstance(value, int) and value > 0:
            dims[name] = value
    layers = config_value(text, "num_hidden_layers")
    if is_int(layers):
        dims["layers"] = layers
    if "head_dim" not in dims and "hidden" in dims and "heads" in dims:
        dims["head_dim"] = dims["hidden"] // dims["heads"]
    prompt = prompt_tokens(text)
    if prompt:
        dims["tokens"] = seq + prompt
    return dims


def prompt_tokens(text: Any) -> int | None:
    """How many tokens the model prepends to the sequence itself (:data:`PROMPT_KEYS`), or None."""
    value = next((config_value(text, k) for k in PROMPT_KEYS if is_int(config_value(text, k))), None)
    return value if value else None


def config_with_tokens(config: Any, seq: int, tokens: int) -> Any:
    """A copy of ``config`` whose layers see ``tokens`` tokens for a sequence of ``seq``: its prompt
    made ``tokens - seq`` long, so that a probe multiplies S and S + P each by a prime of its own."""
    config = copy.deepcopy(config)
    text = text_config(config)
    setattr(text, next(k for k in PROMPT_KEYS if is_int(config_value(text, k))), tokens - seq)
    return config


def dimension_value(text: Any, name: str) -> Any:
    """The config's value of dimension ``name`` (None where it has none)."""
    keys = DIMENSION_KEYS[name]
    if name in ALTERNATIVE_KEYS:
        return next((config_value(text, k) for k in keys if type(config_value(text, k)) is int), None)
    return config_value(text, keys[0])


def count_layers(config: Any) -> int:
    layers = getattr(text_config(config), "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise CostError(f"{type(config).__name__} has no num_hidden_layers: cannot scale per-layer collectives")
    return layers


def config_with_base_sizes(config: Any, tp_size: int) -> Any:
    """A copy of a shrunk config with the odd base widths the measurement starts from."""
    config = copy.deepcopy(config)
    text = text_config(config)
    if isinstance(config_value(text, "vocab_size"), int):
        units = max(BASE_VOCAB_PER_RANK, -(-MIN_BASE_VOCAB // tp_size) | 1)
        set_config_value(text, "vocab_size", units * tp_size)
    if isinstance(config_value(text, "intermediate_size"), int):
        set_config_value(text, "intermediate_size", BASE_INTERMEDIATE_PER_RANK * tp_size)
    heads, kv_heads, head_dim, hidden = (
        config_value(text, k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")
    )
    derived = isinstance(getattr(type(text), "head_dim", None), property)  # Falcon's: hidden // heads, not settable
    if all(isinstance(v, int) for v in (heads, head_dim, hidden)) and not derived:
        # Attention as wide as the hidden state would give a gather of the attention output (B·S·N·D)
        # and one of the hidden state (B·S·H) the same size at the base, which scaling cannot tell
        # apart: the stable plan variant (plangen.plans.variants) has both. Nor may a head be as wide as
        # the hidden state: under sequence parallel a per-head norm's gradient (D) is all-reduced beside
        # the norms' (H), and x2 made them one size for Dots1's 2 shrunk heads and Gemma 4's
        # full-attention layers (twice the head size of the others, so 4 heads). Nor as many as the
        # heads: Flint's attention sinks (one per head, 16) could not be told from a head (16 wide),
        # and the shrunk model's plan left its attention whole (the real model's splits it).
        sizes = {head_dim, *(layer["head_dim"] for layer in layer_values(text) if "head_dim" in layer)}

        def meets(factor: int) -> bool:
            return any(size * factor in (hidden, heads, kv_heads) for size in sizes)

        if heads * head_dim == hidden or meets(1):
            factor = next(f for f in HEAD_DIM_FACTORS if not meets(f))
            set_config_value(text, "head_dim", head_dim * factor)
    if isinstance(config_value(text, "kv_lora_rank"), int):
        set_config_value(text, "kv_lora_rank", BASE_KV_LATENT)
        if isinstance(config_value(text, "q_lora_rank"), int):
            set_config_value(text, "q_lora_rank", BASE_Q_LATENT_PER_RANK * tp_size)
        for key in DIMENSION_KEYS["head_dim"]:
            if isinstance(config_value(text, key), int):
                set_config_value(text, key, config_value(text, key) * LATENT_HEAD_FACTOR)
    key = DIMENSION_KEYS["layer_inputs"][0]
    if is_int(config_value(text, key)) and config_value(text, key) > 0:
        set_config_value(text, key, BASE_LAYER_INPUTS)
    return scaled_config(config, width_relations(config).base_factors)


# Widths no probe scales that a collective can carry (Mamba1's x_proj output, all-reduced per mixer:
# B·S·(dt_rank + 2 x state), a sum of sizes where the probes read products): measured at the real
# model's value, so their bytes are the real ones.
REAL_WIDTH_KEYS = (*TIME_STEP_RANK_KEYS, *STATE_SIZE_KEYS)
# Mamba-2's B/C groups (STATE_SPACE_GROUP_KEYS): shrunk to one, which plangen.styles.mamba2 lays out
# otherwise (one group gathered per forward, its norm's statistics summed) than groups split over TP.
STATE_SPACE_HEAD_KEYS = tuple(keys[0] for keys in STATE_SPACE_HEADS)


def config_with_real_widths(config: Any, real: Any, tp_size: int) -> Any:
    """A copy of a shrunk config with the ``REAL_WIDTH_KEYS`` of the real config ``real``, and its
    state-space groups split over TP where the real ones are (``tp_size`` groups)."""
    config = copy.deepcopy(config)
    text, real_text = text_config(config), text_config(real)
    for key in REAL_WIDTH_KEYS:
        value = config_value(real_text, key)
        if is_int(value) and is_int(config_value(text, key)):
            set_config_value(text, key, value)
    heads = next((config_value(text, k) for k in STATE_SPACE_HEAD_KEYS if is_int(config_value(text, k))), None)
    for key in STATE_SPACE_GROUP_KEYS:
        groups = config_value(real_text, key)
        if is_int(groups) and groups > 1 and groups % tp_size == 0 and heads and heads % tp_size == 0:
            set_config_value(text, key, tp_size)
    return config


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def state_space_heads(text: Any) -> tuple[str, str, str] | None:
    """The (heads, head size, expansion) keys of a Mamba-2-style mixer whose heads x head size is
    expansion x hidden, or None (plangen.model.config_keys' table of them)."""
    hidden = config_value(text, "hidden_size")
    for keys in STATE_SPACE_HEADS:
        heads, dim, expand = (config_value(text, k) for k in keys)
        if all(is_int(v) for v in (heads, dim, expand, hidden)) and heads * dim == expand * hidden:
            return keys
    return None


def scaled_config(config: Any, factors: Mapping[str, int]) -> Any:
    """A copy of ``config`` with each dimension in ``factors`` multiplied by its factor; a
    state-space mixer's heads follow the hidden size (its inner width is expansion x hidden)."""
    config = copy.deepcopy(config)
    text = text_config(config)
    mixer = state_space_heads(text)
    if mixer is not None and "hidden" in factors:
        set_config_value(text, mixer[0], config_value(text, mixer[0]) * factors["hidden"])
    for name, factor in factors.items():
        keys = DIMENSION_KEYS[name]
        if name in ALTERNATIVE_KEYS:
            # One attribute under several names (gpt-oss maps num_experts to num_local_experts):
            # scaling each name would scale it again.
            keys = tuple(k for k in keys if type(config_value(text, k)) is int)[:1]
        for key in keys:
            value = config_value(text, key)
            if isinstance(value, int):
                set_config_value(text, key, value * factor)
    return apply_width_relations(config)


def config_with_extra_layer(config: Any, index: int) -> Any | None:
    """A copy with one more layer like layer ``index``, appended; None where the layers' kinds are
    not per-layer lists alone (index lists, leading, trailing or periodic layer counts would move)."""
    from plangen.model.shrink import is_layer_index_list

    text = text_config(config)
    layers = count_layers(config)
    if any(
        is_layer_index_list(key, value, layers) or sets_layer_kinds(key, value) for key, value in vars(text).items()
    ):
        return None
    lists = [key for key, value in vars(text).items() if isinstance(value, list) and len(value) == layers]
    if not lists:
        return None
    config = copy.deepcopy(config)
    text = text_config(config)
    for key in lists:
        getattr(text, key).append(getattr(text, key)[index])
    set_layer_count(text, [*range(layers), index])
    return apply_width_relations(config)


def config_with_more_layers(config: Any, factor: int = 2) -> Any:
    """A copy with ``factor`` times the layers; per-layer lists (layer kinds) repeat their pattern, so do
    lists of layer indices (Llama-4's ``moe_layers``: ``[0, 1]`` becomes ``[0, 1, 2, 3]``, not the
    per-layer repeat ``[0, 1, 0, 1]``, which left the added layers dense and their collectives uncounted),
    and a count of leading layers of another kind (DeepSeek's dense first layers) grows with them."""
    from plangen.model.shrink import is_layer_index_list

    config = copy.deepcopy(config)
    text = text_config(config)
    layers = count_layers(config)
    for key, value in list(vars(text).items()):
        if is_layer_index_list(key, value, layers):
            setattr(text, key, [i + k * layers for k in range(factor) for i in value])
        elif isinstance(value, list) and len(value) == layers:
            setattr(text, key, value * factor)
        elif key in LEADING_LAYER_KEYS and isinstance(value, int) and not isinstance(value, bool):
            setattr(text, key, value * factor)
    set_layer_count(text, [i % layers for i in range(layers * factor)])
    return apply_width_relations(config)


# ---------------------------------------------------------------------------------------------
# Per-layer values: transformers' heterogeneous configs (``per_layer_config``), whose per-layer
# attributes raise when read model-wide (AmbiguousGlobalPerLayerAttributeError). Gemma 4's
# full-attention layers have their own head_dim (twice the sliding layers'): a probe that scales
# head_dim must scale theirs too, or its growth is not one prime's and the layers of a kind differ.


def config_value(text: Any, key: str, default: Any = None) -> Any:
    """``text``'s model-wide value of ``key`` (the value of the layers without an override, where it
    is a per-layer attribute; :func:`set_config_value` keeps the overrides in ratio to it; a dotted
    key is a sub-config's)."""
    if "." in key:
        parent, key = key.rsplit(".", 1)
        text = config_value(text, parent)
        return default if text is None else getattr(text, key, default)
    if key in (getattr(text, "per_layer_attributes", None) or ()):
        return text._getattr_without_heterogeneous_validation(key, default)
    return getattr(text, key, default)


def layer_values(text: Any) -> list[dict[str, Any]]:
    """Each layer's values of the config's per-layer attributes ([] where it has none)."""
    keys = getattr(text, "per_layer_attributes", None)
    if not keys:
        return []
    return [{key: getattr(layer, key) for key in keys} for layer in text.per_layer_config]


def set_config_value(text: Any, key: str, value: Any) -> None:
    """Set ``key`` model-wide; where it is a per-layer attribute, or the config lists it by layer
    (``<key>_per_layer``: Laguna's ``num_attention_heads_per_layer``, which its attention reads), each
    layer's value is multiplied by the same ratio (exactly: a ratio that leaves a fraction is refused)."""
    if "." in key:
        parent, leaf = key.rsplit(".", 1)
        setattr(config_value(text, parent), leaf, value)
        return
    old, layers = config_value(text, key), layer_values(text)
    setattr(text, key, value)
    listed = getattr(text, f"{key}_per_layer", None)
    if isinstance(listed, list) and all(is_int(v) for v in listed):
        setattr(text, f"{key}_per_layer", [_in_ratio(key, v, old, value) for v in listed])
    if not layers or key not in layers[0]:
        return
    for values in layers:
        values[key] = _in_ratio(key, values[key], old, value)
    text.per_layer_config = dict(enumerate(layers))


def _in_ratio(key: str, layer_value: int, old: int, new: int) -> int:
    scaled = Fraction(layer_value) * Fraction(new, old)
    if scaled.denominator != 1:
        raise CostError(
            f"{key} differs by layer ({layer_value} where the model has {old}): set to {new}, it would not stay whole"
        )
    return int(scaled)


def set_layer_count(text: Any, like: list[int]) -> None:
    """Give ``text`` ``len(like)`` layers, layer ``i`` with the per-layer values of layer ``like[i]``."""
    layers = layer_values(text)
    text.num_hidden_layers = len(like)
    if layers:
        text.per_layer_config = {i: layers[old] for i, old in enumerate(like)}

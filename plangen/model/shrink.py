"""Tiny models of a real architecture, for the numerical checks of a plan.

The numerical checks (``plangen verify --run``, ``plangen cost``'s measurements, the parity tests
and the plan sweep) need real weights, but only for the architecture, not the size:
:func:`shrink_config` keeps what decides how tensor parallelism shards a model (head ratios,
tying, layer kinds, special modules) and drops everything else to toy sizes, and
:func:`build_tiny_model` builds it on CPU with weights fixed by a seed. Resolving what a user
names and the meta-device build stay in :mod:`plangen.model.resolve`; towers' sizes in :mod:`plangen.model.shrink_towers`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from plangen.model.config_keys import (
    HEAD_BLOCKS,
    HEAD_KEYS,
    PAIRED_HEADS_KEYS,
    HEAD_DIM_KEYS,
    HIDDEN_KEYS,
    EMBEDDING_WIDTH_KEYS,
    SMALL_WIDTH_KEYS,
    INTERMEDIATE_KEYS,
    EXPERT_COUNT_KEYS,
    EXPERTS_PER_TOKEN_KEYS,
    SHARED_EXPERT_KEYS,
    EXPERT_GROUP_KEYS,
    LAYER_COUNT_KEYS,
    OTHER_LAYER_COUNT_KEYS,
    LEADING_LAYER_KEYS,
    TRAILING_LAYER_KEYS,
    LAYER_PERIOD_KEYS,
    STATE_SPACE_HEADS,
    STATE_SIZE_KEYS,
    POSITION_KEYS,
    CODEBOOK_KEYS,
    SLIDING_WINDOW_KEYS,
    STATE_SPACE_GROUP_KEYS,
    TIME_STEP_RANK_KEYS,
)
from plangen.model.resolve import ModelSource, resolve_config_and_class
from plangen.model.shrink_towers import shrink_tower_sizes

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PretrainedConfig, PreTrainedModel


# Toy sizes. Small enough that a model builds and runs in milliseconds on CPU, large enough that
# sharding by a few ranks still leaves every rank a real slice.
TINY_VOCAB = 256
TINY_INTERMEDIATE = 128
TINY_MOE_INTERMEDIATE = 64
TINY_MAX_POSITIONS = 64
TINY_SLIDING_WINDOW = 4
TINY_EXPERTS = 4
TINY_LORA_RANK = 32
# Special token ids past the tiny vocabulary (image placeholders, Llama-3's 128000+) move to its
# top ids, so random input ids below ``TINY_VOCAB - SPECIAL_TOKEN_SPAN`` never hit an image
# placeholder; small ids (bos 1, pad 0) keep their value.
SPECIAL_TOKEN_SPAN = 32
# Handled by PretrainedConfig itself rather than declared as fields.
_ALWAYS_PASSED_KEYS = {
    "transformers_version",
    "_name_or_path",
    "model_type",
    "output_attentions",
    "per_layer_config",
}
_MIN_HEAD_DIM = 8
_TARGET_HIDDEN = 64

TINY_CODEBOOKS = 2


def build_tiny_model(
    source: ModelSource,
    model_class: type["PreTrainedModel"] | None = None,
    *,
    tp_size: int = 2,
    seed: int = 0,
    dtype: "torch.dtype | None" = None,
    attn_implementation: str = "sdpa",
) -> "PreTrainedModel":
    """Build a small CPU model of the same architecture, with weights fixed by ``seed``.

    Every process that calls this with the same arguments gets bit-identical weights, which is
    what lets multi-process checks build their reference model locally instead of broadcasting
    it. The global RNG is left as it was. The model is in eval mode so dropout cannot make two
    runs of the same input differ.
    """
    import torch

    config, model_class = resolve_config_and_class(source, model_class)
    tiny = shrink_config(config, tp_size, attn_implementation=attn_implementation)
    if not getattr(model_class, "_supports_sdpa", False) and attn_implementation == "sdpa":
        # Older architectures only ship eager attention; asking for sdpa would be an error.
        tiny._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class._from_config(tiny, dtype=dtype or torch.float32)
    return model.eval()


def shrink_config(
    config: "PretrainedConfig", tp_size: int = 2, *, attn_implementation: str = "sdpa"
) -> "PretrainedConfig":
    """A tiny config of the same architecture, for numerical checks of a plan.

    Kept: the class, the ratio of attention heads to key/value heads, whether the original head
    counts divide by ``tp_size``, tied embeddings, biases and norms, and one decoder layer of
    each distinct kind (sliding and full attention, dense and MoE, ...). Everything else shrinks:
    widths to tens, vocabulary to 256, a sliding window of 4 so it matters at 8-16 tokens.

    Head counts: when the original key/value heads divide by ``tp_size`` the tiny model has
    ``tp_size`` of them (at least 2) and the same ratio of query heads. When they do not (Gemma-3
    1B has a single KV head), the tiny model keeps that property - a single KV head stays single -
    so the tensor-parallel checks report the same problem the real model would hit.

    Special token ids past the new vocabulary move into its top ``SPECIAL_TOKEN_SPAN`` ids, the
    same id everywhere it appears. The result is float32 with the KV cache off and the given
    attention implementation; ``config`` itself is left untouched.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    shrunk = _shrink_level(config, tp_size)
    token_ids: dict[int, int] = {}
    shrunk_dict = shrunk.to_dict()
    _remap_token_ids(shrunk_dict, _round_up(TINY_VOCAB, tp_size), token_ids)
    tiny = type(config).from_dict(shrunk_dict)
    tiny._attn_implementation = attn_implementation
    return tiny


def _shrink_level(config: "PretrainedConfig", tp_size: int) -> "PretrainedConfig":
    """Shrink one config and, first, each of its sub-configs (text, vision, audio)."""
    values = config.to_dict()
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            values[key] = _shrink_level(sub, tp_size).to_dict()
    aliases = dict(getattr(config, "attribute_map", {}) or {})
    _shrink_values(values, aliases, tp_size)
    if "mrope_section" in (getattr(config, "ignore_keys_at_rope_validation", None) or ()):
        # Multimodal rope: the modeling file falls back to sections sized for the original
        # head_dim (Qwen2-VL's [16, 24, 24]) when the config does not name them.
        _add_default_mrope_sections(values)
    return config_from_values(type(config), values)


def config_from_values(config_class: type, values: dict[str, Any]) -> "PretrainedConfig":
    """Rebuild a config so that attributes derived from sizes are derived again.

    ``to_dict`` also exports attributes that ``__post_init__`` computes (Zamba2's
    ``hybrid_layer_ids``, ``qk_head_dim``, ...), and ``from_dict`` would restore them over the
    fresh derivation, keeping sizes of the original model. So the config is built from its
    fields only; other keys are put back only where the new config did not derive them.
    """
    if not dataclasses.is_dataclass(config_class):
        return config_class.from_dict(values)
    fields = {f.name for f in dataclasses.fields(config_class)} | _ALWAYS_PASSED_KEYS
    # Aliased fields are exported under the name they are stored as (gpt2's n_embd).
    aliases = getattr(config_class, "attribute_map", {}) or {}
    fields |= {stored for name, stored in aliases.items() if name in fields}
    extras = {k: values.pop(k) for k in list(values) if k not in fields}
    config = config_class.from_dict(values)
    for name, value in extras.items():
        if not hasattr(config, name):
            setattr(config, name, value)
    return config


def _shrink_values(values: dict[str, Any], aliases: dict[str, str], tp: int) -> None:
    """Shrink the sizes of one config level in place (sub-config dicts are already done)."""

    def key(name: str, allow_none: bool = False) -> str | None:
        raw = aliases.get(name, name)
        if raw not in values:
            return None
        value = values[raw]
        if value is None:
            return raw if allow_none else None
        return raw if isinstance(value, int) and not isinstance(value, bool) else None

    original = dict(values)
    done: set[str] = set()
    head_dim: int | None = None
    hidden: int | None = None
    for heads_name, kv_name in HEAD_KEYS:
        heads_key = key(heads_name)
        # A None KV count means "as many as the query heads"; it is written out explicitly because
        # some modeling files read it without applying that default.
        kv_key = key(kv_name, allow_none=True) if kv_name else None
        if heads_key is None or heads_key in done:
            continue
        heads = values[heads_key]
        kv = values[kv_key] if kv_key and values[kv_key] is not None else heads
        new_heads, new_kv = _tiny_head_counts(heads, kv, tp)
        if any(name in values for name in PAIRED_HEADS_KEYS) and heads % (2 * tp) == 0 and kv % (2 * tp) == 0:
            # Heads paired i, i + H/2: each half's heads split over TP, as the original's do.
            factor = math.lcm(new_kv, 2 * tp) // new_kv
            new_heads, new_kv = new_heads * factor, new_kv * factor
        if (blocks := HEAD_BLOCKS.get(values.get("model_type"))) and new_heads % blocks and heads % blocks == 0:
            factor = math.lcm(new_heads, blocks) // new_heads
            new_heads, new_kv = new_heads * factor, new_kv * factor
        values[heads_key] = new_heads
        done.add(heads_key)
        if isinstance(per_layer := values.get(f"{heads_name}_per_layer"), list):  # Laguna's: scaled alike
            values[f"{heads_name}_per_layer"] = [max(1, h * new_heads // heads) for h in per_layer]
        if kv_key:
            values[kv_key] = new_kv
            done.add(kv_key)
        if head_dim is None:
            # A multiple of tp_size so the hidden size divides too, even with odd head counts.
            head_dim = _round_up(max(_MIN_HEAD_DIM, _TARGET_HIDDEN // new_heads), math.lcm(4, tp))
            hidden = new_heads * head_dim
    if head_dim is None:  # attention-free (Mamba, RWKV): only the width matters
        head_dim, hidden = _MIN_HEAD_DIM, _round_up(_TARGET_HIDDEN, tp)

    old_head_size = _head_size(values, aliases)
    for name in HEAD_DIM_KEYS:
        # head_dim is written even where the config left it None (derived), to be explicit.
        if (k := key(name, allow_none=name == "head_dim")) is not None:
            values[k] = head_dim
    if "head_dim" not in values and key("num_attention_heads") and key("hidden_size"):
        # Stated even where the config class derives it, so checks can read config.head_dim.
        values["head_dim"] = head_dim
    _shrink_latent_attention(values, head_dim)
    old_hidden = next((original[k] for name in HIDDEN_KEYS if (k := key(name)) is not None), None)
    for name in EMBEDDING_WIDTH_KEYS:
        if (k := key(name)) is not None:
            values[k] = hidden if original[k] == old_hidden else _round_up(max(_MIN_HEAD_DIM, hidden // 2), tp)
    for name in HIDDEN_KEYS:
        if (k := key(name)) is not None:
            values[k] = hidden
    if (k := key("attention_hidden_size")) is not None and original[k] == old_hidden:  # RWKV's: kept equal
        values[k] = hidden
    for name in SMALL_WIDTH_KEYS:
        if (k := key(name)) is not None and values[k] > 0:
            values[k] = head_dim
    for name in list(values):
        if name in INTERMEDIATE_KEYS or "intermediate_size" in name or "ffn_hidden_size" in name:
            expert = "moe" in name or "expert" in name
            _set_size(values, key, name, TINY_MOE_INTERMEDIATE if expert else TINY_INTERMEDIATE, tp)
        elif name.endswith("_lora_rank"):
            _set_size(values, key, name, TINY_LORA_RANK, tp)
    _shrink_experts(values, key, tp)
    _shrink_state_space(values, key, hidden, head_dim)
    _cap_all(values, key, POSITION_KEYS, TINY_MAX_POSITIONS, keep_at_least=TINY_MAX_POSITIONS)
    _cap_all(values, key, CODEBOOK_KEYS, TINY_CODEBOOKS)
    _cap_all(values, key, SLIDING_WINDOW_KEYS, TINY_SLIDING_WINDOW)
    for name in LAYER_PERIOD_KEYS:
        if (k := key(name)) is not None and values[k] > 2:
            values[k] = 2
            offset = key(name.replace("_period", "_offset"))
            if name.endswith("_period") and offset is not None:
                values[offset] = min(values[offset], 1)
    for name in list(values):
        if "vocab_size" in name and key(name) is not None:
            values[name] = _round_up(TINY_VOCAB, tp)
    if (k := key("rotary_dim")) is not None and old_head_size:
        # Partial rotary (GPT-J, CodeGen): keep the rotated fraction of each head.
        values[k] = max(2, _round_up(head_dim * values[k] // old_head_size, 2))
    _shrink_rope(values, head_dim)
    _shrink_layers(values, key, original, tp)
    shrink_tower_sizes(values, original, hidden, TINY_INTERMEDIATE)
    for name in OTHER_LAYER_COUNT_KEYS:
        _cap_all(values, key, (name,), 2)
    # init_std: CpmAnt's 1.0 gives scores in the hundreds, whose float32 rounding 1e-5 cannot tell from an error.
    fixed = {"dtype": "float32", "use_cache": False, "init_std": min(values.get("init_std") or 0.02, 0.02)}
    values.update({k: v for k, v in fixed.items() if k in values})


def _shrink_experts(values: dict[str, Any], key, tp: int) -> None:
    experts = _round_up(TINY_EXPERTS, tp)
    _cap_all(values, key, EXPERT_COUNT_KEYS, experts)
    _cap_all(values, key, EXPERTS_PER_TOKEN_KEYS, 2)
    _cap_all(values, key, SHARED_EXPERT_KEYS, 1)
    _cap_all(values, key, EXPERT_GROUP_KEYS, 1)
    if any(key(name) is not None for name in EXPERT_COUNT_KEYS):
        # Some default configs leave top-k unset although their router reads it.
        for name in EXPERTS_PER_TOKEN_KEYS:
            if (k := key(name, allow_none=True)) is not None and values[k] is None:
                values[k] = 2


def _shrink_state_space(values: dict[str, Any], key, hidden: int, head_dim: int) -> None:
    """Mamba-style mixers: heads x head size must equal expand x hidden size."""
    for heads_name, dim_name, expand_name in STATE_SPACE_HEADS:
        heads_key, dim_key, expand_key = key(heads_name), key(dim_name), key(expand_name)
        if heads_key and dim_key and expand_key:
            inner = values[expand_key] * hidden
            if (k := key("mamba_d_ssm")) is not None:
                values[k] = inner
            values[dim_key] = head_dim
            values[heads_key] = max(1, inner // head_dim)
    _cap_all(values, key, STATE_SIZE_KEYS, 16)
    _cap_all(values, key, STATE_SPACE_GROUP_KEYS, 1)
    for name in TIME_STEP_RANK_KEYS:
        if (k := key(name)) is not None:
            values[k] = math.ceil(hidden / 16)


def _tiny_head_counts(heads: int, kv: int, tp: int) -> tuple[int, int]:
    """Head counts that keep the GQA ratio and the original's divisibility by ``tp``."""
    if kv <= 0 or heads <= 0:
        return heads, kv
    from plangen.model.pad_layout import legal_padded_tp_size, padded_tp_problem, pads_query_heads

    if heads == kv and pads_query_heads(heads) and heads % tp:
        # An odd count no TP size splits (Falcon-7B's 71, its multi-query attention padded with zero heads:
        # plangen.styles.padded_heads): still odd, and enough that every rank keeps a real head once padded.
        odd = (
            next((h for h in range(5, heads + 1, 2) if h % tp and legal_padded_tp_size(h, tp)), None)
            if heads >= 5
            else heads
        )
        if odd is None:
            raise ValueError(
                padded_tp_problem(heads, tp, "this model") or f"{heads} heads: no odd count below splits over TP {tp}"
            )
        return odd, odd
    if kv == 1:
        new_kv = 1  # multi-query attention stays multi-query
    elif kv % tp == 0:
        new_kv = min(kv, max(tp, 2))
    else:
        new_kv = kv % tp  # still not divisible: the TP checks must see the same problem
    if heads % kv == 0:
        return new_kv * (heads // kv), new_kv
    return max(new_kv, _round_up(new_kv * heads // kv, new_kv)), new_kv


def _head_size(values: dict[str, Any], aliases: dict[str, str]) -> int | None:
    """The attention head size a config states or implies (hidden / heads)."""

    def first_int(names: tuple[str, ...]) -> int | None:
        found = (values.get(aliases.get(n, n)) for n in names)
        return next((v for v in found if isinstance(v, int) and not isinstance(v, bool)), None)

    stated = first_int(("head_dim", "attention_head_dim"))
    hidden, heads = first_int(HIDDEN_KEYS), first_int(("num_attention_heads", "n_head"))
    return stated or (hidden // heads if hidden and heads else None)


def _shrink_latent_attention(values: dict[str, Any], head_dim: int) -> None:
    """Multi-head latent attention (DeepSeek V2/V3): low-rank projections and split head dims."""
    if not isinstance(values.get("kv_lora_rank"), int):
        return
    rope_dim = head_dim // 2
    values["qk_rope_head_dim"] = rope_dim
    values["qk_nope_head_dim"] = head_dim - rope_dim
    if "qk_head_dim" in values:
        values["qk_head_dim"] = head_dim
    if "head_dim" in values:
        # These configs rotate only the rope part, and size the rotary embedding by head_dim.
        values["head_dim"] = rope_dim


def _shrink_rope(values: dict[str, Any], head_dim: int) -> None:
    """Keep rope parameters valid for the new head size (sections and per-dim factors)."""
    params = values.get("rope_parameters")
    if not isinstance(params, dict):
        return
    nested = [p for p in params.values() if isinstance(p, dict)]
    for p in nested or [params]:
        factor = p.get("partial_rotary_factor", values.get("partial_rotary_factor", 1.0)) or 1.0
        half = max(1, int(head_dim * factor) // 2)
        if isinstance(p.get("mrope_section"), list):
            p["mrope_section"] = _rescale_sections(p["mrope_section"], half)
        for name in ("short_factor", "long_factor"):
            if isinstance(p.get(name), list):
                p[name] = p[name][:half]


def _add_default_mrope_sections(values: dict[str, Any]) -> None:
    params = values.get("rope_parameters")
    head_dim = _head_size(values, {})
    if not isinstance(params, dict) or not head_dim:
        return
    for p in [p for p in params.values() if isinstance(p, dict)] or [params]:
        if "mrope_section" not in p:
            half = int(head_dim * (p.get("partial_rotary_factor") or 1.0)) // 2
            p["mrope_section"] = _rescale_sections([16, 24, 24], max(3, half))


def _rescale_sections(sections: list[int], total: int) -> list[int]:
    old_total = sum(sections) or 1
    scaled = [max(1, s * total // old_total) for s in sections]
    scaled[0] += total - sum(scaled)
    return scaled


def _shrink_layers(values: dict[str, Any], key, original: dict[str, Any], tp: int) -> None:
    """Keep one layer of each distinct kind, and the per-layer settings that go with them.

    A layer's kind is everything that can differ between layers: its entries in per-layer lists
    (``layer_types``, ``mlp_layer_types``, ``no_rope_layers``, pattern strings), membership in
    layer-index lists (``mlp_only_layers``), per-layer overrides, and whether it falls in the
    leading dense block or the trailing KV-sharing block.
    """
    count_key = next((k for name in LAYER_COUNT_KEYS if (k := key(name)) is not None), None)
    if count_key is None:
        return
    count = values[count_key]
    # Index lists name layers (strictly increasing); per-layer lists hold one entry per layer.
    index_lists = [name for name, value in values.items() if is_layer_index_list(name, value, count)]
    per_layer = [
        name
        for name, value in values.items()
        if (isinstance(value, list) or (isinstance(value, str) and "pattern" in name))
        and len(value) == count
        and count > 2
        and name not in index_lists
    ]
    overrides = values.get("per_layer_config")
    overrides = overrides if isinstance(overrides, dict) and overrides else {}
    override_at = {int(k): v for k, v in overrides.items()}
    leading = {k: values[k] for name in LEADING_LAYER_KEYS if (k := key(name)) is not None}
    trailing = {k: values[k] for name in TRAILING_LAYER_KEYS if (k := key(name)) is not None}

    def signature(i: int) -> tuple:
        return (
            tuple(values[name][i] for name in per_layer)
            + tuple(i in values[name] for name in index_lists)
            + (repr(override_at.get(i)),)
            + tuple(i < n for n in leading.values())
            + tuple(i >= count - n for n in trailing.values())
        )

    kept: list[int] = []
    seen: set[tuple] = set()
    for i in range(count):
        if (sig := signature(i)) not in seen:
            seen.add(sig)
            kept.append(i)
    for i in range(count):
        if len(kept) >= 2:
            break
        if i not in kept:
            kept.append(i)
    kept.sort()

    values[count_key] = len(kept)
    for name in per_layer:
        picked = [values[name][i] for i in kept]
        values[name] = "".join(picked) if isinstance(values[name], str) else picked
    for name in index_lists:
        values[name] = [kept.index(i) for i in values[name] if i in kept]
    for k, n in leading.items():
        values[k] = sum(1 for i in kept if i < n)
    for k, n in trailing.items():
        values[k] = sum(1 for i in kept if i >= count - n)
    if isinstance(values.get("attention_types"), list) and "attention_layers" in per_layer:
        # GPT-Neo derives its per-layer list from this compressed [[kinds, repeats]] form.
        values["attention_types"] = [[values["attention_layers"], 1]]
    if overrides:
        width = len(next(iter(overrides)))
        values["per_layer_config"] = {
            str(new).zfill(width): _scaled_override(override_at[old], values, original, tp)
            for new, old in enumerate(kept)
            if old in override_at
        }


def is_layer_index_list(name: str, value: Any, count: int) -> bool:
    """Whether config attribute ``name`` names layers by index (Qwen3-MoE's ``mlp_only_layers``,
    Llama-4's ``moe_layers``: strictly increasing indices below ``count``) rather than holding one
    entry per layer; a list of every index (``[0, 1]`` of 2 layers) is taken as naming them."""
    if not any(word in name for word in ("layers", "idx", "indices", "indexes")):
        return False
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        return False
    return all(a < b for a, b in zip(value, value[1:])) and all(0 <= i < count for i in value)


def _scaled_override(
    override: dict[str, Any], values: dict[str, Any], original: dict[str, Any], tp: int
) -> dict[str, Any]:
    """A per-layer override keeps its ratio to the (shrunk) model-wide value it replaces.

    A head count the TP size divided still divides (Dots3's 64 heads beside 128 would be 1 beside
    2), and a layer whose head size was its latent attention's two parts (Dots3's sliding layers:
    ``head_dim = qk_nope_head_dim + qk_rope_head_dim``, which its config validates) keeps that sum.
    """
    head_counts = {name for pair in HEAD_KEYS for name in pair if name}
    scaled = {}
    for name, value in override.items():
        old, new = original.get(name), values.get(name)
        if isinstance(value, int) and isinstance(old, int) and isinstance(new, int) and old:
            divides = name in head_counts and value % tp == 0
            value = max(1, round(value * new / old))
            value = _round_up(value, tp) if divides else value
        scaled[name] = value
    before, after = {**original, **override}, {**values, **scaled}
    parts = ("qk_nope_head_dim", "qk_rope_head_dim")
    if all(isinstance(before.get(n), int) for n in ("head_dim", *parts)) and before["head_dim"] == sum(
        before[n] for n in parts
    ):
        scaled["head_dim"] = sum(after[n] for n in parts)
    return scaled


def _remap_token_ids(values: dict[str, Any], vocab: int, mapping: dict[int, int]) -> None:
    """Move special token ids past the tiny vocabulary into its top, the same id everywhere."""
    for name, value in values.items():
        if not isinstance(name, str):
            continue
        if isinstance(value, dict):
            _remap_token_ids(value, vocab, mapping)
        elif name.endswith(("token_id", "token_index", "token_ids")):
            if isinstance(value, int) and not isinstance(value, bool):
                values[name] = _remapped(value, vocab, mapping)
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                values[name] = [_remapped(v, vocab, mapping) for v in value]


def _remapped(token_id: int, vocab: int, mapping: dict[int, int]) -> int:
    if token_id < vocab:
        return token_id
    return mapping.setdefault(token_id, vocab - 1 - len(mapping))


def _set_size(values: dict[str, Any], key, name: str, size: int, tp: int) -> None:
    """Set a width, including per-layer lists of widths (Gemma-3n's intermediate_size)."""
    size = _round_up(size, tp)
    value = values[name]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        values[name] = [size] * len(value)
    elif (k := key(name)) is not None:
        values[k] = size


def _cap_all(values: dict[str, Any], key, names: tuple[str, ...], cap: int, keep_at_least: int = 0) -> None:
    for k in (k for name in names if (k := key(name)) is not None and values[k] > cap):
        values[k] = max(cap, keep_at_least)


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)

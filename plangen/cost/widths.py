"""Per-class relations between a config's widths, kept true whenever the cost probes resize a config.

The probes (:mod:`plangen.cost.measure`) multiply the widths they find on the text config
(``hidden_size``, ``num_key_value_heads``, ``head_dim``...). Some classes read a width from elsewhere
or derive it, and a config resized only where the probes look builds a model that disagrees with
itself (DBRX: the attention reads ``d_model // n_heads`` and ``attn_config.kv_n_heads``, the rotary
``config.head_dim``). This table says, once per class, where such widths live and how they follow;
:func:`apply_width_relations` is called on every config the measurement builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from plangen.model.resolve import text_config


@dataclass(frozen=True)
class WidthRelations:
    """How one class's widths hang together.

    ``nested``: a top-level key -> the dotted path of the copy the modeling file reads (DBRX's
    ``num_key_value_heads`` -> ``attn_config.kv_n_heads``); the copy is set from the top-level value.
    ``products``: a key -> the keys whose product it is, where the class derives a width from it
    (DBRX's head size is ``d_model // n_heads``: so ``hidden_size = heads x head_dim``, and the hidden
    size is no dimension of its own: probing heads and head size probes it).
    ``rederive``: the class's config derives widths in ``__post_init__`` (Zamba2's
    ``attention_hidden_size``, ``mamba_headdim``, ``hybrid_layer_ids``): the config is built again
    from its fields, which derives them afresh, before the copies of ``nested`` are made.
    ``derived``: keys the class derives from others, not probed on their own.
    ``base_factors``: dimensions (:data:`plangen.cost.probe_configs.DIMENSION_KEYS`' names) multiplied at
    the measurement's base sizes, where the shrunk widths make two different tensors one size.
    """

    nested: Mapping[str, str] = field(default_factory=dict)
    products: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rederive: bool = False
    derived: tuple[str, ...] = ()
    base_factors: Mapping[str, int] = field(default_factory=dict)


# By model_type (of the text config).
WIDTH_RELATIONS: dict[str, WidthRelations] = {
    "dbrx": WidthRelations(
        nested={
            "num_key_value_heads": "attn_config.kv_n_heads",
            "hidden_size": "ffn_config.hidden_size",
        },
        products={"hidden_size": ("num_attention_heads", "head_dim")},
    ),
    # Zamba2 derives its attention widths from the hidden size (2 H wide, head size 2 H / N) and its
    # Mamba head size (expand x H / heads); its rotary reads head_dim, which is the attention's.
    # Shrunk, its hidden size (64) made the attention's input gradient (B·S·2H) as wide as its shared
    # block's LoRA adapters' (B·S·128: adapter_rank, no probe's, kept at its value): hidden 3 x the shrunk.
    "zamba2": WidthRelations(
        nested={"attention_head_dim": "head_dim"}, rederive=True, derived=("head_dim",), base_factors={"hidden": 3}
    ),
    # RecurrentGemma's MLP is intermediate_size / 2 wide, which must still divide by TP at the odd
    # base width (67 x TP). (Its head_dim and lru_width need nothing: the modeling file reads both as
    # stated, and no collective is lru_width wide.)
    "recurrent_gemma": WidthRelations(base_factors={"intermediate": 2}),
    # XLM's attention derives its head size as emb_dim // n_heads (MultiHeadAttention), as DBRX's: a
    # head_dim set alone (the base sizes' doubling, the head-size probe) built attention the
    # config's head_dim disagreed with, and no synthesized plan for it.
    "xlm": WidthRelations(products={"hidden_size": ("num_attention_heads", "head_dim")}),
    # GPT-NeoX's attention reads its head size as hidden_size // heads, its rotary config.head_dim: a
    # head_dim set alone (the base sizes' x3, where x2 would make it the hidden size) made them disagree.
    "gpt_neox": WidthRelations(products={"hidden_size": ("num_attention_heads", "head_dim")}),
    # OLMoE's q and k norms are hidden_size wide, over the whole projection (heads x head size): a
    # head_dim set alone (the base sizes', the probe's) made them disagree (the cost refused).
    "olmoe": WidthRelations(products={"hidden_size": ("num_attention_heads", "head_dim")}),
    # Gemma 4's per-layer embedding table is looked up with the input ids: as long as the vocabulary (the
    # real models' are), or a probe's vocabulary x5 indexed past it (IndexError). Its all-reduce is
    # B·S·L·Hp at any table length.
    "gemma4_text": WidthRelations(nested={"vocab_size": "vocab_size_per_layer_input"}),
    # xLSTM's embedding_dim and num_blocks are its hidden size and depth under other names (all fields).
    "xlstm": WidthRelations(nested={"hidden_size": "embedding_dim", "num_hidden_layers": "num_blocks"}),
}


def width_relations(config: Any) -> WidthRelations:
    """The relations of ``config``'s class (none: an empty set)."""
    return WIDTH_RELATIONS.get(getattr(text_config(config), "model_type", None), WidthRelations())


def derived_width_keys(config: Any) -> frozenset[str]:
    """Config keys that follow other widths in this class (not to be probed on their own)."""
    relations = width_relations(config)
    return frozenset(relations.products) | frozenset(relations.derived)


def apply_width_relations(config: Any) -> Any:
    """``config`` with its class's derived and nested widths made to agree with the top-level ones
    (changed in place and returned; a config built again where the class derives widths itself)."""
    relations = width_relations(config)
    if relations.rederive:
        config = rederived_config(config)
    text = text_config(config)
    for key, factors in relations.products.items():
        values = [getattr(text, k, None) for k in factors]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            product = 1
            for v in values:
                product *= v
            setattr(text, key, product)
    for key, path in relations.nested.items():
        value = getattr(text, key, None)
        *parents, leaf = path.split(".")
        holder = text
        for part in parents:
            holder = getattr(holder, part, None)
        if value is not None and holder is not None:
            setattr(holder, leaf, value)
    return config


def rederived_config(config: Any) -> Any:
    """``config`` built again from its fields, so that its ``__post_init__`` derives its widths anew."""
    from plangen.model.shrink import config_from_values

    if text_config(config) is not config:
        raise ValueError(f"{type(config).__name__}: re-deriving the widths of a nested text config is not supported")
    rebuilt = config_from_values(type(config), config.to_dict())
    rebuilt._attn_implementation = config._attn_implementation
    return rebuilt

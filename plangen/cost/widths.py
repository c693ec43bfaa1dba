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

from plangen.models import text_config


@dataclass(frozen=True)
class WidthRelations:
    """How one class's widths hang together.

    ``nested``: a top-level key -> the dotted path of the copy the modeling file reads (DBRX's
    ``num_key_value_heads`` -> ``attn_config.kv_n_heads``); the copy is set from the top-level value.
    ``products``: a key -> the keys whose product it is, where the class derives a width from it
    (DBRX's head size is ``d_model // n_heads``: so ``hidden_size = heads x head_dim``, and the hidden
    size is no dimension of its own: probing heads and head size probes it).
    """

    nested: Mapping[str, str] = field(default_factory=dict)
    products: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# By model_type (of the text config).
WIDTH_RELATIONS: dict[str, WidthRelations] = {
    "dbrx": WidthRelations(
        nested={
            "num_key_value_heads": "attn_config.kv_n_heads",
            "hidden_size": "ffn_config.hidden_size",
        },
        products={"hidden_size": ("num_attention_heads", "head_dim")},
    ),
}


def width_relations(config: Any) -> WidthRelations:
    """The relations of ``config``'s class (none: an empty set)."""
    return WIDTH_RELATIONS.get(getattr(text_config(config), "model_type", None), WidthRelations())


def derived_width_keys(config: Any) -> frozenset[str]:
    """Config keys that follow other widths in this class (not to be probed on their own)."""
    return frozenset(width_relations(config).products)


def apply_width_relations(config: Any) -> Any:
    """``config`` (changed in place, and returned) with its class's derived and nested widths made
    to agree with the top-level ones."""
    relations = width_relations(config)
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

"""Which TP sizes a model's attention can take: a pure check shared by the runtime and ``plangen init``.

Column-parallel q/k/v projections give each TP rank whole heads, so both the query head count and
the key/value head count must divide by the TP size. Nothing here imports torch or transformers.
"""

from __future__ import annotations

from math import gcd
from typing import Any

from plangen.models import text_config


def largest_legal_tp_size(num_heads: int, num_kv_heads: int, limit: int | None = None) -> int:
    """The largest TP size dividing both head counts (at most ``limit`` when given)."""
    common = gcd(num_heads, num_kv_heads)
    candidates = [d for d in range(1, common + 1) if common % d == 0 and (limit is None or d <= limit)]
    return max(candidates)


def head_counts(config: Any) -> tuple[int, int] | None:
    """(attention heads, key/value heads) of a config's text part, or None when it has no heads.

    A config whose head counts vary by layer (transformers' heterogeneous configs refuse to answer
    globally) gives the greatest common divisor of every layer's: a TP size divides all of them
    exactly when it divides that.
    """
    text = text_config(config)
    try:
        return _counts(text)
    except Exception as error:  # transformers' AmbiguousGlobalPerLayerAttributeError; no import here
        if type(error).__name__ != "AmbiguousGlobalPerLayerAttributeError":
            raise
    per_layer = [_counts(layer) for layer in text.per_layer_config]
    per_layer = [counts for counts in per_layer if counts is not None]
    if not per_layer:
        return None
    return gcd(*(h for h, _ in per_layer)), gcd(*(kv for _, kv in per_layer))


def _counts(config: Any) -> tuple[int, int] | None:
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return None
    return heads, getattr(config, "num_key_value_heads", None) or heads


def tp_size_problem(config: Any, tp_size: int, model_name: str) -> str | None:
    """Why ``tp_size`` cannot shard this config's attention heads (one line), or None when it can."""
    counts = head_counts(config)
    if counts is None:
        return None
    heads, kv_heads = counts
    for what, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if count % tp_size:
            legal = largest_legal_tp_size(heads, kv_heads, tp_size)
            return (
                f"{what}={count} is not divisible by the TP size {tp_size}: "
                f"the largest legal TP size for {model_name} is {legal}"
            )
    return None

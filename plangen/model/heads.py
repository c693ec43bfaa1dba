"""Which TP sizes a model's attention can take: a pure check shared by the runtime and ``plangen init``.

Column-parallel q/k/v projections give each TP rank whole heads, so both the query head count and
the key/value head count must divide by the TP size. Where the TP size exceeds the KV heads, a plan
whose k/v projections are :class:`plangen.styles.kv_heads.KVHeadsColwiseParallel` (Megatron's KV head
replication) also takes a TP size that is a multiple of the KV head count: each rank then computes
the one KV head its query heads use. Nothing here imports torch or transformers.
"""

from __future__ import annotations

from math import gcd
from typing import Any

from plangen.model.resolve import text_config
from plangen.model.pad_layout import pads_query_heads


def legal_tp_size(num_heads: int, num_kv_heads: int, tp_size: int, *, replicate_kv: bool = False) -> bool:
    """``tp_size`` splits the query heads, and the KV heads (or, with ``replicate_kv``, is a multiple of them)."""
    if num_heads % tp_size:
        return False
    return num_kv_heads % tp_size == 0 or (replicate_kv and tp_size % num_kv_heads == 0)


def largest_legal_tp_size(
    num_heads: int, num_kv_heads: int, limit: int | None = None, *, replicate_kv: bool = False
) -> int:
    """The largest legal TP size (at most ``limit`` when given); see :func:`legal_tp_size`."""
    top = num_heads if replicate_kv else gcd(num_heads, num_kv_heads)
    candidates = [
        d
        for d in range(1, top + 1)
        if legal_tp_size(num_heads, num_kv_heads, d, replicate_kv=replicate_kv) and (limit is None or d <= limit)
    ]
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


def tp_size_problem(
    config: Any, tp_size: int, model_name: str, *, replicate_kv: bool = False, padded_heads: bool = False
) -> str | None:
    """Why ``tp_size`` cannot shard this config's attention heads (one line), or None when it can.

    ``replicate_kv``: the plan replicates KV heads where the TP size exceeds them. The line names
    the largest legal TP size both without and with KV head replication. ``padded_heads``: the plan
    pads multi-query attention's query heads to a multiple of the TP size (:mod:`plangen.model.pad_layout`;
    its one KV head is whole on every rank): every rank must keep a real head.
    """
    counts = head_counts(config)
    if counts is None:
        return None
    heads, kv_heads = counts
    if padded_heads:
        from plangen.model.pad_layout import padded_tp_problem

        return padded_tp_problem(heads, tp_size, model_name)
    if legal_tp_size(heads, kv_heads, tp_size, replicate_kv=replicate_kv):
        return None
    if heads % tp_size:
        what, count, why = "num_attention_heads", heads, "is not divisible by"
    elif replicate_kv:
        what, count, why = "num_key_value_heads", kv_heads, "neither divides nor is divisible by"
    else:
        what, count, why = "num_key_value_heads", kv_heads, "is not divisible by"
    legal = largest_legal_tp_size(heads, kv_heads, tp_size)
    replicated = largest_legal_tp_size(heads, kv_heads, tp_size, replicate_kv=True)
    if replicate_kv:
        sizes = f"{replicated} ({legal} without KV head replication)"
    elif replicated > legal:
        sizes = f"{legal} ({replicated} with KV heads replicated by KVHeadsColwiseParallel on k_proj/v_proj)"
    else:
        sizes = f"{legal} (also with KV heads replicated)"
    return f"{what}={count} {why} the TP size {tp_size}: the largest legal TP size for {model_name} is {sizes}"


def any_layout_tp_size_problem(config: Any, tp_size: int, model_name: str) -> str | None:
    """Why no plan layout can shard this config's heads at ``tp_size`` (checked before a plan is known):
    KV heads may be replicated, and an odd query head count (the only one a plan pads: Falcon-7B's 71,
    :mod:`plangen.styles.padded_heads`) may be padded. Applying the plan checks it against its own layout."""
    problem = tp_size_problem(config, tp_size, model_name, replicate_kv=True)
    counts = head_counts(config)
    if problem is None or counts is None or not pads_query_heads(counts[0]):
        return problem
    return tp_size_problem(config, tp_size, model_name, padded_heads=True)

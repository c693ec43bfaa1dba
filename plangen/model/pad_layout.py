"""Query heads padded with zero heads to a multiple of the TP size: the layout, as pure functions.

Falcon-7B's 71 query heads split over no even TP size. Padded with zero heads to the next multiple
of the TP size (72 at TP 2, 4 and 8), every rank holds ``padded // tp`` whole heads; the pad heads
are the last ones, so they sit on the last rank(s), after its real heads. A TP size is usable while
every rank keeps at least one real head (at most the head count: 71 for Falcon-7B); beyond that a
rank would hold nothing but pad. :mod:`plangen.styles.padded_heads` applies the layout to the modules;
nothing here imports torch.
"""

from __future__ import annotations


def pads_query_heads(heads: int) -> bool:
    """Whether a multi-query attention of ``heads`` query heads is padded (an odd count, which no even
    TP size splits): the one place plans, the shrinker, the TP-size checks and ``cost`` ask."""
    return heads % 2 == 1


def padded_head_count(heads: int, tp_size: int) -> int:
    """The head count rounded up to a multiple of ``tp_size`` (``heads`` itself where it divides)."""
    return -(-heads // tp_size) * tp_size


def legal_padded_tp_size(heads: int, tp_size: int) -> bool:
    """Every one of ``tp_size`` ranks holds at least one real head once the heads are padded."""
    if tp_size < 1 or heads < 1:
        return False
    local = padded_head_count(heads, tp_size) // tp_size
    return (tp_size - 1) * local < heads


def largest_padded_tp_size(heads: int, limit: int | None = None) -> int:
    """The largest TP size (at most ``limit`` when given) :func:`legal_padded_tp_size` allows."""
    top = heads if limit is None else min(heads, limit)
    return max(d for d in range(1, top + 1) if legal_padded_tp_size(heads, d))


def padded_tp_problem(heads: int, tp_size: int, model_name: str) -> str | None:
    """Why ``tp_size`` cannot split ``heads`` query heads even padded (one line), or None when it can."""
    if legal_padded_tp_size(heads, tp_size):
        return None
    local = padded_head_count(heads, tp_size) // tp_size
    return (
        f"num_attention_heads={heads} padded to {padded_head_count(heads, tp_size)} leaves ranks of the TP size "
        f"{tp_size} with only pad heads ({local} per rank): the largest legal TP size for {model_name} is "
        f"{largest_padded_tp_size(heads, tp_size)}"
    )


def real_rows(heads: int, padded: int, head_dim: int, trailing: int = 0) -> list[int]:
    """The rows of a padded layout ``[q of `padded` heads; `trailing` rows]`` that hold the unpadded
    ``[q of `heads` heads; trailing rows]``, in its order (``unpadded = padded[real_rows]``)."""
    return [*range(heads * head_dim), *range(padded * head_dim, padded * head_dim + trailing)]


def local_pad_features(heads: int, tp_size: int, rank: int, head_dim: int) -> tuple[int, int] | None:
    """(start, stop) of the pad heads' features among rank ``rank``'s local heads, None when it has none."""
    local = padded_head_count(heads, tp_size) // tp_size
    first_pad = heads - rank * local  # local index of the first pad head
    if first_pad >= local:
        return None
    return max(first_pad, 0) * head_dim, local * head_dim

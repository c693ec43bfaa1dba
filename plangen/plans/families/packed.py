"""Recognise attention whose q, k and v come packed in one projection, or sit inside a thin wrapper.

How the packed output is split is read from the forward (:mod:`plangen.plans.source.packed`); the
rest of the checks are :mod:`plangen.plans.families.core`'s, so the two kinds of attention are judged alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from plangen.model.pad_layout import pads_query_heads
from plangen.plans.source.forward import read_input_readers
from plangen.plans.families.core import (
    KeptBlock,
    ShardedBlock,
    attention_norms,
    packed_qkv,
    split_by_reading,
    unexpected_children,
    recognize_attention,
)
from plangen.plans.families.dims import ModelDims, has_parameters, own_parameters
from plangen.plans.families.block import FamilyBlock


def recognize_packed_attention(block: nn.Module, dims: ModelDims) -> ShardedBlock | KeptBlock | None:
    """Attention with one input projection wider than q alone, sharded as its forward splits it.

    As wide as q, k and v by the config: sharded, or kept with the forward's reason. Wider but not
    by the config (Falcon's multi-query leaves num_kv_heads unused): sharded where the forward splits
    it as multi-query (q of the config's heads, one k and one v head), else only a reason to keep it
    whole is taken from the forward. None when it is not such an attention or the forward cannot be read.
    """
    split = split_by_reading(block) if dims.heads and dims.head_dim else None
    if split is None:
        return None
    reading, others = split
    h, n, d = dims.hidden, dims.heads, dims.head_dim
    outputs = [name for name, m in others.items() if m.in_features == n * d and m.out_features == h]
    if len(outputs) != 1 or len(reading) != 1 or next(iter(reading.values())).in_features != h:
        return None
    found = packed_attention(block, reading, outputs[0], dims)
    # Multi-query as its forward splits it: q of the config's heads, one k and one v head.
    multi_query = isinstance(found, ShardedBlock) and found.shared_parts
    if packed_qkv(reading, dims) is not None or isinstance(found, KeptBlock) or multi_query:
        return found
    return None


def packed_attention(
    block: nn.Module, reading: dict[str, nn.Linear], output: str, dims: ModelDims
) -> ShardedBlock | KeptBlock | None:
    """Attention with one packed q|k|v projection, sharded by heads as its forward splits it
    (:mod:`plangen.plans.source.packed`): whole groups per rank, or the parts re-laid out per rank.
    None when the forward cannot be followed (the caller then keeps the block, with the reason)."""
    from math import gcd

    from plangen.plans.source.packed import Refused, read_packed_split

    ((name, linear),) = reading.items()
    d = dims.head_dim
    counts = {c for c in (dims.heads, dims.kv_heads) if c}
    split = read_packed_split(block, name, linear.out_features, counts, d)
    if split is None:
        return None
    if isinstance(split, Refused):
        return KeptBlock("attention", f"packed q|k|v projection {name}: {split.why}")
    own = own_parameters(block)
    # Tables of one row per head feature and no heads axis (GOT-OCR2's relative positions, which its
    # forward reads with every head's query) are read alike by each rank's heads: kept whole, their
    # gradient summed over TP. Anything else sized otherwise cannot follow the split.
    tables = tuple(p for p, s in own.items() if len(s) == 2 and s[1] == d and s[0] not in counts)
    if len(tables) != len(own):
        names = ", ".join(f"{p} {s}" for p, s in own.items())
        return KeptBlock("attention", f"own parameters ({names}) cannot follow the split by heads")
    per_head, whole = attention_norms(block, {name, output}, dims)
    if whole:
        return KeptBlock("attention", f"norm {whole[0]} spans a whole part of the packed projection {name}")
    unknown = unexpected_children(block, {name, output, *per_head})
    if unknown:
        return KeptBlock("attention", f"unrecognised submodule {unknown[0]} would see only this rank's heads")
    fused: tuple[tuple[str, tuple[int, ...]], ...] = ()
    shared: tuple[int, ...] = ()
    heads = split.head_attributes
    padded = False
    if split.kind == "parts":
        shared = _multi_query_parts(split.parts, dims)
        # Falcon-7B's 71 query heads split over no even TP size: padded with zero heads to a multiple of
        # it when the plan is applied (plangen.styles.padded_heads). Only there: a count that divides needs no pad.
        padded = bool(shared) and pads_query_heads(dims.heads)
        if shared:
            # The shared head's width stays whole (its num_key_value_groups, which the attention
            # interfaces repeat it by, PrepareAttentionInput makes this rank's query heads).
            widths = {split.parts[i] for i in shared}
            heads = tuple(a for a in heads if getattr(block, a) not in widths)
        small = [p for i, p in enumerate(split.parts) if (p % d or p // d < 2) and i not in shared]
        if small:
            return KeptBlock(
                "attention",
                f"packed q|k|v projection {name} splits into parts {split.parts}: a part of {small[0]} features is "
                f"not a whole number of at least two heads of {d} (multi-query: one key/value head no TP size splits)",
            )
        common = 0
        for p in split.parts:
            common = gcd(common, p)
        fused = ((name, tuple(p // common for p in split.parts)),)
    return ShardedBlock(
        "attention",
        (name,),
        output,
        tuple(per_head),
        fused=fused,
        head_attributes=heads,
        shared_parts=shared,
        shared_tables=tables,
        padded_heads=padded,
    )


def _multi_query_parts(parts: tuple[int, ...], dims: ModelDims) -> tuple[int, ...]:
    """The parts that are one key and one value head after all query heads (GPT-BigCode's
    ``split((embed_dim, kv_dim, kv_dim))`` with one KV head): their indices, else ()."""
    d, heads = dims.head_dim, dims.heads
    if len(parts) == 3 and heads and heads >= 2 and parts[0] == heads * d and parts[1:] == (d, d):
        return (1, 2)
    return ()


@dataclass(frozen=True)
class WrappedBlock(FamilyBlock):
    """An attention module inside a thin wrapper: sharded where the wrapper calls it (``inner``)."""

    inner: str
    block: ShardedBlock
    kind: str = "attention"


def recognize_wrapped_attention(block: nn.Module, dims: ModelDims) -> WrappedBlock | KeptBlock | None:
    """A thin wrapper (GPT-Neo's ``attn``) around one attention module, which it hands its input to:
    the inner attention sharded by heads, its head counts made local where its forward shapes by them."""
    from dataclasses import replace

    from plangen.plans.source.packed import Refused, read_shape_head_attributes

    inner = [(n, c) for n, c in block.named_children() if has_parameters(c)]
    readers = read_input_readers(type(block))
    if len(inner) != 1 or own_parameters(block) or readers is None or inner[0][0] not in readers:
        return None
    name, child = inner[0]
    found = recognize_attention(child, dims)
    if not isinstance(found, ShardedBlock):
        return None
    heads = read_shape_head_attributes(child, {c for c in (dims.heads, dims.kv_heads) if c}, dims.head_dim)
    if heads is None:
        return None
    if isinstance(heads, Refused):
        return KeptBlock("attention", f"{name}: {heads.why}")
    return WrappedBlock(
        name, replace(found, kv_projections=() if heads else found.kv_projections, head_attributes=heads)
    )

"""Recognise blocks split over two sibling modules (BERT's ``attention.self`` and
``attention.output``, ``intermediate`` and ``output``) from the parent's forward source, and
attention called alike by its layer: the rules of :mod:`plangen.plans.families.core` (structure,
shapes and forward source; names only label), for layouts it does not see inside one block.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from plangen.plans.source.forward import read_input_readers
from plangen.plans.families.core import ShardedBlock, child_linears, recognize_attention
from plangen.plans.families.dims import ModelDims, has_parameters, is_linear, is_per_feature, own_parameters
from plangen.plans.source.split import (
    read_alike_readers,
    read_choice_readers,
    read_draws_numpy_random,
    read_fed_by,
    read_rebuilt_child_classes,
    read_reshape_attributes,
    read_sole_reader,
)


@dataclass(frozen=True)
class SplitBlock:
    """Attention or an MLP whose projections sit in two sibling modules of one parent (the BERT
    family: ``attention.self`` then ``attention.output``, ``intermediate`` then ``output``).

    ``inner`` holds the column-parallel projections, all reading its input (or all reading the
    output of ``inner_norm``, a norm inside ``inner`` applied to its input: RoBERTa-PreLayerNorm);
    the parent feeds ``inner``'s output to ``outer`` and to nothing else, and in ``outer`` the one
    row-parallel projection alone reads it. Everything else in ``outer`` (the post-norm after the
    residual add, adapters) runs after the row-parallel reduction, on the whole hidden state.
    """

    kind: str  # "attention" | "mlp"
    inner: str
    colwise: tuple[str, ...]
    outer: str
    rowwise: str
    inner_norm: str | None = None
    # Attributes of ``inner`` its forward reshapes with that hold the unsharded head count or width
    # (``context.view(..., self.all_head_size)``): made this rank's (plangen.styles.fused.LocalHeadCounts).
    head_attributes: tuple[str, ...] = ()
    # ``inner`` may be rebuilt by its parent between forwards (BigBird's set_attention_type): its head
    # counts are then made this rank's from the parent (plangen.styles.attention.RebuiltChildHeadCounts),
    # and the classes that draw per-head random numbers are refused in training.
    rebuilt: bool = False
    refused_in_training: tuple[str, ...] = ()


def _column_half(
    inner: nn.Module, dims: ModelDims, rebuilt: tuple[type, ...] = ()
) -> tuple[str, int, str | None, tuple[str, ...]] | None:
    """(kind, output width, inner norm, head attributes) when every parameter of ``inner`` is a linear
    from the hidden size reading its input (or all reading one per-feature norm of it): three or more
    of whole heads (attention, as many KV heads as query heads), or one (an MLP's up-projection)."""
    readers = read_input_readers(type(inner))
    if readers is None or own_parameters(inner):
        return None
    readers |= read_choice_readers(type(inner))
    linears = child_linears(inner)
    others = [n for n, c in inner.named_children() if n not in linears and has_parameters(c)]
    norm = others[0] if len(others) == 1 and is_per_feature(getattr(inner, others[0]), dims.hidden) else None
    if len(others) > (norm is not None) or not linears or any(m.in_features != dims.hidden for m in linears.values()):
        return None
    if norm is None and any(n not in readers for n in linears):
        return None
    if norm is not None and (norm not in readers or any(read_fed_by(type(inner)).get(n) != norm for n in linears)):
        return None
    widths = {m.out_features for m in linears.values()}
    heads = dims.heads and dims.head_dim and dims.heads * dims.head_dim
    if len(linears) >= 3 and widths == {heads} and (dims.kv_heads or dims.heads) == dims.heads:
        # A child its parent may rebuild as another class: the attributes any of them reshapes by.
        attributes = {a for cls in (type(inner), *rebuilt) for a in read_reshape_attributes(cls)}
        fixed = tuple(sorted(a for a in attributes if getattr(inner, a, None) in (dims.heads, heads)))
        return "attention", heads, norm, fixed
    if len(linears) == 1:
        return "mlp", widths.pop(), norm, ()
    return None


def recognize_attention_called_alike(parent: nn.Module, name: str, dims: ModelDims) -> ShardedBlock | None:
    """Attention whose q, k and v read three parameters that ``parent`` passes one variable (CTRL)."""
    block = getattr(parent, name)
    readers = read_alike_readers(type(parent), name, type(block))
    found = recognize_attention(block, dims, readers) if readers else None
    return found if isinstance(found, ShardedBlock) else None


def recognize_split_blocks(parent: nn.Module, dims: ModelDims) -> list[SplitBlock]:
    """The blocks of ``parent`` split over two of its children (see :class:`SplitBlock`)."""
    children = dict(parent.named_children())
    found: list[SplitBlock] = []
    for outer_name, inner_name in read_fed_by(type(parent)).items():
        inner, outer = children.get(inner_name), children.get(outer_name)
        if inner is None or outer is None or own_parameters(outer):
            continue
        rebuilt = read_rebuilt_child_classes(type(parent), inner_name)
        column = _column_half(inner, dims, rebuilt)
        rowwise = read_sole_reader(type(outer))
        row = getattr(outer, rowwise, None) if rowwise is not None and rowwise in dict(outer.named_children()) else None
        if column is None or not is_linear(row) or (row.in_features, row.out_features) != (column[1], dims.hidden):
            continue
        kind, _, norm, fixed = column
        refused = tuple(c.__name__ for c in (type(inner), *rebuilt) if read_draws_numpy_random(c)) if rebuilt else ()
        found.append(
            SplitBlock(
                kind,
                inner_name,
                tuple(child_linears(inner)),
                outer_name,
                rowwise,
                norm,
                fixed,
                rebuilt=bool(rebuilt),
                refused_in_training=tuple(dict.fromkeys(refused)),
            )
        )
    return found

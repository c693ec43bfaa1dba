"""Recognise blocks split over two sibling modules (BERT's ``attention.self`` and
``attention.output``, ``intermediate`` and ``output``) from the parent's forward source, and
attention called alike by its layer: the rules of :mod:`plangen.plans.families.core` (structure,
shapes and forward source; names only label), for layouts it does not see inside one block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from torch.distributed.tensor import Replicate, Shard
from plangen.plan import PlanEntry
from plangen.plans.layouts import SEQ, hidden_state_layouts, row_parallel_output
from plangen.plans.families.block import FamilyBlock

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.synthesis.findings import BlockPart


@dataclass(frozen=True)
class SplitBlock(FamilyBlock):
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

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return split_block_entries(part, sp)


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


def split_block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """A block split over two sibling modules (BERT): the inner one entered as one Replicate DTensor,
    its projections column-parallel, the outer one's projection row-parallel."""
    block = part.block
    assert isinstance(block, SplitBlock)
    inner, group = f"{part.path}.{block.inner}", block.kind
    entries: list[PlanEntry] = []
    if block.rebuilt:  # its parent rebuilds it (BigBird): the parent's pre-hook makes the counts local
        refused = block.refused_in_training
        entries.append(
            PlanEntry(
                part.path,
                "RebuiltChildHeadCounts",
                dict(child=block.inner, attributes=block.head_attributes, refused_in_training=refused),
                group,
                f"rebuilds its {block.inner} (another attention class) between forwards: its head counts made this rank's "
                "before each forward"
                + (
                    f"; {', '.join(refused)} refused in training (random key blocks drawn per head "
                    "from one seeded stream)"
                    if refused
                    else ""
                ),
            )
        )
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel: each rank computes its own heads, from its own input",
        )
    elif block.head_attributes:
        # One style per module: the head counts made local instead of one prepared input (each
        # projection then takes, and reduces the gradient of, its own input).
        entries.append(
            PlanEntry(
                inner,
                "LocalHeadCounts",
                dict(attributes=block.head_attributes),
                group,
                "reshapes its heads with its built-in width: make it this rank's",
            )
        )
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel: each rank computes its own heads, from its own input",
        )
    elif part.call is not None:
        gathered = "one all-gather of the sequence per block" if sp else "no communication"
        if block.inner_norm is None:
            prepared, how = False, f"{gathered}; one gradient reduction per block in backward"
        else:  # the norm inside takes a plain tensor: each projection then reduces its own input gradient
            prepared, how = True, f"{gathered}; the norm inside computes on the whole input"
        entries.append(
            PlanEntry(
                inner,
                "PrepareModuleInput",
                dict(**hidden_state_layouts(part.call, sp), use_local_output=prepared),
                group,
                how,
            )
        )
        colwise_input, why = (
            Replicate(),
            "column-parallel: each rank computes its own " + ("heads" if group == "attention" else "slice"),
        )
    else:
        colwise_input, why = (
            SEQ if sp else Replicate(),
            "column-parallel, taking its own input (the call of its module could not be read)",
        )
    for name in block.colwise:
        entries.append(
            PlanEntry(
                f"{inner}.{name}",
                "ColwiseParallel",
                dict(input_layouts=colwise_input, output_layouts=Shard(-1), use_local_output=True),
                group,
                why,
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(
        PlanEntry(
            f"{part.path}.{block.outer}.{block.rowwise}",
            "RowwiseParallel",
            rowwise,
            group,
            f"row-parallel, in the module its column-parallel half feeds: {reduced}",
        )
    )
    return entries

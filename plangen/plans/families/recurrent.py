"""Recognise RecurrentGemma's (Griffin's) recurrent block: split by its RG-LRU's heads over TP.

By structure: input projections from the hidden size to ``W`` channels that read the block input
(``linear_x``, ``linear_y``), one depthwise ``nn.Conv1d`` over those ``W`` channels, one child that
is an RG-LRU over them (block-diagonal gates ``[heads, block, block]`` with ``heads * block == W``,
:func:`plangen.styles.recurrent.rg_lru_misfit`), and one projection from ``W`` back to the hidden
size that does not read the input (``linear_out``). Nothing in it mixes heads before that
projection, so it is sharded as a gated delta net is (:mod:`plangen.styles.linear_attention`):
the input projections column-parallel, the conv's channels and the RG-LRU's heads split together
(:class:`plangen.styles.recurrent.RGLRUParallel`), the output projection row-parallel.

It runs before the MLP recogniser: the block has an MLP's shape (two projections in, one out).

xLSTM's mLSTM layer (:func:`recognize_mlstm_layer`): input projections from the hidden size whose
widths are whole heads (q, k ``qk_dim``; v, the output gate ``v_dim``; the input and forget gates
one value per head), a multi-head norm over ``v_dim`` that normalises each head on its own
(:func:`plangen.styles.recurrent.multi_head_norm_misfit`, its ``num_heads`` the layer's), and one
projection from ``v_dim`` back. The mLSTM cell mixes nothing across heads, so it is sharded as
attention: the projections column-parallel by heads, the norm's weight with its heads
(:class:`plangen.styles.recurrent.MultiHeadNormParallel`), ``out_proj`` row-parallel, and the head
count and widths its forward reshapes by (``config.num_heads``, ``qk_dim``, ``v_dim``) made this
rank's by the input's style (``PrepareAttentionInput``).

An mLSTM layer (xLSTM) sharded by heads, as plan entries (see :mod:`plangen.plans.families.recurrent`).

Per layer, as a dense attention block: forward one all-reduce (``out_proj``), or one all-gather of
the sequence in and one reduce-scatter out under SP (the recurrence runs over the whole sequence);
backward one all-reduce of the layer input's gradient. The multi-head norm communicates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.families.dims import has_parameters, is_linear, ModelDims
from plangen.plans.families.linear_attention import GatedDeltaNetBlock
from plangen.plans.layouts import row_parallel_output
from plangen.plans.source.forward import read_input_name_readers
from plangen.plans.layouts import hidden_state_layouts
from plangen.plans.families.block import FamilyBlock, UNREAD_CALL, Unplaced

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart


# transformers' names of the block's widths its forward and cache shape by, read as numbers and
# kept only where they equal the conv's channels (its conv state is sized by hidden_size).
WIDTH_ATTRIBUTES = ("lru_width", "hidden_size")


@dataclass(frozen=True)
class MultiHeadMixerBlock(FamilyBlock):
    """An mLSTM layer's parts, by child name, as :func:`plangen.plans.families.recurrent.mlstm_entries` shards them."""

    colwise: tuple[str, ...]  # input projections, whole heads each (q, k, v, the gates)
    rowwise: str
    norm: str  # the multi-head norm, one head at a time
    head_attributes: tuple[str, ...]  # what the forward reshapes by, made this rank's
    kind: str = "attention"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        assert part.call is not None
        return mlstm_entries(part.path, self, hidden_state_layouts(part.call, sp), sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        # Its style splits its own heads and prepares its input: it must be where the layer calls it.
        return Unplaced(f"recurrent mixer {UNREAD_CALL}", "attention") if call is None else None


# transformers' names of the counts an mLSTM layer reshapes by (its config's head count, its widths).
MLSTM_HEADS, MLSTM_WIDTHS = "num_heads", ("qk_dim", "v_dim")


def recognize_recurrent_block(block: nn.Module, dims: ModelDims) -> GatedDeltaNetBlock | MultiHeadMixerBlock | None:
    """An RG-LRU block or an mLSTM layer whose parts all split by their heads, or None."""
    return recognize_rg_lru_block(block, dims) or recognize_mlstm_layer(block, dims)


def recognize_mlstm_layer(block: nn.Module, dims: ModelDims) -> MultiHeadMixerBlock | None:
    """An mLSTM layer (xLSTM) whose projections are whole heads and whose norm works per head, or None."""
    from plangen.styles.recurrent import multi_head_norm_misfit

    heads = getattr(getattr(block, "config", None), MLSTM_HEADS, None)
    widths = [getattr(block, a, None) for a in MLSTM_WIDTHS]
    if not isinstance(heads, int) or any(not isinstance(w, int) or w % heads for w in widths):
        return None
    qk, v = widths
    readers = read_input_name_readers(type(block))
    if readers is None:
        return None
    colwise, rowwise, norms = [], [], []
    for name, child in block.named_children():
        if not has_parameters(child):
            continue
        if (
            is_linear(child)
            and name in readers
            and child.in_features == dims.hidden
            and child.out_features in (qk, v, heads)
        ):
            colwise.append(name)
        elif is_linear(child) and name not in readers and (child.in_features, child.out_features) == (v, dims.hidden):
            rowwise.append(name)
        elif multi_head_norm_misfit(child) is None and getattr(child, "num_heads") == heads and child.num_features == v:
            norms.append(name)
        else:
            return None
    if len(rowwise) != 1 or len(norms) != 1 or not colwise:
        return None
    return MultiHeadMixerBlock(tuple(colwise), rowwise[0], norms[0], (f"config.{MLSTM_HEADS}", *MLSTM_WIDTHS))


def recognize_rg_lru_block(block: nn.Module, dims: ModelDims) -> GatedDeltaNetBlock | None:
    """A recurrent block with an RG-LRU whose parts all split by the RG-LRU's heads, or None."""
    from plangen.styles.recurrent import HEAD_COUNT, rg_lru_misfit

    convs = [c for c in block.children() if isinstance(c, nn.Conv1d)]
    lrus = [n for n, c in block.named_children() if rg_lru_misfit(c) is None]
    if len(convs) != 1 or len(lrus) != 1 or not (convs[0].in_channels == convs[0].out_channels == convs[0].groups):
        return None
    width, lru = convs[0].in_channels, getattr(block, lrus[0])
    if getattr(lru, HEAD_COUNT) * lru.input_gate_weight.shape[-1] != width:
        return None
    readers = read_input_name_readers(type(block))
    if readers is None:
        return None
    colwise, rowwise = [], []
    for name, child in block.named_children():
        if child is convs[0] or name == lrus[0] or not has_parameters(child):
            continue
        if is_linear(child) and name in readers and (child.in_features, child.out_features) == (dims.hidden, width):
            colwise.append(name)
        elif (
            is_linear(child) and name not in readers and (child.in_features, child.out_features) == (width, dims.hidden)
        ):
            rowwise.append(name)
        else:
            return None
    if len(rowwise) != 1 or not colwise:
        return None
    widths = tuple(a for a in WIDTH_ATTRIBUTES if getattr(block, a, None) == width)
    return GatedDeltaNetBlock(
        colwise=tuple(colwise),
        rowwise=rowwise[0],
        norm=None,
        conv_parts=(1,),
        head_parameters=(),
        head_attributes=widths,
        lru=lrus[0],
    )


def mlstm_entries(path: str, block: MultiHeadMixerBlock, prepared: dict[str, Any], sp: bool) -> list[PlanEntry]:
    """The layer at ``path``, its input laid out by ``prepared`` (``PrepareModuleInput``'s layouts)."""
    group = "attention"
    gathered = "one all-gather of the sequence per layer" if sp else "no communication"
    entries = [
        PlanEntry(
            path,
            "PrepareAttentionInput",
            dict(**prepared, use_local_output=False, head_attributes=block.head_attributes),
            group,
            f"{gathered}; one gradient reduction per layer in backward; its forward reshapes by "
            f"{', '.join(block.head_attributes)}: made this rank's",
        )
    ]
    entries += [
        PlanEntry(
            f"{path}.{name}",
            "ColwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
            group,
            "column-parallel by heads: each rank computes its own heads (a gate: one value per head)",
        )
        for name in block.colwise
    ]
    entries.append(
        PlanEntry(
            f"{path}.{block.norm}",
            "MultiHeadNormParallel",
            dict(head_attributes=("num_heads", "num_features")),
            group,
            "normalises each head on its own: its weight sharded with the heads, no communication",
        )
    )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(PlanEntry(f"{path}.{block.rowwise}", "RowwiseParallel", rowwise, group, f"row-parallel: {reduced}"))
    return entries

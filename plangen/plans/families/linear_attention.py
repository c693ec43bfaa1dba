"""Recognise gated-delta-net linear attention (Qwen3-Next, Qwen3.5, OLMo-Hybrid): sharded by heads.

The evidence is structural: a depthwise ``nn.Conv1d`` over ``2 * key_dim + value_dim`` channels,
the block's own parameters one value per value head (``A_log``, ``dt_bias``), one norm of one value
head's width, input projections from the hidden size whose widths are whole head groups, and one
projection from all value heads back to the hidden size. The head counts and widths are the
block's attributes its forward shapes by (transformers' names for this family, read as numbers and
checked against the shapes above). How the layout splits, see
:mod:`plangen.styles.linear_attention`; the sweep proves each class numerically.

Gated-delta-net linear attention sharded by heads, as plan entries (see :mod:`plangen.styles.linear_attention`).

Per mixer, as a dense attention block: forward one all-reduce (``out_proj``), or one all-gather of
the sequence in and one reduce-scatter out under SP (the recurrence runs over the whole sequence);
backward one all-reduce of the block input's gradient, and one of the gated norm's weight gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.families.dims import has_parameters, is_linear, is_per_feature, ModelDims, own_parameters
from plangen.plans.layouts import row_parallel_output
from plangen.plans.source.forward import read_input_name_readers
from plangen.plans.layouts import hidden_state_layouts
from plangen.plans.families.block import FamilyBlock, UNREAD_CALL, Unplaced

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart


# The attributes the forward shapes by that count all heads (divided by the TP size when applied);
# head_k_dim / head_v_dim are one head's width and stay.
HEAD_ATTRIBUTES = ("num_k_heads", "num_v_heads", "key_dim", "value_dim", "conv_dim")


@dataclass(frozen=True)
class GatedDeltaNetBlock(FamilyBlock):
    """A gated delta net's parts, by child name, as :func:`gated_delta_net_entries` shards them."""

    colwise: tuple[str, ...]  # input projections by head groups (a packed [q; k; v] among them: ``packed``)
    rowwise: str
    norm: str | None  # None: a mixer without heads (plangen.plans.families.short_conv)
    conv_parts: tuple[int, ...]  # (key_dim, key_dim, value_dim), reduced
    head_parameters: tuple[str, ...]
    head_attributes: tuple[str, ...]
    packed: str | None = None  # the projection as wide as the conv's channels: [q; k; v] as it packs them
    packed_parts: tuple[int, ...] = ()  # ``packed``'s parts where they are not the conv's (a short conv's [B; C; x])
    lru: str | None = None  # an RG-LRU child split with the conv's channels (plangen.plans.families.recurrent)
    kind: str = "attention"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        assert part.call is not None
        return gated_delta_net_entries(part.path, self, hidden_state_layouts(part.call, sp), sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        # Its style splits its own heads and prepares its input: it must be where the layer calls it.
        return Unplaced(f"recurrent mixer {UNREAD_CALL}", "attention") if call is None else None


def _int_attribute(block: nn.Module, name: str) -> int | None:
    value = getattr(block, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def recognize_gated_delta_net(block: nn.Module, dims: ModelDims) -> GatedDeltaNetBlock | None:
    """A gated-delta-net mixer whose parts all split by key-head groups, or None."""
    k, v, dk, dv = (_int_attribute(block, n) for n in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
    if None in (k, v, dk, dv) or v % k:
        return None
    key_dim, value_dim = k * dk, v * dv
    convs = [(n, c) for n, c in block.named_children() if isinstance(c, nn.Conv1d)]
    if len(convs) != 1:
        return None
    conv_name, conv = convs[0]
    channels = 2 * key_dim + value_dim
    if not (conv.in_channels == conv.out_channels == conv.groups == channels):
        return None
    own = own_parameters(block)
    if not own or any(shape != (v,) for shape in own.values()):
        return None
    h = dims.hidden
    readers = read_input_name_readers(type(block))  # which projections read the (masked) block input
    if readers is None:
        return None
    # Whole head groups: one part (q or k, v or a gate, a or b), [q; k; v] as the conv takes it,
    # or each key head's group of all of them (Qwen3-Next's in_proj_qkvz, in_proj_ba).
    widths = {key_dim, value_dim, v, channels, 2 * v, channels + value_dim}
    colwise, rowwise, norm, packed = [], [], [], None
    for name, child in block.named_children():
        if name == conv_name or not has_parameters(child):
            continue
        if is_linear(child) and name in readers and child.in_features == h and child.out_features in widths:
            colwise.append(name)
            if child.out_features == channels:
                packed = name
        elif is_linear(child) and name not in readers and child.in_features == value_dim and child.out_features == h:
            rowwise.append(name)
        elif is_per_feature(child, dv):
            norm.append(name)
        else:
            return None
    if len(rowwise) != 1 or len(norm) != 1 or not colwise:
        return None
    unit = gcd(key_dim, value_dim)
    heads = tuple(a for a in HEAD_ATTRIBUTES if _int_attribute(block, a) is not None)
    return GatedDeltaNetBlock(
        colwise=tuple(colwise),
        rowwise=rowwise[0],
        norm=norm[0],
        conv_parts=(key_dim // unit, key_dim // unit, value_dim // unit),
        head_parameters=tuple(own),
        head_attributes=heads,
        packed=packed,
    )


def gated_delta_net_entries(
    path: str, block: GatedDeltaNetBlock, prepared: dict[str, Any], sp: bool
) -> list[PlanEntry]:
    """The mixer at ``path``, its input laid out by ``prepared`` (``PrepareModuleInput``'s layouts)."""
    group = "attention"
    gathered = "one all-gather of the sequence per mixer" if sp else "no communication"
    if block.lru is not None:
        split = (
            f"the conv's channels and {block.lru}'s heads split over TP together, "
            f"{', '.join(block.head_attributes)} made this rank's"
        )
    elif block.head_parameters or block.head_attributes:
        split = (
            f"key heads and their value heads split over TP: {', '.join(block.head_parameters)} and the conv's "
            f"channels with them, {', '.join(block.head_attributes)} made this rank's"
        )
    else:
        split = "the depthwise conv's channels split over TP"
    entries = [
        PlanEntry(
            path,
            "GatedDeltaNetParallel",
            dict(
                **prepared,
                use_local_output=False,
                head_attributes=block.head_attributes,
                head_parameters=block.head_parameters,
                conv_parts=block.conv_parts,
            ),
            group,
            f"{gathered}; one gradient reduction per mixer in backward; {split}",
        )
    ]
    for name in block.colwise:
        if name == block.packed and block.packed_parts:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "FusedColwiseParallel",
                    dict(part_sizes=block.packed_parts, input_layouts=Replicate(), use_local_output=True),
                    group,
                    f"column-parallel by channels; packed parts {block.packed_parts} re-laid out so each rank holds "
                    "its slice of every part, the conv's channels among them",
                )
            )
        elif name == block.packed:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "FusedColwiseParallel",
                    dict(part_sizes=block.conv_parts, input_layouts=Replicate(), use_local_output=True),
                    group,
                    f"column-parallel by heads; packed [q; k; v] {block.conv_parts} re-laid out so each rank holds "
                    "its slice of every part, as the conv takes them",
                )
            )
        else:
            entries.append(
                PlanEntry(
                    f"{path}.{name}",
                    "ColwiseParallel",
                    dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
                    group,
                    f"column-parallel by {block.lru}'s heads: each rank computes its own channels"
                    if block.lru
                    else "column-parallel by key-head groups: each rank computes its own heads",
                )
            )
    if block.lru is not None:
        entries.append(
            PlanEntry(
                f"{path}.{block.lru}",
                "RGLRUParallel",
                {},
                group,
                "RG-LRU by its block-diagonal heads, with the conv's channels: gates and recurrent_param Shard(0), "
                "no communication",
            )
        )
    if block.norm is not None:
        entries.append(
            PlanEntry(
                f"{path}.{block.norm}",
                "AllReduceParamGrads",
                {},
                group,
                "gated norm of one head's width, shared by every head, sees only local heads: its weight gradient is summed over TP",
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    entries.append(PlanEntry(f"{path}.{block.rowwise}", "RowwiseParallel", rowwise, group, f"row-parallel: {reduced}"))
    return entries

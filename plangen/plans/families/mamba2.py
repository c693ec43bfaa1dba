"""Recognize a Mamba2 mixer that splits by heads over TP (:mod:`plangen.styles.mamba2`).

A block is one where :func:`~plangen.styles.mamba2.resolve_mamba2_layout` finds the layout its
forward relies on (``num_heads``, ``head_dim``, ``n_groups``, ``ssm_state_size`` attributes matching
``in_proj``'s ``z|x|B|C|dt`` features, a depthwise ``conv1d`` over ``x|B|C``, per-head ``A_log``,
``D``, ``dt_bias``), whose ``norm`` computes the gated RMSNorm over groups (run once to check) and
whose ``out_proj`` maps the heads back to the hidden size. Anything else with parameters inside it
would see only this rank's heads: the mixer then stays whole, with the reason.

Plan entries for a Mamba2 mixer split by heads over TP (:mod:`plangen.styles.mamba2`).

One place for the three entries every plan with a Mamba2 mixer writes (NemotronH's hand-written plan,
the synthesized plans of GraniteMoeHybrid, Bamba, Mamba2, Zamba2): the mixer takes its input and
lays out ``in_proj``, ``conv1d`` and its per-head parameters, the gated norm is sharded with the
heads, ``out_proj`` is row-parallel back to the residual stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.layouts import row_parallel_output
from plangen.styles.mamba2 import resolve_gated_norm, resolve_mamba2_layout
from plangen.plans.families.block import FamilyBlock, Unplaced
from plangen.plans.families.core import KeptBlock
from plangen.plans.families.dims import ModelDims, has_parameters

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart


@dataclass(frozen=True)
class Mamba2Block(FamilyBlock):
    """A Mamba2 mixer split by heads: its own style, its gated ``norm``, its row-parallel ``out_proj``."""

    norm: str | None = "norm"  # None: the mixer has no norm with parameters (FalconH1's Identity)
    out_proj: str = "out_proj"
    kind: str = "mixer"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        # plangen.styles.mamba2: split by heads
        return [
            mamba2_mixer_entry(part.path, sp),
            *mamba2_children_entries(part.path, sp, norm=self.norm, out_proj=self.out_proj),
        ]

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        # Its style takes the hidden state itself (the first positional argument or hidden_states=),
        # as a column-parallel projection does, so it needs no reading of the call.
        if call is None or call.keyword in (None, "hidden_states"):
            return None
        return Unplaced(f"Mamba2 mixer handed the hidden state as {call.keyword}=", "other", gathered=True)


def recognize_mamba2(block: nn.Module, dims: ModelDims) -> Mamba2Block | KeptBlock | None:
    """A Mamba2 mixer split by heads; one that cannot be kept whole, with why; None for any other block."""
    hidden = dims.hidden
    try:
        layout = resolve_mamba2_layout(block)
    except ValueError:
        return None
    norm, out_proj = getattr(block, "norm", None), getattr(block, "out_proj", None)
    if (
        not isinstance(out_proj, nn.Linear)
        or out_proj.in_features != layout.intermediate
        or out_proj.out_features != hidden
    ):
        return KeptBlock("mixer", f"Mamba2 mixer without an out_proj of {layout.intermediate} -> {hidden} features")
    if not isinstance(norm, nn.Module):
        return KeptBlock("mixer", "Mamba2 mixer without a gated norm")
    if has_parameters(norm):
        try:
            resolve_gated_norm(norm)
        except ValueError as err:
            return KeptBlock("mixer", f"Mamba2 mixer whose norm cannot follow the split by heads: {err}")
    unknown = [
        n for n, c in block.named_children() if n not in ("in_proj", "conv1d", "norm", "out_proj") and has_parameters(c)
    ]
    if unknown:
        return KeptBlock("mixer", f"Mamba2 mixer with submodule {unknown[0]}, which would see only this rank's heads")
    return Mamba2Block(norm="norm" if has_parameters(norm) else None)


MIXER_WHY = (
    "Mamba2 mixer split by heads: z, x, dt, A_log, D, dt_bias and x's conv channels with the heads, B and C "
    "by groups (one group: its rows gathered whole per forward, gradient reduce-scattered)"
)


def mamba2_mixer_entry(path: str, sequence_parallel: bool, group: str = "other") -> PlanEntry:
    """The mixer's own entry: its input gathered (SP) and taken whole; its gradient reduced once."""
    gathered = (
        "one all-gather of the sequence in, its gradient reduce-scattered"
        if sequence_parallel
        else ("its input gradient all-reduced once")
    )
    return PlanEntry(
        path,
        "Mamba2MixerParallel",
        dict(input_layouts=Shard(1) if sequence_parallel else Replicate()),
        group,
        f"{MIXER_WHY}; {gathered}",
    )


def mamba2_children_entries(
    path: str, sequence_parallel: bool, group: str = "other", norm: str | None = "norm", out_proj: str = "out_proj"
) -> list[PlanEntry]:
    """The mixer's gated norm (none: a mixer without one) and its row-parallel ``out_proj`` (``path``
    may be a ``*`` pattern)."""
    rowwise, reduced = row_parallel_output(sequence_parallel)
    entries = (
        []
        if norm is None
        else [
            PlanEntry(
                f"{path}.{norm}",
                "GatedRMSNormParallel",
                {},
                group,
                "gated RMSNorm on this rank's heads; a group spread over ranks (n_groups 1) all-reduces its "
                "sum of squares (B·S values each way)",
            ),
        ]
    )
    return entries + [
        PlanEntry(f"{path}.{out_proj}", "RowwiseParallel", rowwise, group, f"row-parallel: {reduced}"),
    ]

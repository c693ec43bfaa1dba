"""Recognise a Mamba (v1) mixer (Mamba, FalconMamba, Jamba's Mamba layers) that splits by channels.

By shapes: ``in_proj`` from the hidden size to twice the intermediate width (x and the gate), a
depthwise ``conv1d`` over the intermediate channels, ``x_proj`` from them to ``dt_rank + 2 state``
(no bias), ``dt_proj`` from ``dt_rank`` back to them, ``out_proj`` to the hidden size, and the
mixer's own ``A_log [channels, state]`` and ``D [channels]``. The parts are found by transformers'
names, which :class:`plangen.styles.mamba1.Mamba1MixerParallel` hooks by name (as the latent
attention's style does); the shapes are the evidence. Norms with weights on ``dt``, ``B`` and
``C`` (Jamba's) are where their gradient is summed over TP, so that the norms' weights see it whole.

A Mamba1 mixer's plan entries: its channels split over TP (``plangen.styles.mamba1``), ``out_proj``
row-parallel as attention's output projection is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.layouts import SEQ
from plangen.plans.families.block import FamilyBlock
from plangen.plans.families.core import KeptBlock
from plangen.plans.families.dims import ModelDims, has_parameters

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.synthesis.findings import BlockPart


@dataclass(frozen=True)
class Mamba1Block(FamilyBlock):
    """A Mamba1 mixer split over TP by its intermediate channels (``plangen.plans.families.mamba1``)."""

    # The children whose outputs enter the per-channel part: their gradient is summed over TP there.
    grad_reduced: tuple[str, ...]
    kind: str = "mixer"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return mamba1_entries(part.path, self, sp)


def recognize_mamba1_mixer(block: nn.Module, dims: ModelDims) -> Mamba1Block | KeptBlock | None:
    """A Mamba1 mixer reading and writing the hidden size, and where its ``dt``/``B``/``C`` gradients
    are summed; one that cannot be split kept whole, with why; None for anything else."""
    from plangen.styles.mamba1 import CONV, DT_PROJ, IN_PROJ, OUT_PROJ, X_PROJ, mamba1_parts_problem

    if mamba1_parts_problem(block) is not None:
        return None
    in_proj, out_proj = getattr(block, IN_PROJ), getattr(block, OUT_PROJ)
    if in_proj.in_features != dims.hidden or out_proj.out_features != dims.hidden:
        return None
    rank, state = getattr(block, DT_PROJ).in_features, block.A_log.shape[1]
    if getattr(block, X_PROJ).out_features != rank + 2 * state:
        return None
    parts = {IN_PROJ, CONV, X_PROJ, DT_PROJ, OUT_PROJ}
    norms = [(n, c) for n, c in block.named_children() if n not in parts and has_parameters(c)]
    if not norms:
        return Mamba1Block((X_PROJ,))
    # One weighted norm per piece of x_proj's output (dt, B, C), or the gradient sums would miss a piece.
    widths = sorted(_norm_width(c) or 0 for _, c in norms)
    if len(norms) != 3 or widths != sorted((rank, state, state)):
        names = ", ".join(f"{n} ({type(c).__name__})" for n, c in norms)
        return KeptBlock("mixer", f"Mamba1 mixer with {names} beside its parts: not one norm each on dt, B and C")
    return Mamba1Block(tuple(n for n, _ in norms))


def _norm_width(module: nn.Module) -> int | None:
    """The width of a leaf whose every parameter is one value per feature (a norm), else None."""
    shapes = {tuple(p.shape) for p in module.parameters()}
    if any(has_parameters(c) for c in module.children()) or len(shapes) != 1:
        return None
    (shape,) = shapes
    return shape[0] if len(shape) == 1 else None


def mamba1_entries(path: str, block: Mamba1Block, sequence_parallel: bool) -> list[PlanEntry]:
    """The mixer at ``path``: whole sequence in (the scan runs over it), a partial sum out of
    ``out_proj`` reduced once (all-reduce, or reduce-scatter back to the sequence shards under SP)."""
    sp = sequence_parallel
    gathered = "one all-gather of the sequence in (the scan needs all of it)" if sp else "the whole input on every rank"
    reduced = "reduce-scatter back to the sequence-sharded residual" if sp else "one all-reduce"
    return [
        PlanEntry(
            path,
            "Mamba1MixerParallel",
            dict(input_layouts=SEQ if sp else Replicate(), grad_reduced=block.grad_reduced),
            "other",
            f"Mamba1 mixer split by channels: {gathered}; x_proj row-parallel (one all-reduce of B·S·(dt_rank+2·state)); "
            f"the gradients of the input and of dt/B/C summed over TP at {', '.join(block.grad_reduced)}",
        ),
        PlanEntry(
            f"{path}.out_proj",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp),
            "other",
            f"row-parallel: {reduced}",
        ),
    ]

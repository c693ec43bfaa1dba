"""Recognise a Mamba (v1) mixer (Mamba, FalconMamba, Jamba's Mamba layers) that splits by channels.

By shapes: ``in_proj`` from the hidden size to twice the intermediate width (x and the gate), a
depthwise ``conv1d`` over the intermediate channels, ``x_proj`` from them to ``dt_rank + 2 state``
(no bias), ``dt_proj`` from ``dt_rank`` back to them, ``out_proj`` to the hidden size, and the
mixer's own ``A_log [channels, state]`` and ``D [channels]``. The parts are found by transformers'
names, which :class:`plangen.mamba1_styles.Mamba1MixerParallel` hooks by name (as the latent
attention's style does); the shapes are the evidence. Norms with weights on ``dt``, ``B`` and
``C`` (Jamba's) are where their gradient is summed over TP, so that the norms' weights see it whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:  # plangen.plans.recognize imports this module
    from plangen.plans.recognize import KeptBlock, ModelDims


@dataclass(frozen=True)
class Mamba1Block:
    """A Mamba1 mixer split over TP by its intermediate channels (``plangen.plans.mamba1``)."""

    # The children whose outputs enter the per-channel part: their gradient is summed over TP there.
    grad_reduced: tuple[str, ...]
    kind: str = "mixer"


def recognize_mamba1_mixer(block: nn.Module, dims: "ModelDims") -> "Mamba1Block | KeptBlock | None":
    """A Mamba1 mixer, and where its ``dt``/``B``/``C`` gradients are summed; None for anything else."""
    from plangen.plans.recognize import KeptBlock, describe, has_parameters, is_per_feature
    from plangen.mamba1_styles import CONV, DT_PROJ, IN_PROJ, OUT_PROJ, X_PROJ, mamba1_parts_problem

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
    widths = sorted(c.weight.shape[0] for _, c in norms if is_per_feature(c, c.weight.shape[0]))
    if len(norms) != 3 or widths != sorted((rank, state, state)):
        names = ", ".join(describe(n, c) for n, c in norms)
        return KeptBlock("mixer", f"Mamba1 mixer with {names} beside its parts: not one norm each on dt, B and C")
    return Mamba1Block(tuple(n for n, _ in norms))

"""Plan entries for a Mamba2 mixer split by heads over TP (:mod:`plangen.styles.mamba2`).

One place for the three entries every plan with a Mamba2 mixer writes (NemotronH's hand-written plan,
the synthesized plans of GraniteMoeHybrid, Bamba, Mamba2, Zamba2): the mixer takes its input and
lays out ``in_proj``, ``conv1d`` and its per-head parameters, the gated norm is sharded with the
heads, ``out_proj`` is row-parallel back to the residual stream.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.layouts import row_parallel_output

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

"""``search_layouts``: the TP x DP layouts of a world size, with SP and activation checkpointing
choices, whose traced peak (:func:`plangen.cost.peak.measure_peak`) fits a GPU; ordered by the TP
bytes each rank sends per step (:func:`plangen.cost.report.build_cost_report`), then by the peak.

Pure: nothing is printed. A TP size the model's heads refuse is skipped (listed in ``skipped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plangen.cost.settings import CostError


@dataclass(frozen=True)
class Layout:
    tp_size: int
    dp_size: int
    sequence_parallel: bool
    activation_checkpointing: bool
    peak_bytes: int
    tp_sent_bytes: int  # per rank and step, the plan's TP collectives (ring algorithms)
    margin_bytes: int

    @property
    def fits(self) -> bool:
        return self.margin_bytes >= 0


@dataclass(frozen=True)
class FitSearch:
    model: str
    world_size: int
    gpu_bytes: int
    layouts: tuple[Layout, ...]  # every layout traced: those that fit first, by TP traffic, then the rest
    skipped: tuple[str, ...]  # "TP n: why"

    @property
    def fitting(self) -> tuple[Layout, ...]:
        return tuple(layout for layout in self.layouts if layout.fits)


def candidate_layouts(world_size: int, seq_len: int) -> list[tuple[int, int, bool, bool]]:
    """(TP, DP, SP, checkpointing) for every TP dividing the world size; SP only where TP > 1 and
    the sequence divides by TP."""
    if world_size < 1:
        raise CostError(f"--world-size must be at least 1, got {world_size}")
    out = []
    for tp in (n for n in range(1, world_size + 1) if world_size % n == 0):
        for sp in (False, True):
            if sp and (tp == 1 or seq_len % tp):
                continue
            out += [(tp, world_size // tp, sp, ac) for ac in (False, True)]
    return out


def search_layouts(target: str, world_size: int, gpu_bytes: int, *, seq_len: int = 4096, **settings: Any) -> FitSearch:
    """Trace every candidate layout of ``world_size`` ranks; ``settings``: micro_batch, dtype,
    master_dtype, model (as :func:`~plangen.cost.peak.measure_peak` takes them)."""
    from plangen.distributed.fake_group import fake_process_group
    from plangen.cost.peak import measure_peak
    from plangen.cost.report import build_cost_report

    # One fake group for every layout: torch keeps state across a fake group destroyed and made
    # again at another size (a later step then gathers over the wrong number of ranks).
    with fake_process_group(world_size, error=CostError):
        return _search(target, world_size, gpu_bytes, seq_len, settings, measure_peak, build_cost_report)


def _search(target, world_size, gpu_bytes, seq_len, settings, measure_peak, build_cost_report) -> FitSearch:
    layouts, skipped, traffic = [], [], {}
    for tp, dp, sp, ac in candidate_layouts(world_size, seq_len):
        if any(s.startswith(f"TP {tp}:") for s in skipped):
            continue
        try:
            report = measure_peak(
                target,
                tp_size=tp,
                dp_size=dp,
                seq_len=seq_len,
                sequence_parallel=sp,
                activation_checkpointing=ac,
                **settings,
            )
        except CostError as error:
            if str(error).startswith(f"--tp-size {tp}:"):  # the heads refuse this TP size: not a layout
                skipped.append(f"TP {tp}: {str(error).split(': ', 1)[1]}")
                continue
            raise
        if (tp, sp) not in traffic:
            # Checkpointing's recompute repeats forward's TP collectives; the cost report does not
            # model it (docs/cost.md), so layouts that differ only by it share a figure.
            cost = build_cost_report(target, tp_size=tp, dp_size=dp, seq_len=seq_len, sequence_parallel=sp, **settings)
            traffic[(tp, sp)] = cost.plans[0].sent_bytes("TP")
        peak = report.peak.breakdown.total
        layouts.append(Layout(tp, dp, sp, ac, peak, traffic[(tp, sp)], gpu_bytes - peak))
    layouts.sort(key=lambda l: (not l.fits, l.tp_sent_bytes, l.activation_checkpointing, l.peak_bytes))
    return FitSearch(target, world_size, gpu_bytes, tuple(layouts), tuple(skipped))

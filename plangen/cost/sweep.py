"""``plangen cost`` over many configs and TP sizes: for each, the figures or the one-line refusal.

Each case is what ``plangen cost CONFIG --tp-size T --dp-size 2 --seq-len 4200 --sequence-parallel`` computes, by
the core function the CLI calls (:func:`plangen.cost.report.build_cost_report`), in one process
(the shrunk measurements are cached between cases). Sequence parallel is asked for at TP > 1; where
the plan has none, the case is costed without it and the reason is kept. A :class:`CostError` is a
refusal (its line is what the CLI prints); any other exception is a bug and propagates.

``scripts/sweep_cost.py`` runs it over ``tests/data/model-configs`` and writes the table into
``docs/cost.md``; ``tests/test_cost_sweep.py`` checks every case's verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from plangen.cost.settings import CostError

SWEEP_TP_SIZES = tuple(range(1, 9))
SWEEP_DP_SIZE = 2
# Divisible by every TP size of the sweep (840 = lcm(1..8)), so sequence parallel can be costed at each.
SWEEP_SEQ_LEN = 4200
HEAD_LABELS = {"num_attention_heads": "heads", "num_key_value_heads": "KV heads"}


@dataclass(frozen=True)
class SweepCase:
    """One ``plangen cost`` run of the sweep: its figures, or why it was refused."""

    config: str  # the config file's stem
    tp_size: int
    sequence_parallel: bool  # as costed
    memory_bytes: int | None  # weights, gradients and AdamW per rank (rank 0)
    ideal_bytes: int | None  # the whole model's / (DP x TP)
    tp_sharded_fraction: float | None  # of the parameter elements
    refusal: str | None  # the one-line error, when refused
    no_sp: str | None  # why sequence parallel was not costed (TP > 1, the plan has none)
    seconds: float

    @property
    def works(self) -> bool:
        return self.refusal is None


def sweep_cost_case(config: Path, tp_size: int, dp_size: int = SWEEP_DP_SIZE) -> SweepCase:
    """``plangen cost CONFIG --tp-size T --dp-size D --seq-len 4200`` with sequence parallel where the plan has it."""
    from plangen.cost.report import build_cost_report

    start = time.perf_counter()
    sequence_parallel, no_sp = tp_size > 1, None
    while True:
        try:
            report = build_cost_report(
                str(config),
                tp_size=tp_size,
                dp_size=dp_size,
                seq_len=SWEEP_SEQ_LEN,
                sequence_parallel=sequence_parallel,
            )
        except CostError as error:
            if sequence_parallel and "sequence" in str(error).lower():
                sequence_parallel, no_sp = False, str(error)
                continue
            return SweepCase(
                config.stem,
                tp_size,
                sequence_parallel,
                None,
                None,
                None,
                str(error),
                no_sp,
                time.perf_counter() - start,
            )
        memory = report.plans[0].memory
        return SweepCase(
            config.stem,
            tp_size,
            sequence_parallel,
            memory.total,
            memory.ideal,
            memory.tp_sharded_fraction,
            None,
            no_sp,
            time.perf_counter() - start,
        )


def sweep_cost(
    configs: Iterable[Path],
    tp_sizes: Sequence[int] = SWEEP_TP_SIZES,
    progress: Callable[[SweepCase], None] | None = None,
) -> list[SweepCase]:
    """Every config at every TP size, in order."""
    cases = []
    for config in configs:
        for tp in tp_sizes:
            case = sweep_cost_case(config, tp)
            if progress is not None:
                progress(case)
            cases.append(case)
    return cases


def _gib(n: int) -> str:
    gib = n / 2**30
    return f"{gib:,.0f}" if gib >= 100 else f"{gib:.3g}"


def render_sweep_cell(case: SweepCase) -> str:
    """``12.3 (1.00x)``: memory per rank in GiB and its ratio to the ideal; a refusal's short reason."""
    if case.refusal is not None:
        return refusal_label(case.refusal)
    ratio = case.memory_bytes / case.ideal_bytes if case.ideal_bytes else float("nan")
    sp = "" if case.sequence_parallel or case.tp_size == 1 else " no SP"
    return f"{_gib(case.memory_bytes)} ({ratio:.2f}x{sp})"


def refusal_label(message: str) -> str:
    """The refusal shortened for a table cell: ``no: 12 heads, max 6`` (the count the TP size does not
    divide, the largest legal TP size)."""
    import re

    found = re.search(r"(\w+)=(\d+) .*?the largest legal TP size for \S+ is (\d+)", message)
    if found:
        what = HEAD_LABELS.get(found.group(1), found.group(1))
        return f"no: {found.group(2)} {what}, max {found.group(3)}"
    return "no: " + message


def render_sweep_table(cases: Sequence[SweepCase]) -> str:
    """A markdown table: a row per config, a column per TP size; then the TP-sharded share per config."""
    tps = sorted({c.tp_size for c in cases})
    configs = list(dict.fromkeys(c.config for c in cases))
    by_key = {(c.config, c.tp_size): c for c in cases}
    lines = [
        "| config | TP-sharded | " + " | ".join(f"TP {t}" for t in tps) + " |",
        "|---|---|" + "---|" * len(tps),
    ]
    for config in configs:
        row = [by_key[(config, t)] for t in tps if (config, t) in by_key]
        fractions = [c.tp_sharded_fraction for c in row if c.works and c.tp_size > 1]
        share = f"{min(fractions):.1%}" if fractions else "n/a"
        lines.append(f"| {config} | {share} | " + " | ".join(render_sweep_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def render_sweep_summary(cases: Sequence[SweepCase]) -> str:
    """One line: how many cases work, how many are refused and why, the time taken."""
    works = sum(c.works for c in cases)
    reasons: dict[str, int] = {}
    for c in cases:
        if c.refusal is not None:
            label = refusal_label(c.refusal).removeprefix("no: ").split(",")[0].lstrip("0123456789 ")
            reasons[label] = reasons.get(label, 0) + 1
    refused = ", ".join(f"{n} by the {label}" for label, n in sorted(reasons.items()))
    seconds = sum(c.seconds for c in cases)
    return (
        f"{works} of {len(cases)} cases costed, {len(cases) - works} refused"
        f"{' (' + refused + ')' if refused else ''}; {seconds:.0f} s in one process"
    )

"""Benchmark 10 (``--only compile``): step time on CPU of ``parallelize_model(compile=True)`` against
eager, the same plan, DP 2 x TP 2 on 4 gloo ranks, for the small Llama and the small Qwen3-MoE of
:mod:`step_time` (its MoE config records no router logits: ``docs/compile.md``).

Launches alternate (eager, compiled, eager, ...), paired; each reports its steps after the warm-up,
pooled per variant: the median step and each pair's ratio (median over pairs). The compile time is
reported apart: the first step of a compiled launch less the first step of its paired eager one.
The first losses must agree (same weights, same batch). No speed goal: at this size on CPU the
figures describe, they do not promise (``docs/compile.md``).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from common import Goal, Section
from step_time import FULL, LOSS_TOLERANCE, QUICK, describe_model, run_variant, save_small_model

VARIANTS = ("plangen", "compiled")
KINDS = ("llama", "moe")


def run_compile_benchmark(quick: bool = False) -> Section:
    options = QUICK if quick else FULL
    section = Section(
        f"10. Step time on CPU (gloo), DP 2 x TP 2, eager vs compiled decoder layers (parallelize_model(compile=True)), "
        f"batch {options['batch']} x {options['seq']}",
        [
            "model",
            "eager median step",
            "compiled median step",
            "compiled / eager (median of pairs)",
            "compile time (first step)",
            "first loss gap",
        ],
    )
    for kind in KINDS:
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        pairs, compile_seconds, gaps = [], [], []
        with tempfile.TemporaryDirectory(prefix=f"plangen-bench-compile-{kind}-") as tmp:
            weights = save_small_model(Path(tmp), kind)
            for _ in range(options["repeats"]):
                ranks = {v: run_variant(v, weights, options) for v in VARIANTS}
                for v in VARIANTS:
                    times[v] += ranks[v][0]["times"]
                pairs.append(
                    statistics.median(ranks["compiled"][0]["times"]) / statistics.median(ranks["plangen"][0]["times"])
                )
                compile_seconds.append(ranks["compiled"][0]["first_step"] - ranks["plangen"][0]["first_step"])
                gaps.append(abs(ranks["compiled"][0]["losses"][0] - ranks["plangen"][0]["losses"][0]))
        section.rows.append(
            [
                describe_model(kind),
                f"{statistics.median(times['plangen']) * 1e3:.1f} ms",
                f"{statistics.median(times['compiled']) * 1e3:.1f} ms",
                f"{statistics.median(pairs):.2f}x",
                f"{statistics.median(compile_seconds):.1f} s",
                f"{max(gaps):.1e}",
            ]
        )
        section.goals.append(
            Goal(
                f"{kind}: compiled and eager start from the same loss",
                max(gaps) <= LOSS_TOLERANCE,
                f"gap {max(gaps):.1e}",
            )
        )
    return section

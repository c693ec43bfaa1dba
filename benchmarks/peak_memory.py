"""Benchmark 9: ``plangen cost --peak``'s predicted peak per rank against the peak measured on real tensors.

The cases of :mod:`plangen.cost.validate` (the ones ``tests/test_peak.py`` asserts on): a small
Llama, Qwen3 and Qwen3-MoE (hidden 128, 2 layers, 2 x 128 tokens per DP rank) at DP 2 x TP 2,
sequence parallel off and on, activation checkpointing off and on, and the Qwen3-MoE once more
with every route sent to one TP rank's experts. Predicted: rank 0's step traced with fake tensors on
the fake process group (what ``plangen cost --peak`` prints). Measured: the same step and tracker on
real tensors, 4 gloo processes, one launch; each rank's peak of each phase (forward, backward, the
optimizer step) and its split by kind.

Goals (the issue's): every phase's peak within 10 % of the measured one on every rank; and every
kind but the temporaries (parameters, gradients, optimizer states, activations, gathered
parameters) byte for byte.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from common import Goal, Section

GOAL = 0.10
PHASES = ("forward", "backward", "optimizer")


def run_peak_benchmark(quick: bool = False) -> Section:
    from plangen.distributed.fake_group import fake_process_group
    from plangen.cost.validate import CASES, DP_SIZE, TP_SIZE, measure_cases, predict_cases

    cases = [c for c in CASES if not (c["sp"] or c["ac"])][:1] if quick else CASES
    with tempfile.TemporaryDirectory(prefix="plangen-peak-") as folder, fake_process_group(DP_SIZE * TP_SIZE):
        predicted = predict_cases(cases, Path(folder))
    return build_peak_section(cases, predicted, measure_cases(cases))


def build_peak_section(
    cases: list[dict[str, Any]], predicted: dict[str, Any], measured: list[dict[str, Any]]
) -> Section:
    """The table and goals from the predictions (by case name) and each rank's measurements."""
    from plangen.cost.validate import compare_phase

    section = Section(
        "9. Peak memory per rank, predicted (`plangen cost --peak`, fake tensors) vs measured (real tensors, "
        "gloo), DP 2 x TP 2, 2 layers, 2 x 128 tokens per DP rank",
        ["model", "SP", "AC", "routing", "phase", "predicted", "measured (4 ranks)", "error", "not byte for byte"],
    )
    worst, inexact, failed, compared, shares = (-1.0, ""), [], [], 0, []
    for case in cases:
        per_rank = [rank[case["name"]] for rank in measured]
        errors = [r["error"] for r in per_rank if "error" in r]
        if errors:
            failed.append(f"{case['name']}: {errors[0]}")
            continue
        if "route_share" in per_rank[0]:
            split = " / ".join(f"{100 * share:.1f} %" for share in per_rank[0]["route_share"])
            shares.append(f"{case['name']} {split}")
        for phase in PHASES:
            c = compare_phase(predicted[case["name"]], per_rank, phase)
            compared += 1
            low, high = min(c.measured), max(c.measured)
            shown = _mib(low) if low == high else f"{_mib(low)} - {_mib(high)}"
            section.rows.append(
                [
                    case["model"],
                    "on" if case["sp"] else "off",
                    "on" if case["ac"] else "off",
                    case["routing"],
                    phase,
                    _mib(c.predicted),
                    shown,
                    f"{100 * c.error:.1f} %",
                    ", ".join(c.differing) or "-",
                ]
            )
            if c.error > worst[0]:
                worst = (c.error, f"{case['name']} {phase}")
            if set(c.differing) - {"temporary"}:
                inexact.append(f"{case['name']} {phase}: {', '.join(c.differing)}")
    section.goals.append(
        Goal(
            f"every phase's predicted peak within {100 * GOAL:.0f} % of the measured one, every rank",
            not failed and worst[0] <= GOAL,
            f"largest error {100 * max(worst[0], 0):.1f} % ({worst[1] if worst[0] > 0 else 'every total equal'}), "
            f"{compared} phases" + (f"; failed: {'; '.join(failed)}" if failed else ""),
        )
    )
    section.goals.append(
        Goal(
            "parameters, gradients, optimizer states, activations, gathered parameters byte for byte, every rank",
            not failed and not inexact,
            f"{compared - len(inexact)} of {compared} phases" + (f"; not: {'; '.join(inexact)}" if inexact else ""),
        )
    )
    section.notes.append(
        "temporaries may differ: gloo's worker thread keeps a collective's work and its tensors a moment after "
        "the caller's wait returns, so a rank can still hold a reduce-scatter input that the trace has freed "
        "(timing; docs/cost.md); for the same reason activations count as exact when above the trace by exactly "
        "one or two works' tensors as the real run recorded them (plangen.cost.validate.held_by_gloo), a rank "
        "whose peak is another moment because gloo held them then is compared by its total, above the trace's by "
        "at most them (plangen.cost.validate.peaked_while_held), and a rank that peaked with FSDP2's next "
        "all-gather early (more gathered, fewer activations, its total at most that buffer above the trace's) "
        "counts as the trace's moment (plangen.cost.validate.gathered_early)"
    )
    section.notes.append(
        "routing: the prediction has none (fake tensors); 'random' is the model's own router (routes spread over "
        "both TP ranks' experts), 'one-rank' a router of zero weights (every route to one TP rank's experts); "
        "both are compared with the same prediction"
        + (f"; share of the routes each TP rank's experts got: {'; '.join(shares)}" if shares else "")
    )
    return section


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.3f} MiB"

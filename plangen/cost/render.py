"""The cost report as a table (rich) or as JSON; totals first, ratios to the first plan."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from typing import Any

from plangen.cost.data import CostReport, PlanCost
from plangen.cost.memory import ADAMW_STATES
from plangen.cost.units import format_bytes, format_margin

SCHEMA = "plangen.cost/1"
SENT_NOTE = (
    "sent/rank: bytes each rank sends per step, ring algorithms: all-reduce 2(n-1)/n of the tensor, "
    "all-gather and reduce-scatter (n-1)/n. TP collectives are measured on shrunk models and scaled to "
    "the real sizes (docs/cost.md); B micro-batch, S sequence, H hidden, V vocabulary, D head size, "
    "Lq and Lkv latent attention's ranks, E routed experts, k experts per token, P the prompt tokens a model "
    "prepends itself, L the decoder layers, Hp the per-layer input width (hidden_size_per_layer_input)."
)


def ratio(value: float, first: float) -> float | None:
    if first == 0:
        return None if value else 1.0
    return value / first


def format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def summary_rows(plan: PlanCost) -> dict[str, float]:
    """The totals a person wants first, by name (also the keys of the JSON ``totals``)."""
    return {
        "memory_bytes": plan.memory.total,
        "ideal_memory_bytes": plan.memory.ideal,
        "replicated_bytes": plan.memory.replicated,
        "sent_bytes": plan.sent_bytes(),
        "tp_sent_bytes": plan.sent_bytes("TP"),
        "fsdp_sent_bytes": plan.sent_bytes("FSDP2"),
        "collectives": plan.count(),
    }


def _header(report: CostReport) -> str:
    s = report.settings
    sp = ", sequence parallel" if s.sequence_parallel else ""
    return (
        f"{report.model_class} ({report.model}), {report.layers} layers\n"
        f"TP {s.tp_size} x DP {s.dp_size} = {s.tp_size * s.dp_size} ranks{sp}; one step of micro-batch "
        f"{s.micro_batch} x sequence {s.seq_len}; {s.dtype} compute, {s.master_dtype} weights, gradients and AdamW"
    )


def render_cost_text(report: CostReport, width: int = 110) -> str:
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None, highlight=False)
    console.print(f"plangen cost: {_header(report)}", markup=False)
    first = summary_rows(report.plans[0])

    summary = Table(title="Per rank, per step", title_justify="left", show_edge=False)
    summary.add_column("")
    for plan in report.plans:
        summary.add_column(plan.name, justify="right")
    lines = (
        ("memory (weights, grads, AdamW)", "memory_bytes"),
        ("  ideal: whole model / (DP x TP)", "ideal_memory_bytes"),
        ("  left replicated over TP", "replicated_bytes"),
        ("communication sent", "sent_bytes"),
        ("  TP (activations)", "tp_sent_bytes"),
        ("  FSDP2 (params, grads)", "fsdp_sent_bytes"),
    )
    for label, key in lines:
        cells = []
        for i, plan in enumerate(report.plans):
            value = summary_rows(plan)[key]
            cell = format_bytes(value)
            if i and not label.startswith("  ideal"):
                cell += f" ({format_ratio(ratio(value, first[key]))})"
            cells.append(cell)
        summary.add_row(label, *cells)
    summary.add_row("collectives", *(str(p.count()) for p in report.plans))
    console.print(summary)
    for plan in report.plans:
        console.print()
        console.print(f"{plan.name}: {plan.description}", markup=False)
        console.print(_memory_table(plan))
        console.print(_collectives_table(plan))
        for note in plan.notes:
            console.print(f"note: {note}", markup=False)
    console.print()
    console.print(SENT_NOTE, markup=False)
    return out.getvalue()


def _memory_table(plan: PlanCost):
    from rich.table import Table

    m = plan.memory
    table = Table(title="Memory per rank", title_justify="left", show_edge=False)
    for column in ("", "per rank", "left replicated over TP", "ideal"):
        table.add_column(column, justify="left" if not column else "right")
    copies = 2 + ADAMW_STATES
    for label, value, share in (
        ("parameters", m.parameters, 1),
        ("gradients", m.gradients, 1),
        (f"AdamW ({ADAMW_STATES} states)", m.optimizer, ADAMW_STATES),
    ):
        table.add_row(
            label,
            format_bytes(value),
            format_bytes(m.replicated * share / copies),
            format_bytes(m.ideal * share / copies),
        )
    table.add_row("total", format_bytes(m.total), format_bytes(m.replicated), format_bytes(m.ideal))
    return table


def _collectives_table(plan: PlanCost):
    from rich.table import Table

    table = Table(title="Collectives per step", title_justify="left", show_edge=False)
    for column in ("", "phase", "collective", "tensor", "", "count", "payload", "sent/rank"):
        table.add_column(column, justify="right" if column in ("count", "payload", "sent/rank") else "left")
    for c in plan.collectives:
        table.add_row(
            c.source,
            c.phase,
            c.kind,
            c.tensor,
            c.scope,
            str(c.count),
            format_bytes(c.payload_bytes),
            format_bytes(c.sent_bytes),
        )
    if not plan.collectives:
        table.add_row("-", "-", "none (TP 1 and DP 1)", "", "", "0", "0 B", "0 B")
    return table


def build_cost_json(report: CostReport) -> dict[str, Any]:
    first = summary_rows(report.plans[0])
    plans = []
    for plan in report.plans:
        totals = summary_rows(plan)
        plans.append(
            {
                "name": plan.name,
                "description": plan.description,
                "totals": totals,
                "ratios": {
                    key: ratio(totals[key], first[key])
                    for key in ("memory_bytes", "sent_bytes", "tp_sent_bytes", "fsdp_sent_bytes")
                },
                "memory": {**asdict(plan.memory), "total": plan.memory.total},
                "collectives": [asdict(c) for c in plan.collectives],
                "notes": list(plan.notes),
            }
        )
    return {
        "schema": SCHEMA,
        "model": report.model,
        "model_class": report.model_class,
        "layers": report.layers,
        "settings": asdict(report.settings),
        "plans": plans,
    }


def render_cost_json(report: CostReport) -> str:
    return json.dumps(build_cost_json(report), indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# --peak


def render_peak_text(reports, gpu_bytes: int | None = None) -> str:
    """Each plan's peak per rank, split by kind, each phase's peak, and the verdict for ``gpu_bytes``."""
    from plangen.cost.peak import where_in_step

    first = reports[0]
    s = first.settings
    lines = [
        f"{first.model} ({first.model_class}, {first.layers} layers): peak memory per rank of one training step",
        f"TP {s.tp_size} x DP {s.dp_size}, {s.micro_batch} x {s.seq_len} tokens per DP rank, {s.dtype} compute, "
        f"{s.master_dtype} weights/gradients/AdamW, sequence parallel {'on' if s.sequence_parallel else 'off'}, "
        f"activation checkpointing {'on' if first.activation_checkpointing else 'off'}",
    ]
    for report in reports:
        peak = report.peak
        where = where_in_step(peak.phase, peak.module, peak.place)
        lines += [
            "",
            f"plan {report.plan}: peak {format_bytes(peak.breakdown.total)} in {peak.phase}, {where} "
            f"(traced in {report.seconds:.1f} s)",
        ]
        lines += [f"  {name:<12} {format_bytes(value):>11}" for name, value in peak.breakdown.items()]
        lines.append(
            "  each phase's peak: " + ", ".join(f"{p.phase} {format_bytes(p.breakdown.total)}" for p in report.phases)
        )
        if gpu_bytes is not None:
            margin = report.margin(gpu_bytes)
            verdict = "fits" if margin >= 0 else "does not fit"
            lines.append(f"  {verdict} in {format_bytes(gpu_bytes)}: {format_margin(margin)}")
    lines += [f"note: {note}" for note in first.notes]
    return "\n".join(lines) + "\n"


def build_peak_json(reports, gpu_bytes: int | None = None) -> dict[str, Any]:
    first = reports[0]
    return {
        "schema": "plangen.cost.peak/1",
        "model": first.model,
        "model_class": first.model_class,
        "layers": first.layers,
        "settings": {**asdict(first.settings), "activation_checkpointing": first.activation_checkpointing},
        "gpu_memory_bytes": gpu_bytes,
        "plans": [
            {
                "name": r.plan,
                "seconds": round(r.seconds, 2),
                "peak": {
                    "bytes": r.peak.breakdown.total,
                    "phase": r.peak.phase,
                    "module": r.peak.module,
                    "place": r.peak.place,
                    **dict(r.peak.breakdown.items()),
                },
                "phases": {p.phase: p.breakdown.total for p in r.phases},
                "fits": None if gpu_bytes is None else r.margin(gpu_bytes) >= 0,
                "margin_bytes": None if gpu_bytes is None else r.margin(gpu_bytes),
                # Depths traced where the step was extrapolated to "layers"; null where every layer was.
                "extrapolated_from": list(r.extrapolated_from) or None,
                "timeline": [
                    {
                        "phase": p.phase,
                        "place": p.place,
                        "layer": p.layer,
                        "module": p.module,
                        "bytes": p.breakdown.total,
                        **dict(p.breakdown.items()),
                    }
                    for p in r.timeline
                ],
            }
            for r in reports
        ],
        "notes": list(first.notes),
    }


def render_fit_text(search) -> str:
    """The layouts that fit, by TP traffic per rank and step, then those that do not."""
    lines = [
        f"{search.model}: layouts of {search.world_size} ranks on {format_bytes(search.gpu_bytes)} GPUs "
        "(fitting first, by TP bytes sent per rank and step)",
        f"{'TP':>4} {'DP':>4} {'SP':>4} {'ckpt':>5} {'peak':>11} {'margin':>11} {'TP sent':>11}  verdict",
    ]
    for l in search.layouts:
        margin = ("" if l.fits else "-") + format_bytes(abs(l.margin_bytes))
        lines.append(
            f"{l.tp_size:>4} {l.dp_size:>4} {'on' if l.sequence_parallel else 'off':>4} "
            f"{'on' if l.activation_checkpointing else 'off':>5} {format_bytes(l.peak_bytes):>11} {margin:>11} "
            f"{format_bytes(l.tp_sent_bytes):>11}  {'fits' if l.fits else 'does not fit'}"
        )
    if not search.fitting:
        lines.append("no layout fits")
    lines += [f"skipped {reason}" for reason in search.skipped]
    return "\n".join(lines) + "\n"


def build_fit_json(search) -> dict[str, Any]:
    """``--fit --format json``: every layout traced, in the table's order."""
    return {
        "schema": "plangen.cost.fit/1",
        "model": search.model,
        "world_size": search.world_size,
        "gpu_memory_bytes": search.gpu_bytes,
        "layouts": [{**asdict(layout), "fits": layout.fits} for layout in search.layouts],
        "skipped": list(search.skipped),
    }

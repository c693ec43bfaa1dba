"""Plots of ``plangen cost``: the memory of one step per rank (``--peak --plot``) and the layouts
that fit (``--fit --plot``), as PNG, SVG, or one self-contained HTML page.

Each plot draws the JSON document the command prints with ``--format json``
(:func:`plangen.cost.render.build_peak_json`, :func:`~plangen.cost.render.build_fit_json`) and
nothing else, so a figure on it is the JSON's by construction; and the file carries the documents
it draws, a JSON list (PNG: the text chunk ``plangen``; SVG: its description metadata; HTML: a
``<script type="application/json" id="plangen-data">`` block), so that a reader can take the
figures back out.

The timeline of ``--peak`` is what the tracker keeps (:attr:`plangen.cost.peak.PeakReport.timeline`):
the highest moment of each stretch of the step (each phase before its decoder layers, in each layer,
after them), one bar each in step order, not every allocation.

matplotlib is the optional extra ``plangen[plot]``, imported here only and only when drawing,
through its object-oriented API (no pyplot: no global backend, no window). Nothing here imports
torch. Errors are one-line :class:`~plangen.cost.settings.CostError`.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
from pathlib import Path
from typing import Any, Sequence

from plangen.cost.peak import Breakdown, where_in_step
from plangen.cost.settings import CostError
from plangen.cost.units import format_bytes, format_margin

SUFFIXES = (".png", ".svg", ".html")
INSTALL_EXTRA = "pip install 'plangen[plot]'"
DATA_KEY = "plangen"  # the PNG text chunk, and the HTML block's id prefix
# Breakdown's kinds, in its order (bottom of the stack first).
KINDS = tuple(field.name for field in dataclasses.fields(Breakdown))
COLOURS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "gathered": "#8172b3",
    "temporary": "#937860",
}
FITS, SHORT, GPU_LINE = "#55a868", "#c44e52", "#222222"
# Under the stretches outside the decoder layers, by phase and place (plangen.cost.peak.PhasePeak.place):
# the embedding, the output head and loss (forward after the layers, backward before them), AdamW.
OUTSIDE_LAYERS = {
    ("forward", "before"): "embed",
    ("forward", "after"): "head",
    ("backward", "before"): "head",
    ("backward", "after"): "embed",
    ("optimizer", "before"): "AdamW",
}
# Fixed ids in SVG output and no date: the same figures give the same file (docs/images is in git).
SVG_SETTINGS = {"svg.hashsalt": "plangen", "svg.fonttype": "none"}


def check_plot_path(path: str | Path) -> Path:
    """``path`` as ``--plot`` takes it, refused before anything is traced: a .png, .svg or .html file
    in an existing folder, and the plot extra installed."""
    path = Path(path)
    _format(path)
    if path.is_dir():
        raise CostError(f"--plot {path} is a folder; pass a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise CostError(f"--plot {path}: no folder {folder}")
    _matplotlib()
    return path


def write_peak_plot(path: str | Path, documents: Sequence[dict[str, Any]]) -> None:
    """Draw each plan of each ``--peak`` JSON document (render.build_peak_json) as the timeline of
    its step, one panel each, to ``path`` (.png, .svg or .html), atomically."""
    panels = [(doc, plan) for doc in documents for plan in doc["plans"]]
    if not panels or not all(plan["timeline"] for _, plan in panels):
        raise CostError("--plot: nothing to draw (a plan without a traced step)")

    def draw(figure_class: Any) -> Any:
        first = documents[0]
        s = first["settings"]
        figure = figure_class(figsize=(12, 1.2 + 3.6 * len(panels)), layout="constrained")
        axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
        top = max(max(plan["peak"]["bytes"], doc["gpu_memory_bytes"] or 0) for doc, plan in panels)
        unit = _unit(top)
        for ax, (doc, plan) in zip(axes, panels):
            _draw_step(ax, doc, plan, unit, top)
        figure.suptitle(
            f"{first['model']} ({first['model_class']}, {first['layers']} layers): "
            "memory per rank over one training step\n"
            f"{s['micro_batch']} x {s['seq_len']} tokens per DP rank, {s['dtype']} compute, "
            f"{s['master_dtype']} weights, gradients and AdamW; rank 0, traced with fake tensors",
            fontsize=11,
        )
        legend: dict[str, Any] = {}  # each label once, from whichever panel has it
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
        figure.legend(
            legend.values(),
            legend.keys(),
            loc="outside lower center",
            ncols=min(len(legend), 5),
            fontsize=9,
            frameon=False,
        )
        return figure

    _write(path, draw, documents, f"{documents[0]['model']}: memory per rank over one training step")


def write_fit_plot(path: str | Path, document: dict[str, Any]) -> None:
    """Draw the layouts of a ``--fit`` JSON document (render.build_fit_json), each a bar of its peak
    per rank against the GPU line and, beside it, its TP bytes sent per rank and step, in the
    table's order, to ``path`` (.png, .svg or .html), atomically."""
    layouts = document["layouts"]
    if not layouts:
        raise CostError("--plot: nothing to draw (no layout traced)")

    def draw(figure_class: Any) -> Any:
        gpu = document["gpu_memory_bytes"]
        figure = figure_class(figsize=(12, 1.6 + 0.36 * len(layouts)), layout="constrained")
        memory, traffic = figure.subplots(1, 2, sharey=True, width_ratios=(3, 2))
        rows = range(len(layouts))
        peaks = [layout["peak_bytes"] for layout in layouts]
        unit = _unit(max(*peaks, gpu))
        memory.barh(rows, [p / unit[1] for p in peaks], color=[FITS if layout["fits"] else SHORT for layout in layouts])
        memory.axvline(gpu / unit[1], color=GPU_LINE, linestyle="--", linewidth=1)
        memory.text(gpu / unit[1], -0.8, f" GPU {format_bytes(gpu)}", fontsize=8, va="bottom", ha="left")
        for row, layout in zip(rows, layouts):
            memory.text(
                layout["peak_bytes"] / unit[1],
                row,
                f" {format_bytes(layout['peak_bytes'])} ({format_margin(layout['margin_bytes'])})",
                va="center",
                fontsize=8,
            )
        memory.set_yticks(list(rows), [_layout_label(layout) for layout in layouts], fontsize=8)
        memory.set_ylim(len(layouts) - 0.4, -1.2)  # the table's first row on top
        memory.set_xlim(0, max(*peaks, gpu) / unit[1] * 1.45)
        memory.set_xlabel(f"peak memory per rank ({unit[0]})")
        memory.set_title("peak per rank (green: fits)", fontsize=10)
        sent = [layout["tp_sent_bytes"] for layout in layouts]
        sent_unit = _unit(max(sent))
        traffic.barh(rows, [b / sent_unit[1] for b in sent], color="#8c8c8c")
        for row, value in zip(rows, sent):
            traffic.text(value / sent_unit[1], row, f" {format_bytes(value)}", va="center", fontsize=8)
        traffic.set_xlim(0, max(max(sent) / sent_unit[1], 1e-9) * 1.3)
        traffic.set_xlabel(f"TP bytes sent per rank per step ({sent_unit[0]})")
        traffic.set_title("TP communication (the table's order)", fontsize=10)
        figure.suptitle(
            f"{document['model']}: layouts of {document['world_size']} ranks on {format_bytes(gpu)} GPUs, "
            "fitting first, by TP communication",
            fontsize=11,
        )
        if document["skipped"]:
            figure.text(0.01, 0.0, "skipped " + "; ".join(document["skipped"]), fontsize=7, va="bottom")
        return figure

    _write(path, draw, [document], f"{document['model']}: layouts of {document['world_size']} ranks")


# ---------------------------------------------------------------------------------------------


def _draw_step(ax: Any, doc: dict[str, Any], plan: dict[str, Any], unit: tuple[str, int], top: int) -> None:
    """One plan's step: a stacked bar per stretch, phases apart, the peak, the GPU line and margin."""
    s, timeline, size = doc["settings"], plan["timeline"], unit[1]
    edges = _edges(timeline)
    centres = [(a + b) / 2 for a, b in zip(edges, edges[1:])]
    lower = [0.0] * len(timeline)
    for kind in KINDS:
        upper = [low + point[kind] / size for low, point in zip(lower, timeline)]
        outline = _steps(edges, upper) + _steps(edges, lower)[::-1]
        ax.fill(*zip(*outline), color=COLOURS[kind], linewidth=0, label=kind)
        lower = upper
    ax.set_xticks(*_ticks(timeline, centres), fontsize=7)
    ax.set_xlim(0, edges[-1])
    ax.set_ylim(0, top / size * 1.3)
    ax.set_ylabel(f"per rank ({unit[0]})")
    for start, end, phase in _phase_spans(timeline):
        if start:
            ax.axvline(edges[start], color="white", linewidth=1.5)
        ax.text(
            (edges[start] + edges[end]) / 2,
            0.98,
            phase,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=9,
        )
    if plan["extrapolated_from"]:
        # Behind the bars: what shows above them says which stretches the fit reached along the layers.
        label = f"extrapolated layers (the step traced at {', '.join(map(str, plan['extrapolated_from']))} layers)"
        for start, end in _interior_layers(timeline):
            ax.axvspan(edges[start], edges[end], facecolor="#e8e8e8", linewidth=0, zorder=0, label=label)
            label = None  # one legend entry
    peak = plan["peak"]
    key = ("phase", "place", "module", "bytes")
    at = next(i for i, p in enumerate(timeline) if all(p[k] == peak[k] for k in key))  # one of the stretches
    x, y = centres[at], peak["bytes"] / size
    gpu = doc["gpu_memory_bytes"]
    where = where_in_step(peak["phase"], peak["module"], peak["place"])
    above = max(y, (gpu or 0) / size)
    align = "left" if x < edges[-1] * 0.25 else "right" if x > edges[-1] * 0.75 else "center"
    ax.annotate(
        f"peak {format_bytes(peak['bytes'])}: {peak['phase']}, {where}",
        xy=(x, y),
        xytext=(x, above + top / size * 0.1),
        ha=align,
        va="bottom",
        fontsize=9,
        arrowprops={"arrowstyle": "-", "color": GPU_LINE, "linewidth": 0.8},
    )
    ax.plot([x], [y], marker="v", color=GPU_LINE, markersize=5)
    if gpu is not None:
        ax.axhline(gpu / size, color=GPU_LINE, linestyle="--", linewidth=1)
        ax.text(edges[-1], gpu / size, f"GPU {format_bytes(gpu)} ", ha="right", va="bottom", fontsize=8)
        margin = plan["margin_bytes"]
        colour = FITS if margin >= 0 else SHORT
        beside = edges[-1] * 0.006
        ax.annotate(
            "",
            xy=(x + beside, gpu / size),
            xytext=(x + beside, y),
            arrowprops={"arrowstyle": "<->", "color": GPU_LINE, "linewidth": 1.2, "shrinkA": 0, "shrinkB": 0},
        )
        ax.text(
            x + 2 * beside,
            (y + gpu / size) / 2 if margin < 0 else above,
            format_margin(margin),
            va="center" if margin < 0 else "bottom",
            fontsize=8,
            color=colour,
            fontweight="bold",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5},  # over the bars' colours
        )
    depth = (
        f"traced at {', '.join(map(str, plan['extrapolated_from']))} layers, extrapolated to {doc['layers']}"
        if plan["extrapolated_from"]
        else "every layer traced"
    )
    ax.set_title(
        f"{plan['name']}: TP {s['tp_size']} x DP {s['dp_size']}, sequence parallel "
        f"{'on' if s['sequence_parallel'] else 'off'}, activation checkpointing "
        f"{'on' if s['activation_checkpointing'] else 'off'} ({depth})",
        fontsize=10,
        loc="left",
    )


def _steps(edges: list[float], values: list[float]) -> list[tuple[float, float]]:
    """The corners of a step line at ``values`` between ``edges``, left to right: a corner only where
    the value changes (the SVG holds no point twice, the plot stays small)."""
    corners = [(edges[0], values[0])]
    for edge, before, after in zip(edges[1:], values, values[1:]):
        if after != before:
            corners += [(edge, before), (edge, after)]
    return [*corners, (edges[-1], values[-1])]


def _edges(timeline: list[dict[str, Any]]) -> list[float]:
    """Where each stretch's bar starts (and the last ends): a layer one wide, a stretch outside the
    layers (embedding, head, optimizer step) a sixth of the layers wide, so that it stays in sight
    beside 80 of them."""
    layers = sum(1 for p in timeline if p["place"] == "layer" and p["phase"] == "forward")
    outside = max(1.0, layers / 6)
    edges = [0.0]
    for point in timeline:
        edges.append(edges[-1] + (1.0 if point["place"] == "layer" else outside))
    return edges


def _ticks(timeline: list[dict[str, Any]], centres: list[float]) -> tuple[list[float], list[str]]:
    """A tick under each stretch outside the layers, and under the first, last and a few evenly
    spaced layers of each phase's pass (every layer where there are few)."""
    layers = [p["layer"] for p in timeline if p["place"] == "layer"]
    count = max(layers) + 1 if layers else 0
    every = max(1, -(-count // 6))
    shown = {0, count - 1, *range(0, count - every // 2, every)}  # none crowding the last
    ticks, labels = [], []
    for centre, point in zip(centres, timeline):
        if point["place"] != "layer":
            ticks.append(centre)
            labels.append(OUTSIDE_LAYERS.get((point["phase"], point["place"]), point["place"]))
        elif point["layer"] in shown:
            ticks.append(centre)
            labels.append(f"L{point['layer']}")
    return ticks, labels


def _phase_spans(timeline: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(first index, one past the last, phase) of each phase's run of stretches."""
    spans: list[tuple[int, int, str]] = []
    for i, point in enumerate(timeline):
        if spans and spans[-1][2] == point["phase"]:
            spans[-1] = (spans[-1][0], i + 1, point["phase"])
        else:
            spans.append((i, i + 1, point["phase"]))
    return spans


def _interior_layers(timeline: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(first index, one past the last) of each phase's run of layers but its first and last (the
    fit takes those apart): of an extrapolated step, the layers fitted along the layer index as well
    as the depth."""
    runs: list[tuple[int, int]] = []
    for start, end, _ in _phase_spans(timeline):
        inside = [i for i in range(start, end) if timeline[i]["place"] == "layer"]
        if len(inside) > 2:
            runs.append((inside[0] + 1, inside[-1]))
    return runs


def _layout_label(layout: dict[str, Any]) -> str:
    return (
        f"TP {layout['tp_size']} x DP {layout['dp_size']}, SP {'on' if layout['sequence_parallel'] else 'off'}, "
        f"ckpt {'on' if layout['activation_checkpointing'] else 'off'}"
    )


def _unit(largest: float) -> tuple[str, int]:
    """The binary unit the axis counts in: the largest whose one the figures reach."""
    return next(
        (
            (name, size)
            for name, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
            if largest >= size
        ),
        ("B", 1),
    )


def _format(path: Path) -> str:
    """The file's suffix, one of SUFFIXES (any case)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise CostError(f"--plot {path}: expected a file name ending in {', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]}")
    return suffix


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CostError(f"--plot needs matplotlib, the plot extra: {INSTALL_EXTRA}") from None
    return matplotlib


def _write(path: str | Path, draw: Any, documents: Sequence[dict[str, Any]], title: str) -> None:
    """Draw with ``draw(Figure)`` and write ``path`` in its suffix's format, carrying ``documents``."""
    from plangen.output.files import replace_file

    matplotlib = _matplotlib()
    from matplotlib.figure import Figure

    path = Path(path)
    suffix = _format(path)
    data = json.dumps(list(documents), separators=(",", ":"))
    with matplotlib.rc_context(SVG_SETTINGS):
        figure = draw(Figure)
        out = io.BytesIO()
        if suffix == ".png":
            figure.savefig(out, format="png", dpi=120, metadata={DATA_KEY: data, "Title": title})
        else:
            metadata = {"Title": title, "Date": None}
            if suffix == ".svg":
                metadata["Description"] = data
            figure.savefig(out, format="svg", metadata=metadata)
    content = out.getvalue()
    if suffix == ".html":
        svg = content.decode("utf-8")
        svg = svg[svg.index("<svg") :]  # inline: without the XML declaration and doctype
        # "</" closes a script element; JSON reads "<\/" back as "</".
        block = data.replace("</", "<\\/")
        content = (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n"
            "<style>body { font-family: sans-serif; margin: 1.5em; } svg { max-width: 100%; height: auto; }</style>\n"
            "</head>\n<body>\n"
            f"{svg}\n"
            f'<script type="application/json" id="{DATA_KEY}-data">{block}</script>\n'
            "</body>\n</html>\n"
        ).encode("utf-8")
    try:
        replace_file(path, content)
    except OSError as error:
        raise CostError(f"cannot write {path}: {error.strerror or error}") from None

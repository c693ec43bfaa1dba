"""``plangen cost --peak --plot`` and ``--fit --plot`` (plangen.cost.plot): the files are valid PNG,
SVG and HTML, carry the figures of the JSON output (read back here from each format with tools of
their own, not plangen's), show the peak, the GPU line and the margin, and mark an extrapolated
step; without the plot extra, ``--plot`` is a one-line error (exit 2) before anything is traced.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.commands.cli import app
from plangen.cost.peak import where_in_step
from plangen.cost.units import format_bytes, format_margin
from plangen.cost.validate import BATCH, LLAMA, SEQ

ROOT = Path(__file__).resolve().parents[1]
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="the plot extra is not installed: pip install 'plangen[plot]'",
)
STEP = ["--seq-len", str(SEQ), "--micro-batch", str(BATCH)]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """The small Llama of plangen.cost.validate at 2 layers (every layer traced) and at 6 (traced at
    3, 4 and 5 layers and extrapolated)."""
    folder = tmp_path_factory.mktemp("configs")
    paths = {}
    for layers in (2, 6):
        paths[layers] = folder / f"llama-{layers}.json"
        paths[layers].write_text(json.dumps(LLAMA | {"num_hidden_layers": layers}))
    return paths


def _plot_run(args: list[str], out) -> tuple[dict, object]:
    """``plangen cost ARGS --format json --plot OUT``: (the JSON printed, OUT), skipped without the extra."""
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the plot extra is not installed: pip install 'plangen[plot]'")
    result = CliRunner().invoke(app, ["cost", *args, "--format", "json", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == f"plangen: wrote {out}"
    return json.loads(result.stdout), out


@pytest.fixture(scope="module")
def peak_run(configs, tmp_path_factory):
    """``--peak --format json --plot step.html`` on the 6-layer Llama, 10 MiB GPU (it does not fit):
    (the JSON printed, the HTML written)."""
    out = tmp_path_factory.mktemp("peak") / "step.html"
    return _plot_run(
        [str(configs[6]), "--peak", "--tp-size", "2", "--dp-size", "2", *STEP, "--gpu-memory", "10MiB"], out
    )


@pytest.fixture(scope="module")
def fit_run(configs, tmp_path_factory):
    """``--fit --world-size 2 --format json --plot layouts.svg`` on the 2-layer Llama, 9 MiB GPU (some
    layouts fit, some do not): (the JSON printed, the SVG written)."""
    out = tmp_path_factory.mktemp("fit") / "layouts.svg"
    return _plot_run([str(configs[2]), "--fit", "--world-size", "2", *STEP, "--gpu-memory", "9MiB"], out)


# --- reading the files back, without plangen -------------------------------------------------


class _Page(HTMLParser):
    """Every start tag with its attributes, and the text of each JSON script block."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: list[str] = []
        self._in_block = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_block = tag == "script" and dict(attrs).get("type") == "application/json"

    def handle_data(self, data):
        if self._in_block:
            self.blocks.append(data)

    def handle_endtag(self, tag):
        self._in_block = False


def _svg_texts(root: ET.Element) -> list[str]:
    return [t.text for t in root.iter(f"{SVG}text") if t.text]


def _svg_data(root: ET.Element) -> list:
    description = root.find(".//{http://purl.org/dc/elements/1.1/}description")
    return json.loads(description.text)


def _html_parts(path: Path) -> tuple[_Page, ET.Element, list]:
    text = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    svg = text[text.index("<svg") : text.index("</svg>") + len("</svg>")]
    assert len(page.blocks) == 1
    return page, ET.fromstring(svg), json.loads(page.blocks[0])


# --- --peak --plot ---------------------------------------------------------------------------


@needs_matplotlib
def test_peak_html_is_one_page_that_carries_the_json_output(peak_run):
    """The HTML embeds, as data, exactly the document --format json printed in the same run; its
    figure is an inline SVG, and nothing on the page loads anything (no network to open it)."""
    doc, path = peak_run
    page, svg, data = _html_parts(path)
    assert data == [doc]
    assert svg.tag == f"{SVG}svg"
    for tag, attrs in page.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        assert "src" not in attrs, (tag, attrs)
        assert not (attrs.get("href") or "").startswith(("http:", "https:", "//")), (tag, attrs)
    assert [attrs.get("type") for tag, attrs in page.tags if tag == "script"] == ["application/json"]
    plan = doc["plans"][0]
    texts = _svg_texts(svg)
    assert any(t.startswith(f"peak {format_bytes(plan['peak']['bytes'])}: backward") for t in texts), texts
    assert plan["fits"] is False and f"short by {format_bytes(-plan['margin_bytes'])}" in texts
    assert "GPU 10 MiB " in texts


@needs_matplotlib
def test_peak_png_and_svg_carry_the_same_figures(peak_run, tmp_path):
    from PIL import Image

    from plangen.cost.plot import write_peak_plot

    doc, _ = peak_run
    write_peak_plot(tmp_path / "step.png", [doc])
    write_peak_plot(tmp_path / "step.svg", [doc])
    with Image.open(tmp_path / "step.png") as image:
        image.verify()  # the chunks' checksums
    with Image.open(tmp_path / "step.png") as image:
        assert image.format == "PNG" and image.size[0] > 800
        assert json.loads(image.text["plangen"]) == [doc]
    root = ET.parse(tmp_path / "step.svg").getroot()
    assert root.tag == f"{SVG}svg" and _svg_data(root) == [doc]
    peak = doc["plans"][0]["peak"]  # named in the text report's words
    where = where_in_step(peak["phase"], peak["module"], peak["place"])
    assert f"peak {format_bytes(peak['bytes'])}: {peak['phase']}, {where}" in _svg_texts(root)


@needs_matplotlib
def test_an_extrapolated_step_is_drawn_at_full_depth_and_marked(peak_run):
    """Traced at 3, 4 and 5 layers, the 6-layer step is drawn with all 6 layers in forward and in
    backward (the timeline: each stretch's peak, in step order), and says it was extrapolated."""
    doc, path = peak_run
    plan = doc["plans"][0]
    assert plan["extrapolated_from"] == [3, 4, 5] and doc["layers"] == 6
    timeline = plan["timeline"]
    assert [p["layer"] for p in timeline if p["place"] == "layer"] == [*range(6), *reversed(range(6))]
    assert [p["phase"] for p in timeline] == sorted(
        (p["phase"] for p in timeline), key=["forward", "backward", "optimizer"].index
    )
    assert max(p["bytes"] for p in timeline) == plan["peak"]["bytes"]
    for phase, peak in plan["phases"].items():  # each phase's peak is its stretches' highest
        assert max(p["bytes"] for p in timeline if p["phase"] == phase) == peak
    for point in timeline:  # the kinds add up, as in the peak
        assert (
            sum(
                point[kind] for kind in ("parameters", "gradients", "optimizer", "activations", "gathered", "temporary")
            )
            == point["bytes"]
        )
    texts = _svg_texts(_html_parts(path)[1])
    assert any(t.endswith("(traced at 3, 4, 5 layers, extrapolated to 6)") for t in texts), texts
    assert "extrapolated layers (the step traced at 3, 4, 5 layers)" in texts
    assert {"L0", "L5", "embed", "AdamW"} <= set(texts)


@needs_matplotlib
def test_without_gpu_memory_there_is_no_gpu_line_and_no_verdict(peak_run, tmp_path):
    from plangen.cost.plot import write_peak_plot

    doc, _ = peak_run
    plans = [doc["plans"][0] | {"fits": None, "margin_bytes": None}]
    write_peak_plot(tmp_path / "step.svg", [doc | {"gpu_memory_bytes": None, "plans": plans}])
    texts = _svg_texts(ET.parse(tmp_path / "step.svg").getroot())
    assert any(t.startswith("peak ") for t in texts)
    assert not [t for t in texts if "GPU" in t or t.startswith(("margin", "short by"))]


@needs_matplotlib
def test_each_plan_compared_is_a_panel_of_its_own(peak_run, tmp_path):
    from plangen.cost.plot import write_peak_plot

    doc, _ = peak_run
    other = copy.deepcopy(doc["plans"][0]) | {"name": "hf"}
    two = doc | {"plans": [doc["plans"][0], other]}
    write_peak_plot(tmp_path / "two.svg", [two])
    titles = [t for t in _svg_texts(ET.parse(tmp_path / "two.svg").getroot()) if ": TP 2 x DP 2" in t]
    assert [t.split(":")[0] for t in titles] == ["hand-written", "hf"]


@needs_matplotlib
def test_plotting_imports_no_torch(peak_run, tmp_path):
    """The plot draws from the JSON document alone: in a fresh process, drawing it imports no torch."""
    doc, _ = peak_run
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    code = (
        "import json, sys\n"
        "from plangen.cost.plot import write_peak_plot\n"
        f"write_peak_plot({str(tmp_path / 'step.png')!r}, [json.load(open({str(tmp_path / 'doc.json')!r}))])\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False" and (tmp_path / "step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_matplotlib
def test_a_plot_replaces_the_file_whole_or_not_at_all(peak_run, tmp_path, monkeypatch):
    """A drawing that fails leaves the old file as it was and no temporary file; one that succeeds
    replaces it, keeping its permissions."""
    from plangen.cost import plot

    doc, _ = peak_run
    path = tmp_path / "step.svg"
    path.write_text("old")
    path.chmod(0o640)

    def broken(*args, **kwargs):
        raise RuntimeError("drawing failed")

    with monkeypatch.context() as patch:
        patch.setattr(plot, "_draw_step", broken)
        with pytest.raises(RuntimeError):
            plot.write_peak_plot(path, [doc])
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["step.svg"]
    plot.write_peak_plot(path, [doc])
    assert _svg_data(ET.parse(path).getroot()) == [doc]
    assert (path.stat().st_mode & 0o777) == 0o640 and [p.name for p in tmp_path.iterdir()] == ["step.svg"]


# --- --fit --plot ----------------------------------------------------------------------------


@needs_matplotlib
def test_fit_plot_draws_each_layout_in_the_tables_order_with_the_json_figures(fit_run):
    """A bar per layout, top to bottom as the table lists them (fitting first, by TP bytes sent), its
    peak and margin against the GPU line, and its TP communication beside it: the JSON's figures."""
    doc, path = fit_run
    layouts = doc["layouts"]
    assert len(layouts) == 6 and {layout["fits"] for layout in layouts} == {True, False}
    assert all(layout["peak_bytes"] + layout["margin_bytes"] == doc["gpu_memory_bytes"] for layout in layouts)
    fitting = [layout for layout in layouts if layout["fits"]]
    assert layouts[: len(fitting)] == fitting
    assert [layout["tp_sent_bytes"] for layout in fitting] == sorted(layout["tp_sent_bytes"] for layout in fitting)
    root = ET.parse(path).getroot()
    assert _svg_data(root) == [doc]
    texts = _svg_texts(root)
    labels = [t for t in texts if t.startswith("TP ") and " x DP " in t]
    assert labels == [
        f"TP {layout['tp_size']} x DP {layout['dp_size']}, SP {'on' if layout['sequence_parallel'] else 'off'}, "
        f"ckpt {'on' if layout['activation_checkpointing'] else 'off'}"
        for layout in layouts
    ]
    peaks = [t for t in texts if t.startswith(" ") and "(" in t]
    assert peaks == [
        f" {format_bytes(layout['peak_bytes'])} ({format_margin(layout['margin_bytes'])})" for layout in layouts
    ]
    assert any(p.endswith("(short by " + format_bytes(-layouts[-1]["margin_bytes"]) + ")") for p in peaks)
    sent = [t.strip() for t in texts if t.startswith(" ") and "(" not in t and "GPU" not in t]
    assert sent == [format_bytes(layout["tp_sent_bytes"]) for layout in layouts]  # beside each bar
    assert " GPU 9 MiB" in texts


@needs_matplotlib
def test_fit_plot_as_png_and_html(fit_run, tmp_path):
    from PIL import Image

    from plangen.cost.plot import write_fit_plot

    doc, _ = fit_run
    write_fit_plot(tmp_path / "layouts.png", doc)
    write_fit_plot(tmp_path / "layouts.html", doc)
    with Image.open(tmp_path / "layouts.png") as image:
        assert image.format == "PNG" and json.loads(image.text["plangen"]) == [doc]
    assert _html_parts(tmp_path / "layouts.html")[2] == [doc]


# --- without the extra, and bad input --------------------------------------------------------


@pytest.mark.parametrize("mode", [["--peak"], ["--fit", "--world-size", "2", "--gpu-memory", "80GiB"]])
def test_without_the_extra_plot_says_which_to_install_before_tracing(configs, tmp_path, monkeypatch, mode):
    """matplotlib absent (simulated: an import of it fails, installed or not): one line naming the
    extra, exit 2, nothing traced, nothing written."""
    from plangen.cost import peak

    def traced(*args, **kwargs):
        raise AssertionError("traced before refusing --plot")

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(peak, "measure_peak", traced)
    out = tmp_path / "step.png"
    result = CliRunner().invoke(app, ["cost", str(configs[2]), *mode, *STEP, "--plot", str(out)])
    assert result.exit_code == 2, result.output
    assert (
        result.output.strip() == "plangen: error: --plot needs matplotlib, the plot extra: pip install 'plangen[plot]'"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--peak", "--plot", "step.pdf"], "--plot step.pdf: expected a file name ending in .png, .svg or .html"),
        (["--peak", "--plot", "no-such-folder/step.svg"], "--plot no-such-folder/step.svg: no folder no-such-folder"),
        (["--plot", "step.svg"], "--plot needs --peak or --fit"),
    ],
)
def test_bad_plot_arguments_are_one_line_errors(configs, monkeypatch, tmp_path, args, message):
    from plangen.cost import peak

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(peak, "measure_peak", lambda *a, **k: pytest.fail("traced before refusing --plot"))
    result = CliRunner().invoke(app, ["cost", str(configs[2]), *args])
    assert result.exit_code == 2 and result.output.strip() == f"plangen: error: {message}"
    assert list(tmp_path.iterdir()) == []

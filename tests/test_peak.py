"""``plangen cost --peak``: peak memory per rank of one traced training step (plangen.cost.peak).

The traced figures are checked against the same step on real tensors at DP 2 x TP 2 (gloo), and for
the properties a user relies on: the kinds add up to the tracker's total, sequence parallel and
activation checkpointing lower activations, the verdict flips exactly at the peak.
"""

from __future__ import annotations

import json

import pytest

from conftest import quiet_machine
from plangen.cost.peak import Breakdown, PeakReport, PhasePeak, parse_memory
from plangen.cost.settings import CostError, CostSettings

from plangen.cost.validate import BATCH, CASES, SEQ
from plangen.stack.transformers_compat import experts_take_sentinels

# Its gloo launch measures each rank's memory byte for byte against the trace: on a busy machine a
# rank's next all-gather can land early (two activations above the trace), so it runs after the
# background launches ended (tests/conftest.py).
QUIET = True


def _report(total: int) -> PeakReport:
    breakdown = Breakdown(parameters=total - 100, activations=100)
    return PeakReport(
        "m",
        "LlamaForCausalLM",
        "hand-written",
        CostSettings(),
        False,
        2,
        (PhasePeak("backward", "", breakdown, total),),
        0.0,
    )


def test_parse_memory_units_and_one_line_errors():
    assert parse_memory("80GiB") == 80 * 2**30
    assert parse_memory("80 GB") == 80 * 10**9
    assert parse_memory("141e9") == 141 * 10**9
    assert parse_memory("1.5mib") == 3 * 2**19
    for bad in ("lots", "80 GiBs", "-1GB", "0"):
        with pytest.raises(CostError, match="--gpu-memory"):
            parse_memory(bad)


def test_verdict_flips_exactly_at_the_peak():
    from plangen.cost.render import build_peak_json, render_peak_text

    report = _report(2**30)
    assert report.margin(2**30) == 0 and report.margin(2**30 - 1) == -1
    assert "fits in 1 GiB: margin 0 B" in render_peak_text([report], 2**30)
    assert "does not fit in" in render_peak_text([report], 2**30 - 1)
    assert "short by 1 B" in render_peak_text([report], 2**30 - 1)
    doc = build_peak_json([report], 2**30 - 1)
    assert doc["plans"][0]["fits"] is False and doc["plans"][0]["margin_bytes"] == -1


@pytest.fixture(scope="module")
def config_files(tmp_path_factory):
    from plangen.cost.validate import write_configs

    return write_configs(tmp_path_factory.mktemp("peak"))


@pytest.fixture(scope="module")
def predicted(tmp_path_factory, fake_pg):
    """Every case traced with fake tensors on the single-process fake group (rank 0)."""
    from plangen.cost.validate import predict_cases

    return predict_cases(CASES, tmp_path_factory.mktemp("predicted"))


def test_breakdown_adds_up_to_the_trackers_total(predicted):
    for report in predicted.values():
        assert {p.phase for p in report.phases} == {"forward", "backward", "optimizer"}
        for phase in report.phases:
            assert phase.breakdown.total == phase.tracked_total > 0


def test_each_peak_says_where_in_its_phase_it_is(predicted):
    """A moment outside every module is named by its place: forward's loss is after the layers,
    backward's end (the embedding's gradient, FSDP2's last reduce-scatters) after its layers."""
    from dataclasses import replace

    from plangen.cost.depth import AFTER_LAYERS
    from plangen.cost.peak import place_of
    from plangen.cost.render import render_peak_text

    assert (place_of(None), place_of(0), place_of(3), place_of(AFTER_LAYERS)) == ("before", "layer", "layer", "after")
    for report in predicted.values():
        for peak in report.phases:
            assert peak.place in ("before", "layer", "after")
            assert (peak.place == "layer") == (".layers." in f".{peak.module}"), peak
    report = _report(2**30)
    backward = report.phases[0]
    after = replace(report, phases=(replace(backward, place="after"),))
    assert "in backward, after the decoder layers' backward (the embedding's gradient" in render_peak_text([after])
    before = replace(report, phases=(replace(backward, place="before"),))
    assert "in backward, before the output head's backward" in render_peak_text([before])


def test_steady_state_and_no_global_shaped_transients(predicted):
    """AdamW's states are held from the start (the measured step is the second); the step's
    temporaries are foreach AdamW's one copy of the sharded parameters, not global-shaped tensors."""
    for report in predicted.values():
        for phase in report.phases:
            b = phase.breakdown
            sharded = b.optimizer // 2
            assert b.optimizer == 2 * sharded and 0 <= b.parameters - sharded < 0.01 * sharded  # + rotary buffers
        step = next(p for p in report.phases if p.phase == "optimizer").breakdown
        assert step.gradients == step.optimizer // 2
        assert 0 <= step.temporary - step.optimizer // 2 < 1024  # + AdamW's step counters and scalars


def test_sequence_parallel_and_checkpointing_lower_activations(predicted):
    """Checkpointing: forward keeps the layers' inputs only (under half of what it saved); backward's
    peak then holds one recomputed layer (of 2 here: the Qwen3-MoE's experts' slots make it over half)."""
    for model in ("llama", "qwen3", "qwen3_moe"):
        peak = lambda name: predicted[name].peak.breakdown  # noqa: E731
        forward = lambda name: next(p for p in predicted[name].phases if p.phase == "forward").breakdown  # noqa: E731
        assert peak(f"{model}-sp").activations < peak(model).activations
        assert forward(f"{model}-ac").activations < forward(model).activations / 2
        assert peak(f"{model}-ac").activations < peak(model).activations
        assert peak(f"{model}-sp").parameters == peak(model).parameters


@pytest.fixture(scope="module")
def measured(request):
    from plangen.cost.validate import measure_cases

    with quiet_machine(request.config):
        return measure_cases(CASES)


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c["name"] for c in CASES])
def test_prediction_is_what_the_same_step_holds_on_real_tensors(predicted, measured, case):
    """Each phase's peak within 10 % on every rank, and every kind but the temporaries byte for byte:
    the fake trace sees the tensors the real step makes. Without skipping DTensor's shape propagation,
    the first case traced came out 17 % high in forward (global-shaped fake tensors counted as memory).

    What a trace cannot see is timing: gloo's worker thread keeps a collective's work, and the tensors
    it was handed, a moment after the caller's wait returns, so a real rank can hold them when the trace
    has freed them. The real run records what each collective's work held in each phase, and the rules
    allow exactly that (plangen.cost.validate): temporaries at least the predicted ones (a reduce-scatter
    input, a layer's unsharded gradients); activations byte for byte, or above by exactly one or two
    works' tensors (held_by_gloo: the loss's per-token statistics, an SP all-gather's input and output);
    a rank whose peak is another moment than the trace's because gloo held a work's tensors then
    (peaked_while_held: its total above the trace's by at most them, parameters and optimizer states
    exact) or because FSDP2's next all-gather came early (gathered_early) is compared by its total."""
    from plangen.cost.validate import differing_kinds

    routed = ROUTING_SETS_MEMORY and "moe" in case
    if routed and case.endswith("-one-rank"):
        pytest.skip(ROUTING_REASON)
    for rank, per_case in enumerate(measured):
        real = per_case[case]
        assert "error" not in real, f"rank {rank}: {real.get('trace')}"
        for phase in predicted[case].phases:
            want = {"total": phase.breakdown.total, **dict(phase.breakdown.items())}
            got = real["phases"][phase.phase]
            if phase.phase != "optimizer":
                assert abs(got["total"] - want["total"]) <= 0.10 * got["total"], (rank, phase.phase)
            if routed and fewer_routes_peak_elsewhere(real, rank, got, want):
                continue  # compared by its total, above
            differing = differing_kinds(got, want)
            if routed:  # the even share the trace assumes against the model's random router's routes
                differing = {
                    k: (g, w) for k, (g, w) in differing.items() if k != "activations" or abs(g - w) > 0.05 * g
                }
            assert not differing, (rank, phase.phase, differing, got["held"])


def fewer_routes_peak_elsewhere(real: dict, rank: int, got: dict, want: dict) -> bool:
    """Where the experts' memory follows the routing: a rank whose experts took fewer routes than the
    even share the trace assumes holds fewer activations while a checkpointed MoE layer is
    recomputed, so its step peaks at another moment (measured on transformers 5.5.4, Qwen3-MoE with
    checkpointing, backward: TP rank 0 held 735,240 B of activations and 1,051,236 B of temporaries
    at its peak, the trace 1,625,128 and 196,964; TP rank 1, above its share, matched the trace's
    moment; totals within 0.7 %). Such a rank's phase is compared by its total only."""
    share = real.get("route_share")
    if not share:
        return False
    tp_rank = rank % len(share)
    return share[tp_rank] < 1 / len(share) and got["activations"] < want["activations"]


# Where the installed transformers' experts mishandle another rank's sentinel routes, ExpertsParallel
# runs its experts on this rank's routes alone (plangen.stack.transformers_compat): memory then follows the
# routing, and the trace assumes each rank's experts take their even share.
ROUTING_SETS_MEMORY = not experts_take_sentinels()
ROUTING_REASON = (
    "on this transformers the experts compute this rank's routes only (plangen.stack.transformers_compat): "
    "their memory follows the routing, which the trace takes as even"
)


@pytest.mark.distributed
@pytest.mark.skipif(ROUTING_SETS_MEMORY, reason=ROUTING_REASON)
def test_moe_memory_does_not_depend_on_the_routing(predicted, measured):
    """The trace has no routing (fake tensors have no values) and needs none: the experts kernel
    (grouped_mm) sizes every tensor by the top-k slots, not by the tokens an expert gets. The model's own
    router spreads the routes over both TP ranks' experts; a router of zero weights (every logit equal)
    sends them all to one rank's; every rank holds the same bytes either way, the one prediction's."""
    from plangen.cost.validate import differing_kinds

    assert predicted["qwen3_moe-one-rank"] is predicted["qwen3_moe"]
    exact = lambda phases: {
        p: {k: v for k, v in d.items() if k not in ("total", "temporary", "held")}  # noqa: E731
        for p, d in phases.items()
    }
    for rank, per_case in enumerate(measured):
        spread, one_rank = per_case["qwen3_moe"], per_case["qwen3_moe-one-rank"]
        assert spread["experts_implementation"] == one_rank["experts_implementation"] == "grouped_mm"
        assert min(spread["route_share"]) > 0.3, (rank, spread["route_share"])
        assert sorted(one_rank["route_share"]) == [0.0, 1.0], (rank, one_rank["route_share"])
        for phase in predicted["qwen3_moe"].phases:  # where timing moved a rank's peak: each as predicted
            want = {"total": phase.breakdown.total, **dict(phase.breakdown.items())}
            if exact(spread["phases"])[phase.phase] != exact(one_rank["phases"])[phase.phase]:
                assert not differing_kinds(spread["phases"][phase.phase], want), (rank, phase.phase)
                assert not differing_kinds(one_rank["phases"][phase.phase], want), (rank, phase.phase)


def test_cli_peak_verdict_and_one_line_errors(config_files, predicted):
    from typer.testing import CliRunner

    from plangen.commands.cli import app

    runner = CliRunner()
    args = [
        "cost",
        str(config_files["llama"]),
        "--peak",
        "--tp-size",
        "2",
        "--dp-size",
        "2",
        "--seq-len",
        str(SEQ),
        "--micro-batch",
        str(BATCH),
    ]
    peak = predicted["llama"].peak.breakdown.total
    fits = runner.invoke(app, [*args, "--gpu-memory", str(peak), "--format", "json"])
    assert fits.exit_code == 0, fits.output
    plan = json.loads(fits.stdout)["plans"][0]
    assert plan["peak"]["bytes"] == peak and plan["fits"] is True and plan["margin_bytes"] == 0
    short = runner.invoke(app, [*args, "--gpu-memory", str(peak - 1)])
    assert short.exit_code == 0 and "does not fit in" in short.stdout and "short by 1 B" in short.stdout
    for bad, message in (
        (["--gpu-memory", "lots"], "--gpu-memory 'lots': expected a size"),
        (["--tp-size", "3"], "--tp-size 3"),
    ):
        result = runner.invoke(app, [*args, *bad])
        assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    no_peak = runner.invoke(app, ["cost", str(config_files["llama"]), "--gpu-memory", "80GiB"])
    assert no_peak.exit_code == 2 and "need --peak" in no_peak.output


def test_fit_search_lists_the_layouts_that_fit_by_tp_traffic(config_files, fake_pg):
    from plangen.cost.fit import candidate_layouts, search_layouts
    from plangen.cost.peak import measure_peak

    assert candidate_layouts(4, 6) == [
        (1, 4, False, False),
        (1, 4, False, True),
        (2, 2, False, False),
        (2, 2, False, True),
        (2, 2, True, False),
        (2, 2, True, True),
        (4, 1, False, False),
        (4, 1, False, True),
    ]  # 6 tokens: no SP at TP 4
    llama = str(config_files["llama"])
    # Exactly the peak of TP 2 with SP, without checkpointing: the boundary.
    gpu = measure_peak(llama, tp_size=2, seq_len=SEQ, micro_batch=BATCH, sequence_parallel=True).peak.breakdown.total
    search = search_layouts(llama, 2, gpu, seq_len=SEQ, micro_batch=BATCH)
    assert len(search.layouts) == len(candidate_layouts(2, SEQ)) == 6 and not search.skipped
    by_layout = {(l.tp_size, l.sequence_parallel, l.activation_checkpointing): l for l in search.layouts}
    assert by_layout[(2, True, False)].peak_bytes == gpu and by_layout[(2, True, False)].margin_bytes == 0
    assert by_layout[(2, True, False)].fits and by_layout[(2, True, True)].fits
    assert not by_layout[(2, False, False)].fits  # SP off holds more
    assert not by_layout[(1, False, False)].fits  # no TP: whole activations and logits
    assert by_layout[(1, False, False)].tp_sent_bytes == 0 < by_layout[(2, False, False)].tp_sent_bytes
    fitting = search.fitting
    assert search.layouts[: len(fitting)] == fitting and all(not l.fits for l in search.layouts[len(fitting) :])
    # By TP traffic; at equal traffic without checkpointing first (no recompute), then the lower peak.
    keys = [(l.tp_sent_bytes, l.activation_checkpointing, l.peak_bytes) for l in fitting]
    assert keys == sorted(keys) and len(set(k[0] for k in keys)) == 2  # SP on and off send different bytes


# --- depth: traced at 3, 4 and 5 layers, extrapolated (plangen.cost.depth) ---------------------


def _linear_samples(per_layer: int = 10, per_depth: int = 100):
    """Samples as the tracker files them, every value exactly linear in the depth and the layer."""
    samples = {}
    for n in (3, 4, 5):
        at = {
            ("forward", None): {"x": 1000 + per_depth * n},
            ("backward", -1): {"x": 5000 + 3 * per_depth * n},
            ("optimizer", None): {"x": 2 * per_depth * n},
        }
        for k in range(n):
            at[("backward", k)] = {"x": 4000 + per_depth * n + (7 if k == 0 else 0) - per_layer * k}
        samples[n] = at
    return samples


def test_extrapolation_fits_each_place_exactly_and_refuses_what_is_not_linear():
    from plangen.cost.depth import extrapolate

    fitted = extrapolate(_linear_samples(), 80)
    assert fitted[("forward", None)] == {"x": 1000 + 100 * 80}
    assert fitted[("backward", -1)] == {"x": 5000 + 300 * 80}
    assert fitted[("backward", 0)] == {"x": 4000 + 100 * 80 + 7}  # the first layer, apart
    assert fitted[("backward", 1)] == {"x": 4000 + 100 * 80 - 10}
    assert fitted[("backward", 78)] == {"x": 4000 + 100 * 80 - 780}
    assert fitted[("backward", 79)] == {"x": 4000 + 100 * 80 - 790}
    # Every layer, for the timeline of the step (plangen.cost.plot), each on the same line.
    assert [fitted[("backward", k)]["x"] for k in range(1, 79)] == [4000 + 100 * 80 - 10 * k for k in range(1, 79)]
    bent = _linear_samples()
    bent[5][("backward", 2)]["x"] += 1  # one byte off the line, on a point the fit does not use
    assert extrapolate(bent, 80) is None
    missing = _linear_samples()
    del missing[4][("backward", -1)]
    assert extrapolate(missing, 80) is None


def test_running_layer_does_not_depend_on_the_order_of_the_trackers_parents():
    """In backward the tracker's parents (a set) can hold two layers; the running one is the lowest
    index (forward: the highest), whatever order the set iterates in: it followed string hashing."""
    from plangen.cost.depth import running_layer

    names = {f"model.layers.{i}": i for i in range(6)}
    parents = [
        "Global",
        "LlamaForCausalLM",
        "LlamaForCausalLM.model.layers.5",
        "LlamaForCausalLM.model.layers.4",
        "LlamaForCausalLM.model.layers.4.self_attn",
    ]
    for order in (parents, parents[::-1]):
        assert running_layer(order, names, in_backward=True) == 4
        assert running_layer(order, names, in_backward=False) == 5
    assert running_layer(["Global", "LlamaForCausalLM", "LlamaForCausalLM.model.norm"], names, True) is None


@pytest.mark.slow
def test_405b_peak_is_extrapolated_and_equals_its_every_layer_trace():
    """Llama-3.1-405B at TP 8 x DP 4 with SP, 8192 tokens: traced at 3, 4 and 5 layers and
    extrapolated (17 s here; every layer traced: about 130 s), to the byte of the trace of all 126.
    It used to fall back: one moment of its last layer's backward fell in either of two layers by
    string hashing, so the last layer's peak was not linear in the depth. About 3 minutes."""
    from pathlib import Path

    from plangen.cost.peak import measure_peak

    path = str(Path(__file__).parent / "data" / "model-configs" / "llama-3.1-405b.json")
    kwargs = dict(tp_size=8, dp_size=4, seq_len=8192, sequence_parallel=True)
    fast = measure_peak(path, **kwargs)
    assert fast.notes[0].startswith("depth: traced at 3, 4, 5 layers and extrapolated to 126")
    full = measure_peak(path, extrapolate=False, **kwargs)
    assert [(p.phase, p.breakdown, p.tracked_total) for p in fast.phases] == [
        (p.phase, p.breakdown, p.tracked_total) for p in full.phases
    ]
    assert fast.peak.module == full.peak.module == "model.layers.124.mlp.gate_proj"


def test_layers_alike_only_where_no_layer_differs(fake_pg):
    from transformers import AutoConfig, AutoModelForCausalLM

    from plangen.cost.depth import layers_alike
    from plangen.model.module_tree import find_transformer_layers
    from tiny_configs import TINY

    def why(name: str, **overrides):
        config = AutoConfig.for_model(**{**TINY[name], "num_hidden_layers": 6, **overrides})
        model = AutoModelForCausalLM.from_config(config)
        return layers_alike(find_transformer_layers(model), config)

    assert why("llama") is None
    assert why("qwen3_moe", mlp_only_layers=[]) is None
    assert why("qwen3_moe") == "its decoder layers differ in modules or parameter shapes"  # layer 0 dense
    assert (
        why("olmo3", layer_types=["sliding_attention", "full_attention"] * 3) == "its config sets layer_types per layer"
    )


def test_extrapolated_peak_is_byte_for_byte_the_traced_one(config_files, fake_pg, monkeypatch):
    """Six layers traced one by one against 3, 4 and 5 traced and extrapolated: every phase, every
    kind, to the byte, with sequence parallel and checkpointing.

    And what checkpointing leaves alive when backward reaches layer 0 does not grow with the depth:
    the layers after it are done and their saved inputs freed. It grew by a recomputed layer's keys,
    values and more per layer while backward's replay wrote into the KV cache (docs/cost.md)."""
    import plangen.cost.peak as peak

    traced, trace_at = [], peak._trace_at

    def recording_trace_at(*args, **kwargs):
        traced.append(trace_at(*args, **kwargs))
        return traced[-1]

    monkeypatch.setattr(peak, "_trace_at", recording_trace_at)
    kwargs = dict(
        tp_size=2, dp_size=2, seq_len=SEQ, micro_batch=BATCH, sequence_parallel=True, activation_checkpointing=True
    )
    deep = json.loads(config_files["llama"].read_text()) | {"num_hidden_layers": 6}
    path = config_files["llama"].with_name("llama-6-layers.json")
    path.write_text(json.dumps(deep))
    fast = peak.measure_peak(str(path), **kwargs)
    in_layer_0 = [peaks[("backward", 0)].breakdown.activations for _, peaks in traced]
    assert len(in_layer_0) == 3 and len(set(in_layer_0)) == 1, in_layer_0
    monkeypatch.setattr(peak, "_trace_at", trace_at)
    full = peak.measure_peak(str(path), extrapolate=False, **kwargs)
    assert fast.notes[0].startswith("depth: traced at 3, 4, 5 layers and extrapolated to 6")
    assert full.notes[0] == "depth: every layer traced"
    assert [(p.phase, p.breakdown, p.tracked_total) for p in fast.phases] == [
        (p.phase, p.breakdown, p.tracked_total) for p in full.phases
    ]
    # The timeline too: every stretch of the step at the full depth, in step order, labelled alike.
    assert (fast.extrapolated_from, full.extrapolated_from) == ((3, 4, 5), ())
    assert fast.timeline == full.timeline and len(full.timeline) == 2 * 6 + 5
    assert [p.layer for p in full.timeline if p.place == "layer"] == [*range(6), *reversed(range(6))]
    # The CLI's --every-layer is the same full trace.
    from typer.testing import CliRunner

    from plangen.commands.cli import app

    args = [
        "cost",
        str(path),
        "--peak",
        "--tp-size",
        "2",
        "--dp-size",
        "2",
        "--seq-len",
        str(SEQ),
        "--micro-batch",
        str(BATCH),
        "--sequence-parallel",
        "--activation-checkpointing",
        "--format",
        "json",
    ]
    doc = json.loads(CliRunner().invoke(app, [*args, "--every-layer"]).stdout)
    assert (
        doc["notes"][0] == "depth: every layer traced" and doc["plans"][0]["peak"]["bytes"] == full.peak.breakdown.total
    )
    no_peak = CliRunner().invoke(app, ["cost", str(path), "--every-layer"])
    assert no_peak.exit_code == 2 and "need --peak" in no_peak.output


@pytest.mark.distributed
def test_benchmark_table_sets_each_prediction_beside_every_ranks_measurement(predicted, measured):
    """benchmarks/peak_memory.py (docs/benchmarks.md, section 9) from this launch's results: one row per
    case and phase, the predicted and measured totals the ones compared above, every kind but the
    temporaries byte for byte."""
    import sys
    from pathlib import Path

    benchmarks = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        from peak_memory import PHASES, build_peak_section
    finally:
        sys.path.remove(benchmarks)
    section = build_peak_section(CASES, predicted, measured)
    assert len(section.rows) == len(CASES) * len(PHASES)
    for case, rows in zip(CASES, (section.rows[i : i + 3] for i in range(0, len(section.rows), 3))):
        for row, phase in zip(rows, PHASES):
            peak = next(p for p in predicted[case["name"]].phases if p.phase == phase)
            assert row[:5] == [
                case["model"],
                "on" if case["sp"] else "off",
                "on" if case["ac"] else "off",
                case["routing"],
                phase,
            ]
            assert row[5] == f"{peak.breakdown.total / 2**20:.3f} MiB"
    exact = section.goals[1]
    assert exact.met or ROUTING_SETS_MEMORY, exact.detail


def test_a_rank_that_peaked_with_the_next_all_gather_early_is_told_apart_from_a_wrong_prediction():
    """The one timing the CI run saw (rank 1, forward of the small Qwen3-MoE): more gathered, fewer
    activations, the total at most the extra buffer above: accepted; any other split is a difference."""
    from plangen.cost.validate import differing_kinds

    want = {
        "total": 4_279_072,
        "parameters": 1,
        "optimizer": 0,
        "activations": 4_016_672,
        "gathered": 262_400,
        "temporary": 0,
    }
    early = dict(want, total=4_318_048, activations=3_807_264, gathered=510_784)
    assert differing_kinds(early, want) == {}
    assert differing_kinds(dict(early, total=want["total"] + 300_000), want) != {}  # more than the buffer
    assert differing_kinds(dict(want, activations=want["activations"] - 1, total=want["total"] - 1), want) == {
        "activations": (4_016_671, 4_016_672)
    }


def test_what_gloo_still_held_is_allowed_exactly_and_nothing_else():
    """Activations above the trace by exactly one or two works' tensors (as the real run recorded them
    in that phase) are timing; one byte more or less is a difference. A peak at another moment (fewer
    temporaries than the trace's) passes only with its total above the trace's by at most a holding,
    more than one kind off, and the sharded parameters and optimizer states exact."""
    from plangen.cost.validate import differing_kinds

    want = {
        "total": 5_000_000,
        "parameters": 1_000_000,
        "gradients": 0,
        "optimizer": 2_000_000,
        "activations": 1_500_000,
        "gathered": 400_000,
        "temporary": 100_000,
    }
    held = [1024, 32_768, 65_536, 98_304]  # the loss's statistics; an all-gather's input, output, both
    seen = dict(want, held=held)
    for extra in (1024, 2048, 98_304, 98_304 + 1024):
        assert (
            differing_kinds(dict(seen, activations=want["activations"] + extra, total=want["total"] + extra), want)
            == {}
        )
    assert differing_kinds(dict(seen, activations=want["activations"] + 1025), want) == {
        "activations": (want["activations"] + 1025, want["activations"])
    }
    # One kind off alone, its total with it, is a wrong prediction, not a peak at another moment.
    assert differing_kinds(dict(seen, activations=want["activations"] + 1025, total=want["total"] + 1025), want) != {}
    assert differing_kinds(dict(seen, activations=want["activations"] + 1024, held=[]), want) != {}
    elsewhere = dict(seen, temporary=50_000, activations=want["activations"] + 90_000, total=want["total"] + 40_000)
    assert differing_kinds(elsewhere, want) == {}
    assert differing_kinds(dict(elsewhere, total=want["total"] + 2 * 98_304 + 1), want) != {}  # more than two works
    assert differing_kinds(dict(elsewhere, optimizer=want["optimizer"] + 4), want) != {}
    assert differing_kinds(dict(seen, temporary=50_000), want) == {"temporary": (50_000, 100_000)}  # the same total

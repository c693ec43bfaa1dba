"""``plangen cost --peak``: peak memory per rank of one traced training step (plangen.cost.peak).

The traced figures are checked against the same step on real tensors at DP 2 x TP 2 (gloo), and for
the properties a user relies on: the kinds add up to the tracker's total, sequence parallel and
activation checkpointing lower activations, the verdict flips exactly at the peak.
"""

from __future__ import annotations

import json

import pytest

from plangen.cost.peak import Breakdown, PeakReport, PhasePeak, parse_memory
from plangen.cost.settings import CostError, CostSettings

# Small enough for gloo in seconds, large enough that activations and weights are both megabytes.
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 704,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 3, "vocab_size": 2048,
    "max_position_embeddings": 1024, "tie_word_embeddings": False,
}
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 704,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "num_hidden_layers": 3,
    "vocab_size": 2048, "max_position_embeddings": 1024, "tie_word_embeddings": False,
}
BATCH, SEQ = 2, 256
CASES = [
    {"name": f"{name}{'-sp' if sp else ''}{'-ac' if ac else ''}", "model": name, "config": config,
     "sp": sp, "ac": ac, "batch": BATCH, "seq_len": SEQ}
    for name, config in (("llama", LLAMA), ("qwen3", QWEN3)) for sp in (False, True) for ac in (False, True)
]


def _report(total: int) -> PeakReport:
    breakdown = Breakdown(parameters=total - 100, activations=100)
    return PeakReport("m", "LlamaForCausalLM", "hand-written", CostSettings(), False, 2,
                      (PhasePeak("backward", "", breakdown, total),), 0.0)


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
    root = tmp_path_factory.mktemp("peak")
    paths = {}
    for name, values in (("llama", LLAMA), ("qwen3", QWEN3)):
        paths[name] = root / f"{name}.json"
        paths[name].write_text(json.dumps(values))
    return paths


@pytest.fixture(scope="module")
def predicted(config_files):
    """Every case traced with fake tensors on the single-process fake group (rank 0)."""
    from plangen.cost.peak import measure_peak

    return {
        c["name"]: measure_peak(str(config_files[c["model"]]), tp_size=2, dp_size=2, seq_len=SEQ, micro_batch=BATCH,
                                sequence_parallel=c["sp"], activation_checkpointing=c["ac"])
        for c in CASES
    }


def test_breakdown_adds_up_to_the_trackers_total(predicted):
    for report in predicted.values():
        assert {p.phase for p in report.phases} == {"forward", "backward", "optimizer"}
        for phase in report.phases:
            assert phase.breakdown.total == phase.tracked_total > 0


def test_steady_state_and_no_global_shaped_transients(predicted):
    """AdamW's states are held from the start (the measured step is the second) and are 2x the
    parameters; the optimizer step's temporaries stay below one more copy (single-tensor AdamW)."""
    for report in predicted.values():
        for phase in report.phases:
            b = phase.breakdown
            assert b.optimizer == 2 * b.parameters - 2 * _buffers(b)
        step = next(p for p in report.phases if p.phase == "optimizer").breakdown
        assert step.gradients == step.parameters - _buffers(step)
        assert 0 < step.temporary <= step.parameters


def _buffers(b: Breakdown) -> int:
    return b.parameters - b.optimizer // 2  # parameters include the (tiny) rotary buffers


def test_sequence_parallel_and_checkpointing_lower_activations(predicted):
    for model in ("llama", "qwen3"):
        peak = lambda name: predicted[name].peak.breakdown  # noqa: E731
        assert peak(f"{model}-sp").activations < peak(model).activations
        assert peak(f"{model}-ac").activations < peak(model).activations / 2
        assert peak(f"{model}-sp").parameters == peak(model).parameters


@pytest.fixture(scope="module")
def measured():
    from plangen.launch import run_distributed

    return run_distributed("tests/distributed/peak_cases.py:run_peak_cases", 4, CASES, timeout=300)


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c["name"] for c in CASES])
def test_prediction_is_within_10_percent_of_real_tensors(predicted, measured, case):
    real = measured[0][case]
    assert "error" not in real, real.get("trace")
    for phase in predicted[case].phases:
        got, want = phase.breakdown.total, real["phases"][phase.phase]["total"]
        assert abs(got - want) <= 0.10 * want, (phase.phase, got, want)

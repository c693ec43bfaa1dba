"""plangen verify --run --drift: logits and log-prob drift from TP=1, optimized vs stable variant.

One launch (4 gloo ranks) measures both Llama plan files at TP 2 and 4, fp32 and bf16, against the
unsharded shrunk model on the same batch.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from plangen.check.drift import DRIFT_DTYPES, DRIFT_TP_SIZES, check_drift, render_drift_json, render_drift_text
from plangen.commands.cli import app
from plangen.commands.init import init_plan


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drift")
    paths = {v: str(init_plan("llama", directory / f"llama_{v}.py", variant=v).path) for v in ("optimized", "stable")}
    rows = check_drift([{"path": p, "model": "llama"} for p in paths.values()], timeout=300)
    return {v: [r for r in rows if r.path == p] for v, p in paths.items()}


@pytest.mark.distributed
def test_stable_variant_logits_are_bitwise_those_of_tp1_at_every_size_and_dtype(drift):
    rows = drift["stable"]
    assert [(r.tp_size, r.dtype) for r in rows] == [(tp, d) for d in DRIFT_DTYPES for tp in DRIFT_TP_SIZES]
    for r in rows:
        assert r.error is None and r.bitwise, r
        assert r.logits_max == r.logits_mean == r.logprobs_max == r.logprobs_mean == 0.0, r


@pytest.mark.distributed
def test_optimized_plan_drifts_within_rounding(drift):
    """Row-parallel sums in another order than one device's: not bitwise, fp32 within ~1e-6, bf16
    within its rounding (the figures of docs/rl.md)."""
    for r in drift["optimized"]:
        assert r.error is None and not r.bitwise, r
        assert 0 < r.logits_mean <= r.logits_max and 0 < r.logprobs_max
        limit = 1e-5 if r.dtype == "float32" else 0.05
        assert r.logits_max < limit and r.logprobs_max < limit, r


@pytest.mark.distributed
def test_drift_renders_as_text_and_json(drift):
    rows = drift["optimized"] + drift["stable"]
    text = render_drift_text(rows)
    assert text.count("  TP  dtype") == 2 and text.count(" yes\n") == len(drift["stable"])
    data = json.loads(json.dumps(render_drift_json(rows)))
    assert {tuple(sorted(d)) for d in data} == {
        ("bitwise", "dtype", "error", "logits_max", "logits_mean", "logprobs_max", "logprobs_mean", "path", "tp_size")
    }
    assert all(math.isfinite(d["logits_max"]) for d in data)


def test_drift_without_run_is_a_one_line_usage_error(tmp_path):
    plan = tmp_path / "plan.py"
    plan.write_text("custom_parallel_plan = {}\n")
    result = CliRunner().invoke(app, ["verify", "--drift", str(plan)])
    assert result.exit_code == 2
    assert result.stderr.strip() == "plangen: error: --drift runs the plans: add --run"

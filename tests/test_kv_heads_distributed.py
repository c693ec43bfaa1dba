"""KV heads replicated where the TP size exceeds them (plangen.styles.kv_heads), against the unsharded model.

A tiny Gemma-3 with one KV head at TP 2 (and DP 2 x TP 2) and a tiny Qwen2 with two KV heads at
TP 4 through the hand-written plans, a tiny Granite with one KV head through its synthesized plan:
logits, every gradient (the replicated k/v weights' included), the gradient norm and three AdamW
steps within 1e-5, with and without sequence parallel, eager attention once (it reads
``num_key_value_groups``), a tiny Qwen3 with one KV head (per-head k_norm) applied as NeMo RL
applies plans (``parallelize_module`` then ``fully_shard``, nothing of plangen's runtime), and full
state dicts in Hugging Face's layout both ways. One launch of four gloo processes
(tests/distributed/cases.py).
"""

from __future__ import annotations

import sys

import pytest

from conftest import cases_read_by, slow_unless
from plangen.distributed.launch import run_distributed

TOL = 1e-5
CASES = {
    "tp2": [
        {"name": "gemma3-1kv", "model": "gemma3-1kv"},
        {"name": "gemma3-1kv-sp", "model": "gemma3-1kv", "sp": True},
        {"name": "gemma3-1kv-eager-padded-sp", "model": "gemma3-1kv", "sp": True, "pad": True, "attn": "eager"},
        {"name": "granite-1kv-synthesized", "model": "granite-1kv", "plan_kind": "synthesized"},
    ],
    "dp2tp2": [
        {"name": "gemma3-1kv", "model": "gemma3-1kv", "state_dict": True},
        {"name": "gemma3-1kv-sp", "model": "gemma3-1kv", "sp": True},
        # Recomputed forwards run the KV slicing hooks again.
        {"name": "gemma3-1kv-activation-checkpointing-sp", "model": "gemma3-1kv", "sp": True, "ac": True},
        # NeMo RL's runtime: parallelize_module, then fully_shard (tests/distributed/cases.py).
        {"name": "qwen3-1kv-bare", "model": "qwen3-1kv", "bare": True, "state_dict": True},
    ],
    "tp4": [
        {"name": "qwen2", "model": "qwen2", "state_dict": True},
        {"name": "qwen2-sp", "model": "qwen2", "sp": True},
        {"name": "gemma3-1kv-eager", "model": "gemma3-1kv", "attn": "eager"},
    ],
}
CASE_IDS = [f"{mesh}/{c['name']}" for mesh, cases in CASES.items() for c in cases]
# The default run: the issue's two (Gemma-3-1B at TP 2 with its one KV head, under SP too; Qwen2.5's
# two KV heads at TP 4), the synthesized plan, and FSDP2 with each runtime (state dicts); the rest
# (eager and padded, activation checkpointing, TP 4 with SP) is marked slow.
DEFAULT_IDS = {
    "tp2/gemma3-1kv",
    "tp2/gemma3-1kv-sp",
    "tp2/granite-1kv-synthesized",
    "dp2tp2/gemma3-1kv",
    "dp2tp2/qwen3-1kv-bare",
    "tp4/qwen2",
}


@pytest.fixture(scope="module")
def results(request) -> list[dict]:
    cases = cases_read_by(request.session.items, sys.modules[__name__], CASES)
    return run_distributed("tests/distributed/cases.py:run_cases", 4, cases, timeout=300)


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", slow_unless(CASE_IDS, DEFAULT_IDS))
def test_replicated_kv_heads_match_the_unsharded_model(results, case_id):
    for rank, per_case in enumerate(results):
        r = per_case[case_id]
        assert "error" not in r, f"rank {rank}: {r.get('trace', r.get('error'))}"
        assert r["missing_grads"] == [] and r["extra_grads"] == []
        assert r["logits"] < TOL and r["loss"] < TOL, r
        assert r["grad"] < TOL, f"rank {rank}: gradient of {r['worst_grad']} differs by {r['grad']}"
        assert r["grad_norm"] < TOL and r["grad_norm_inf"] < TOL
        assert r["param_drift"] < TOL, f"rank {rank}: parameters differ by {r['param_drift']} after 3 AdamW steps"
        assert r["logits_placements"] == ["S(2)"]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "case_id",
    slow_unless([c for c in CASE_IDS if c in ("dp2tp2/gemma3-1kv", "dp2tp2/qwen3-1kv-bare", "tp4/qwen2")], DEFAULT_IDS),
)
def test_replicated_kv_weights_give_the_hugging_face_state_dict_both_ways(results, case_id):
    for per_case in results:
        sd = per_case[case_id]["state_dict"]
        assert sd["names"] == [] and sd["shapes"] == [] and sd["plain_names"] == [], sd
        assert sd["read"] == 0 and sd["loaded"] == 0 and sd["plain_read"] == 0, sd

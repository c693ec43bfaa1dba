"""parallelize_model on peft LoRA models against the unsharded LoRA model: gloo, DP=2 x TP=2, one launch.

Each case: the runtime's plan for the class, translated onto the LoRA layers (plangen.runtime.lora); logits,
every adapter gradient (lora_B drawn non-zero, so lora_A's are not zero), the gradient norm and
three AdamW steps within 1e-5 of the single-process reference in fp32; the frozen base weights get
no gradient, and FSDP2 reduce-scatters exactly the adapters' gradient bytes (none of the base's).
"""

from __future__ import annotations

import sys

import pytest

from conftest import cases_read_by, slow_unless
from plangen.distributed.launch import run_distributed

pytest.importorskip("peft")

TOL = 1e-5
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = {
    "dp2tp2": [
        {"name": "llama-all-linear", "model": "llama", "targets": ALL_LINEAR},
        {"name": "llama-all-linear-sp", "model": "llama", "targets": ALL_LINEAR, "sp": True},
        {"name": "qwen3-q-v", "model": "qwen3", "targets": ["q_proj", "v_proj"]},  # per-head norms, frozen
        {"name": "gemma3-all-linear-sp", "model": "gemma3", "targets": ALL_LINEAR, "sp": True},  # tied, frozen
        # The synthesized plan (chosen on the model without LoRA), one KV head replicated at TP 2.
        {"name": "llama-all-linear-sp-checkpointed", "model": "llama", "targets": ALL_LINEAR, "sp": True, "ac": True},
        {
            "name": "granite-1kv-synthesized",
            "model": "granite-1kv",
            "targets": ["q_proj", "o_proj", "gate_proj", "down_proj"],
        },
        # Mixed precision (bf16 compute, fp32 reduction): peft casts the input to the adapters' dtype.
        {
            "name": "llama-all-linear-sp-bf16",
            "model": "llama",
            "targets": ALL_LINEAR,
            "sp": True,
            "dtype": "bfloat16",
            "steps": 0,
        },
        # The stable variant (o_proj/down_proj column-parallel on the gathered input, lora_B with them;
        # OLMo-2's q/k norms gathered): adapters follow the rewritten base layers.
        *(
            {"name": f"{m}-all-linear-stable", "model": m, "targets": ALL_LINEAR, "variant": "stable"}
            for m in ("llama", "olmo2")
        ),
        # lora_dropout > 0 (train mode): the TP ranks of a DP rank draw the unsharded model's masks, on
        # a column-parallel layer's gathered input and (FeatureShardedDropout) a row-parallel one's
        # feature shard; with SP and with activation checkpointing (its recompute restores the RNG).
        # No AdamW steps: the reference's next forward would draw other masks than the ranks'.
        *(
            {
                "name": f"llama-all-linear-dropout{s}",
                "model": "llama",
                "targets": ALL_LINEAR,
                "dropout": 0.25,
                "steps": 0,
                "sp": "sp" in s,
                "ac": "ac" in s,
            }
            for s in ("", "-sp", "-sp-ac")
        ),
    ]
}
CASE_IDS = [f"{mesh}/{c['name']}" for mesh, cases in CASES.items() for c in cases]
TARGETS = {f"{mesh}/{c['name']}": c["targets"] for mesh, cases in CASES.items() for c in cases}


# The default run: all-linear adapters (under SP with Gemma 3's tied, frozen embeddings), frozen per-head
# norms, the synthesized plan with one KV head, bf16, the stable variant,
# and dropout under SP with activation checkpointing; the other repeats are marked slow.
DEFAULT_IDS = {
    f"dp2tp2/{name}"
    for name in (
        "llama-all-linear",
        "qwen3-q-v",
        "gemma3-all-linear-sp",
        "granite-1kv-synthesized",
        "llama-all-linear-sp-bf16",
        "llama-all-linear-stable",
        "llama-all-linear-dropout-sp-ac",
    )
}


@pytest.fixture(scope="module")
def results(request) -> list:
    cases = cases_read_by(request.session.items, sys.modules[__name__], CASES, _needs)
    return run_distributed("tests/distributed/lora_cases.py:run_lora_cases", 4, cases, timeout=300)


def _needs(test: str, params: dict) -> list[str]:
    return ["dp2tp2/llama-all-linear"] if test == "test_base_layers_and_adapters_are_sharded_to_match" else []


BF16 = [c for c in CASE_IDS if c.endswith("-bf16")]


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", slow_unless([c for c in CASE_IDS if c not in BF16], DEFAULT_IDS))
def test_lora_model_matches_the_unsharded_lora_model(results, case_id):
    for rank, per_case in enumerate(results):
        r = per_case[case_id]
        assert "error" not in r, f"rank {rank}: {r.get('trace', r.get('error'))}"
        assert r["missing_grads"] == [] and r["extra_grads"] == []
        # Every adapter of every targeted module in both layers, each non-trivial in the reference.
        assert r["adapter_grads"] == r["ref_adapter_grads"] and len(r["adapter_grads"]) == 2 * 2 * len(TARGETS[case_id])
        assert r["smallest_ref_grad"] > 1e-4
        assert r["logits"] < TOL, f"rank {rank} logits differ by {r['logits']}"
        assert r["grad"] < TOL, f"rank {rank}: gradient of {r['worst_grad']} differs by {r['grad']}"
        assert r["grad_norm"] < TOL
        assert "dropout" in case_id or r["param_drift"] < TOL, (
            f"rank {rank}: parameters differ by {r['param_drift']} after 3 AdamW steps"
        )
        assert (r["training"], r["dropout"]) == ((True, [0.25]) if "dropout" in case_id else (False, []))


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", slow_unless([c for c in CASE_IDS if c.endswith("-stable")], DEFAULT_IDS))
def test_stable_lora_logits_are_those_of_the_unsharded_lora_model_to_rounding(results, case_id):
    # No cross-rank sum in the forward, adapters included: each logit computed as one device does (fp32,
    # CPU), bit for bit where MKL picks the same kernels for the narrow shards and adapters as for the
    # whole matrices. On some CPUs it does not (this session's machine: last-bit differences at TP 2
    # and DP 2 x TP 2 alike, on the base commit too: up to 3.1e-7), so the bound is float32 rounding of
    # logits of order 1, 10x under the parity tolerance.
    assert all(per_case[case_id]["logits"] < 1e-6 for per_case in results), [r[case_id]["logits"] for r in results]


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", slow_unless(CASE_IDS, DEFAULT_IDS))
def test_frozen_base_weights_get_no_gradient_and_no_gradient_communication(results, case_id):
    for per_case in results:
        r = per_case[case_id]
        assert r["frozen"] > 0 and r["frozen_with_grad"] == []
        assert r["fsdp_reduce_scatter_bytes"] == r["trainable_bytes"]
        assert r["frozen_bytes"] > 3 * r["trainable_bytes"]  # would show, had any frozen gradient been reduced


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", slow_unless(BF16, DEFAULT_IDS))
def test_bf16_lora_model_runs_and_stays_close_to_fp32(results, case_id):
    for per_case in results:
        r = per_case[case_id]
        assert "error" not in r, r.get("trace")
        assert r["logits"] < 0.05 and r["adapter_grads"] == r["ref_adapter_grads"], r


@pytest.mark.distributed
def test_base_layers_and_adapters_are_sharded_to_match(results):
    r = results[0]["dp2tp2/llama-all-linear"]["placements"]
    layer = "base_model.model.model.layers.0.self_attn"
    # FSDP2 over DP (first), TP (second): lora_B splits its outputs like the column-parallel base ...
    assert r[f"{layer}.q_proj.lora_B.default.weight"][1] == r[f"{layer}.q_proj.base_layer.weight"][1] == "S(0)"
    # ... lora_A its inputs like the row-parallel base.
    assert r[f"{layer}.o_proj.lora_A.default.weight"][1] == r[f"{layer}.o_proj.base_layer.weight"][1] == "S(1)"

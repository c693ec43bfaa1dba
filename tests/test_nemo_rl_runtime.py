"""Generated plan modules are right under NeMo RL's own runtime, which never re-ties.

NeMo RL's ``_parallelize_model`` applies a ``custom_parallel_plan`` dict with ``parallelize_module``,
then ``fully_shard`` per decoder layer and on the root (docs/nemo-rl.md). The worker
(tests/distributed/nemo_rl_runtime.py) does exactly that with the dict imported from the generated
module, without plangen's runtime, at DP=2 x TP=2 over gloo, SP off and on, for Gemma 3 (the
committed generated/gemma3_text files) and a Llama 3.2 1B shrunk from its real config (a file
written by ``plangen init`` from that config). The tied embedding and head must stay one parameter
by the generated file alone; logits, every gradient and three AdamW steps must match the unsharded
model. A control case, the same plan with torch's plain styles at both ends, shows the defect the
pair removes: two parameters, an extra gradient.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plangen.distributed.launch import run_distributed

REPO = Path(__file__).resolve().parents[1]
LLAMA_32_1B = REPO / "tests/data/model-configs/llama-3.2-1b.json"
TOL = 1e-5


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory) -> dict[str, str]:
    """The plan modules under test: Llama 3.2 1B's written by plangen init, Gemma 3's committed."""
    from plangen.commands.init import init_plan

    written = tmp_path_factory.mktemp("plans")
    files = {
        "gemma3": str(REPO / "generated/gemma3_text_plan.py"),
        "gemma3-sp": str(REPO / "generated/gemma3_text_sp_plan.py"),
    }
    for sp in (False, True):
        path = written / f"llama_3_2_1b{'_sp' if sp else ''}_plan.py"
        init_plan(str(LLAMA_32_1B), path, tp_size=2, sequence_parallel=sp)
        files["llama-3.2-1b" + ("-sp" if sp else "")] = str(path)
    return files


@pytest.fixture(scope="module")
def results(plan_files) -> list[dict]:
    cases = [
        {
            "name": name,
            "plan": path,
            **({"model": "gemma3"} if name.startswith("gemma3") else {"config": str(LLAMA_32_1B)}),
        }
        for name, path in plan_files.items()
    ]
    control = {"config": str(LLAMA_32_1B), "plan": plan_files["llama-3.2-1b"], "control": True, "steps": 0}
    cases.append({"name": "control-plain-styles", **control})
    # One launch for every case.
    return run_distributed("tests/distributed/nemo_rl_runtime.py:run_cases", 4, cases, timeout=300)


def test_generated_files_use_the_tied_pair(plan_files):
    for path in plan_files.values():
        text = Path(path).read_text()
        assert '"model.embed_tokens": TiedEmbeddingParallel(' in text and '"lm_head": TiedHeadParallel(' in text, path
        assert "relies only on a runtime that calls parallelize_module" in " ".join(text.split()), path


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["gemma3", "gemma3-sp", "llama-3.2-1b", "llama-3.2-1b-sp"])
def test_generated_plan_under_nemo_rl_steps_matches_the_unsharded_model(results, case):
    for rank, per_case in enumerate(results):
        r = per_case[case]
        assert "error" not in r, f"rank {rank}: {r.get('trace')}"
        assert r["tied_after_tp"] and r["tied_after_fsdp"] and r["tied_after_steps"], (rank, r)
        assert r["ends_differ_after_steps"] == 0.0
        assert r["missing_grads"] == [] and r["extra_grads"] == [], (rank, r)
        assert r["logits"] < TOL, (rank, r["logits"])
        assert r["grad"] < TOL, (rank, r["worst_grad"], r["grad"])
        assert r["param_drift"] < TOL, (rank, r["param_drift"])


@pytest.mark.distributed
def test_plain_styles_at_both_ends_come_apart_under_the_same_steps(results):
    for per_case in results:
        r = per_case["control-plain-styles"]
        assert "error" not in r, r.get("trace")
        assert not r["tied_after_tp"] and not r["tied_after_fsdp"]
        assert r["extra_grads"] == ["lm_head.weight"]  # the second copy, trained on its own

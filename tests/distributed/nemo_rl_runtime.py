"""Worker side of tests/test_nemo_rl_runtime.py: a generated plan module under NeMo RL's own steps.

No plangen runtime here: the plan dict is imported from the generated file as NeMo RL imports it,
then NeMo RL's ``_parallelize_model`` is reproduced step by step (``parallelize_module(model,
tp_mesh, plan)``, ``fully_shard`` per decoder layer, then on the root with
``reshard_after_forward=False``, one ``MixedPrecisionPolicy`` with ``output_dtype=float32`` for
all), with no re-tie. Each case compares logits, every gradient and three AdamW steps with the
unsharded model, and reports whether the tied embedding and head are one parameter.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import BATCH, SEQ, full, next_token_loss, result_or_error, train_steps  # noqa: E402
from tiny_configs import build_tiny  # noqa: E402


def import_plan(path: str) -> dict:
    """``custom_parallel_plan`` of the module at ``path``, imported as any Python module."""
    spec = importlib.util.spec_from_file_location(f"plan_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.custom_parallel_plan


def untied_control(plan: dict) -> dict:
    """The same plan with torch's own styles at both ends (what plangen generated before the pair)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from plangen.styles.tied import TiedEmbeddingParallel, TiedHeadParallel

    def plain(style):
        torch_style = {TiedEmbeddingParallel: RowwiseParallel, TiedHeadParallel: ColwiseParallel}.get(type(style))
        if torch_style is None:
            return style
        return torch_style(input_layouts=style.input_layouts[0], output_layouts=style.output_layouts[0],
                           use_local_output=style.use_local_output)  # fmt: skip

    return {key: plain(style) for key, style in plan.items()}


def build_model(case: dict[str, Any]) -> torch.nn.Module:
    if "config" in case:  # a real config, shrunk (same architecture, rope scaling and tie)
        from plangen.model.resolve import resolve_model
        from plangen.model.shrink import build_tiny_model

        return build_tiny_model(resolve_model(case["config"]), seed=0)
    return build_tiny(case["model"], seed=0)


def nemo_rl_parallelize(model, dp_mesh, tp_mesh, plan: dict):
    """NeMo RL's ``_parallelize_model`` (v1 worker) for a custom plan, fp32: nothing of plangen's."""
    parallelize_module(model, tp_mesh, plan)
    one = lambda m: m.lm_head.weight is m.model.embed_tokens.weight  # noqa: E731
    tied_after_tp = one(model)
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    sharded = fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)
    return sharded, tied_after_tp, one(sharded)


def run_case(case: dict[str, Any], dp_mesh, tp_mesh) -> dict[str, Any]:
    model = build_model(case)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size - 8, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    dp, dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    mask = torch.ones_like(ids)

    ref_logits = reference(input_ids=ids).logits
    per_slice = [
        next_token_loss(
            ref_logits[r * BATCH // dp : (r + 1) * BATCH // dp], ids[r * BATCH // dp : (r + 1) * BATCH // dp]
        )
        for r in range(dp)
    ]
    torch.stack(per_slice).mean().backward()  # FSDP2 averages over DP: the mean of the slices' losses
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}

    plan = import_plan(case["plan"])
    if case.get("control"):
        plan = untied_control(plan)
    sharded, tied_after_tp, tied_after_fsdp = nemo_rl_parallelize(model, dp_mesh, tp_mesh, plan)
    logits = sharded(input_ids=ids[rows]).logits
    next_token_loss(logits, ids[rows]).backward()
    grads = {n: p.grad for n, p in sharded.named_parameters() if p.grad is not None}
    diffs = {n: (full(grads[n]) - ref_grads[n]).abs().max().item() for n in ref_grads if n in grads}
    worst = max(diffs, key=diffs.get) if diffs else None
    drift = train_steps(reference, sharded, ids, mask, rows, dp, case.get("steps", 3))
    head, emb = sharded.lm_head.weight, sharded.model.embed_tokens.weight
    return {
        "tied_after_tp": tied_after_tp,
        "tied_after_fsdp": tied_after_fsdp,
        "tied_after_steps": head is emb,
        "ends_differ_after_steps": (full(head.detach()) - full(emb.detach())).abs().max().item(),
        "logits": (full(logits) - ref_logits[rows]).abs().max().item(),
        "grad": diffs[worst] if worst else None,
        "worst_grad": worst,
        "missing_grads": sorted(set(ref_grads) - set(grads)),
        "extra_grads": sorted(set(grads) - set(ref_grads)),
        "param_drift": drift,
    }


def run_cases(cases: list[dict[str, Any]]) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    results: dict[str, Any] = {}
    for case in cases:
        results[case["name"]] = result_or_error(run_case, case, mesh["dp"], mesh["tp"])
    dist.barrier()
    return results

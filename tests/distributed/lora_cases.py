"""Worker side of the LoRA parity tests: peft LoRA models parallelized by plangen, many cases per launch.

Each case builds the same tiny random model on every rank, wraps it with peft (``lora_B`` drawn
non-zero, so that every adapter gets a non-trivial gradient), keeps an unsharded copy as the
reference, runs ``parallelize_model`` on the other copy and compares logits, every adapter
gradient, the gradient norm and three AdamW steps; it also reports which frozen base weights got a
gradient and the collectives of the backward (FSDP2's gradient reduce-scatters included).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cases import BATCH, SEQ, build_meshes, full, next_token_loss, result_or_error, train_steps  # noqa: E402
from tiny_configs import build_tiny  # noqa: E402

from plangen.distributed.comm import CollectiveCounter  # noqa: E402
from plangen.parallelize import get_grad_norm, parallelize_model  # noqa: E402


def build_lora_model(name: str, targets: list[str], rank: int = 4, dropout: float = 0.0) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    model = build_tiny(name, seed=0)
    peft_model = get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=dropout)
    )
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for pname, param in peft_model.named_parameters():
            if "lora_B" in pname:  # peft starts lora_B at zero: lora_A's gradient would be zero too
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return peft_model


def run_lora_case(case: dict[str, Any], dp_mesh, tp_mesh) -> dict[str, Any]:
    dropout = case.get("dropout", 0.0)
    model = build_lora_model(case["model"], case["targets"], dropout=dropout)
    model.train(dropout > 0)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, reference.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    dp_group = dp_mesh.get_group()
    dp, dp_rank = dp_mesh.size(), dist.get_rank(dp_group)
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    mask = torch.ones_like(ids)

    # With dropout each DP rank's slice is the unsharded model's forward on that slice from the
    # same generator state (the rank's TP group shares it): the reference runs slice by slice.
    ref_logits = torch.cat([_seeded(reference, ids[r * BATCH // dp : (r + 1) * BATCH // dp]) for r in range(dp)])
    per_slice = [
        next_token_loss(
            ref_logits[r * BATCH // dp : (r + 1) * BATCH // dp], ids[r * BATCH // dp : (r + 1) * BATCH // dp]
        )
        for r in range(dp)
    ]
    torch.stack(per_slice).mean().backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    ref_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in ref_grads.values()])).item()

    sharded = parallelize_model(
        model,
        dp_mesh,
        tp_mesh,
        getattr(torch, case.get("dtype", "float32")),
        sequence_parallel=case.get("sp", False),
        activation_checkpointing=case.get("ac", False),
        plan_variant=case.get("variant", "optimized"),
    )
    logits = _seeded(sharded, ids[rows])
    loss = next_token_loss(logits, ids[rows])
    with CollectiveCounter() as backward:
        loss.backward()
    grads = {n: p.grad for n, p in sharded.named_parameters() if p.grad is not None}
    grad_diffs = {n: (full(grads[n]) - ref_grads[n]).abs().max().item() for n in ref_grads if n in grads}
    worst = max(grad_diffs, key=grad_diffs.get) if grad_diffs else None
    norm = get_grad_norm(list(sharded.parameters()), dp_group, tp_mesh.get_group())
    # Frozen weights: sharded by TP and FSDP2 like the plan says, never given a gradient.
    placements = {
        n: [str(p) for p in param.placements]
        for n, param in sharded.named_parameters()
        if n.endswith(
            (
                "q_proj.base_layer.weight",
                "o_proj.base_layer.weight",
                "q_proj.lora_B.default.weight",
                "o_proj.lora_A.default.weight",
            )
        )
        and ".layers.0." in n
    }
    return {
        "logits": (full(logits) - ref_logits[rows]).abs().max().item(),
        "grad": grad_diffs[worst] if worst else None,
        "worst_grad": worst,
        "missing_grads": sorted(set(ref_grads) - set(grads)),
        "extra_grads": sorted(set(grads) - set(ref_grads)),
        "adapter_grads": sorted(n for n in grads if "lora_" in n),
        "ref_adapter_grads": sorted(n for n in ref_grads if "lora_" in n),
        "smallest_ref_grad": min(g.abs().max().item() for g in ref_grads.values()),
        "frozen_with_grad": sorted(
            n for n, p in sharded.named_parameters() if not p.requires_grad and p.grad is not None
        ),
        "frozen": sum(1 for p in sharded.parameters() if not p.requires_grad),
        "grad_norm": abs(norm - ref_norm),
        "param_drift": train_steps(reference, sharded, ids, mask, rows, dp, case.get("steps", 3)),
        # FSDP2's reduce-scatters (c10d's) carry the adapters' gradients only: exactly their local bytes.
        "fsdp_reduce_scatter_bytes": sum(size for op, size in backward.records if op == "_reduce_scatter_base_"),
        "trainable_bytes": _local_bytes(p for p in sharded.parameters() if p.requires_grad),
        "frozen_bytes": _local_bytes(p for p in sharded.parameters() if not p.requires_grad),
        "placements": placements,
        "dropout": [m.p for m in sharded.modules() if type(m).__name__ == "Dropout" and m.p > 0][:1],
        "training": sharded.training,
    }


def _seeded(model, ids: torch.Tensor) -> torch.Tensor:
    # Dropout draws from the global generator: every forward starts from the same state, as the TP
    # ranks of one DP rank do in a run seeded alike.
    torch.manual_seed(3)
    return model(input_ids=ids).logits


def _local_bytes(params) -> int:
    return sum(p.to_local().numel() * p.element_size() for p in params)


def run_lora_cases(payload: dict[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for mesh_kind, cases in payload.items():
        dp_mesh, tp_mesh = build_meshes(mesh_kind)
        for case in cases:
            results[f"{mesh_kind}/{case['name']}"] = result_or_error(run_lora_case, case, dp_mesh, tp_mesh)
    return results

"""Worker side of the verify property (tests/verify_property.py): the truth for each edited plan.

Each case is a plan file and the config it is for. The model of that very config (not shrunk) is
built on every rank with the same seed, an unsharded copy kept as the reference; the plan file is
applied by the runtime (``parallelize_model``, DP=1 x TP over every rank of the launch), and one
forward and backward compared with the reference's: logits and every gradient, each within a
tolerance relative to its largest reference value. A case that raises is a wrong run.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/

from verify_property import ATOL, BATCH, RTOL, SEED, SEQ  # noqa: E402

from plangen.check.run import full_parameter, full_tensor, next_token_loss  # noqa: E402
from plangen.output.errors import one_line  # noqa: E402


def build_model(config_path: str) -> torch.nn.Module:
    from plangen.model.resolve import resolve_model

    resolved = resolve_model(config_path)
    config = copy.deepcopy(resolved.config)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = resolved.model_class._from_config(config, dtype=torch.float32)
    return model.eval()


def _differs(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """How far ``got`` is from ``want`` relative to ``want``'s scale; None within the tolerance."""
    if tuple(got.shape) != tuple(want.shape):
        return float("inf")
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    return None if diff <= ATOL + RTOL * scale else diff / max(scale, 1e-30)


def run_case(case: dict[str, Any], mesh) -> str | None:
    """Why the run differs from the unsharded model, or None."""
    from plangen.parallelize import parallelize_model

    model = build_model(case["config"])
    reference = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    ref_logits = reference(input_ids=ids).logits
    next_token_loss(ref_logits, ids).backward()
    try:
        sharded = parallelize_model(
            model, mesh["dp"], mesh["tp"], torch.float32, sequence_parallel=False, custom_parallel_plan=case["plan"],
        )  # fmt: skip
        logits = sharded(input_ids=ids).logits
        next_token_loss(logits, ids).backward()
        if (off := _differs(full_tensor(logits), ref_logits)) is not None:
            return f"logits differ by {off:.1e} of their scale"
        grads = {name: p.grad for name, p in sharded.named_parameters() if p.grad is not None}
        for name, param in reference.named_parameters():
            if param.grad is None:
                continue
            if name not in grads:
                return f"{name} gets no gradient"
            if (off := _differs(full_parameter(sharded, name, grads[name]), param.grad)) is not None:
                return f"the gradient of {name} differs by {off:.1e} of its scale"
    except Exception as error:  # noqa: BLE001 - a crash is a wrong run
        return "raised " + one_line(error, part="first", with_type=True)
    return None


def run_cases(payload: dict[str, Any]) -> dict[str, str | None]:
    """The cases of each TP size on a DP=1 x TP mesh; where the launch has more ranks than a case's
    TP size, its copies (``rep``) take turns, so TP=1 cases share a TP=2 launch at no extra cost.
    Returns the results of the cases this rank ran."""
    world, rank = dist.get_world_size(), dist.get_rank()
    meshes = {}
    results: dict[str, str | None] = {}
    turn: dict[int, int] = {}
    for case in payload["cases"]:
        tp_size = case["tp_size"]
        if tp_size not in meshes:
            meshes[tp_size] = init_device_mesh(
                "cpu", (world // tp_size, 1, tp_size), mesh_dim_names=("rep", "dp", "tp")
            )
        copies = world // tp_size
        mine = turn.get(tp_size, 0) % copies == rank // tp_size
        turn[tp_size] = turn.get(tp_size, 0) + 1
        if not mine:
            continue
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")
            results[case["id"]] = run_case(case, meshes[tp_size])
    return results

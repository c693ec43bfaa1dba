"""Worker side of tests/test_peak.py: the peak of one training step tracked on real tensors (gloo).

Each case builds a small model from its config on every rank (real weights, fp32), parallelizes it
as ``plangen cost --peak`` does (plan, activation checkpointing, FSDP2) on a DP 2 x TP 2 mesh, and
runs :func:`plangen.cost.peak.track_step`, the same step and tracker the prediction traces with fake
tensors; each rank reports each phase's peak and its process's peak RSS (a cross-check).
"""

from __future__ import annotations

import copy
import resource
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh


def run_peak_case(case: dict[str, Any], dp_mesh, tp_mesh) -> dict[str, Any]:
    from transformers import AutoConfig

    from plangen.cost.choices import resolve_plan_choice
    from plangen.cost.peak import _parallelize, track_step
    from plangen.cost.settings import build_cost_settings
    from plangen.models import resolve_model_class

    values = copy.deepcopy(case["config"])
    values.pop("architectures", None)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    settings = build_cost_settings(
        tp_size=tp_mesh.size(), dp_size=dp_mesh.size(), seq_len=case["seq_len"], micro_batch=case["batch"],
        sequence_parallel=case["sp"],
    )
    torch.manual_seed(0)
    model = resolve_model_class(config)._from_config(config, dtype=torch.float32)
    choice = resolve_plan_choice("default", model, settings.sequence_parallel)
    model = _parallelize(model, choice, settings, case["ac"], dp_mesh, tp_mesh)
    model.train()
    peaks = track_step(model, settings.micro_batch, settings.seq_len, config.vocab_size)
    return {
        "phases": {p: {"total": v.breakdown.total, **dict(v.breakdown.items())} for p, v in peaks.items()},
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def run_peak_cases(cases: list[dict[str, Any]]) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    results: dict[str, Any] = {}
    for case in cases:
        try:
            results[case["name"]] = run_peak_case(case, mesh["dp"], mesh["tp"])
        except Exception as err:  # per case: one broken case must not hide the others
            import traceback

            results[case["name"]] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-3000:]}
    return results

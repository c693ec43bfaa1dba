"""``plangen cost --peak`` against the same step on real tensors: small models at DP 2 x TP 2 (gloo).

The cases (a small Llama, Qwen3 and Qwen3-MoE, sequence parallel off and on, activation
checkpointing off and on) are traced with fake tensors on the fake process group
(:func:`predict_cases`) and run for real on 4 gloo processes through the same step and tracker
(:func:`measure_cases`, worker :func:`run_peak_cases`); :func:`compare_phase` sets one beside the
other. ``tests/test_peak.py`` asserts on them and ``benchmarks/peak_memory.py`` tabulates them
(``docs/benchmarks.md``), so both hold the same cases.

Mixture of experts: the trace has no routing (fake tensors have no values). It needs none:
transformers' experts kernels (``grouped_mm``, the default, and ``batched_mm``) size every tensor by
the top-k slots (tokens x k, on every TP rank, the slots of other ranks' experts included as masked
sentinels), never by the tokens an expert gets. The real run checks that with the model's own random
router (routes spread over both TP ranks) and with a router of zero weights (every logit equal: every
route goes to the same top-k experts, all on one TP rank); the share of routes each TP rank's experts
got is recorded outside the tracker, so that counting them costs the measured step nothing.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

TP_SIZE, DP_SIZE = 2, 2
BATCH, SEQ = 2, 128  # per DP rank
# Small enough for gloo in seconds, large enough that activations and weights are both megabytes.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
# Qwen3-30B-A3B's layout in small: every layer MoE, 8 experts top-2 (4 whole experts per TP rank).
QWEN3_MOE = {
    **{k: v for k, v in QWEN3.items() if k != "intermediate_size"},
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
MODELS = {"llama": LLAMA, "qwen3": QWEN3, "qwen3_moe": QWEN3_MOE}
# "random": the model's own initialisation; "one-rank": router weights 0, every route to one TP rank's experts.
ROUTINGS = ("random", "one-rank")


def _case(model: str, sp: bool, ac: bool, routing: str = "random") -> dict[str, Any]:
    name = f"{model}{'-sp' if sp else ''}{'-ac' if ac else ''}{'-one-rank' if routing != 'random' else ''}"
    return {
        "name": name,
        "model": model,
        "config": MODELS[model],
        "sp": sp,
        "ac": ac,
        "routing": routing,
        "batch": BATCH,
        "seq_len": SEQ,
    }


CASES = [_case(model, sp, ac) for model in MODELS for sp in (False, True) for ac in (False, True)]
# The same prediction, the other extreme of routing: what the trace cannot know must not matter.
CASES.append(_case("qwen3_moe", False, False, "one-rank"))


def prediction_key(case: dict[str, Any]) -> tuple:
    """Cases the trace cannot tell apart (they differ in routing only) share one prediction."""
    return case["model"], case["sp"], case["ac"]


def write_configs(folder: Path) -> dict[str, Path]:
    """Each model's config.json in ``folder`` (what ``plangen cost`` reads)."""
    paths = {}
    for name, values in MODELS.items():
        paths[name] = Path(folder) / f"{name}.json"
        paths[name].write_text(json.dumps(values))
    return paths


def predict_cases(cases: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """Each case's :class:`plangen.cost.peak.PeakReport`, traced with fake tensors (rank 0), by name.

    Needs the process's fake group (:func:`plangen.distributed.fake_group.fake_process_group`) or none."""
    from plangen.cost.peak import measure_peak

    paths = write_configs(folder)
    traced: dict[tuple, Any] = {}
    for case in cases:
        key = prediction_key(case)
        if key not in traced:
            traced[key] = measure_peak(
                str(paths[case["model"]]),
                tp_size=TP_SIZE,
                dp_size=DP_SIZE,
                seq_len=case["seq_len"],
                micro_batch=case["batch"],
                sequence_parallel=case["sp"],
                activation_checkpointing=case["ac"],
            )
    return {case["name"]: traced[prediction_key(case)] for case in cases}


def measure_cases(cases: list[dict[str, Any]], timeout: float = 300.0) -> list[dict[str, Any]]:
    """Every case run for real on DP 2 x TP 2 gloo processes (one launch): per rank, per case, each
    phase's peak by kind (or ``error`` and ``trace``)."""
    from plangen.distributed.launch import run_distributed

    return run_distributed("plangen.cost.validate:run_peak_cases", TP_SIZE * DP_SIZE, cases, timeout=timeout)


@dataclass(frozen=True)
class PhaseComparison:
    phase: str
    predicted: int  # bytes, rank 0's trace
    measured: tuple[int, ...]  # bytes, each rank's
    differing: tuple[str, ...]  # kinds that are not byte for byte the prediction on some rank

    @property
    def error(self) -> float:
        """The largest |measured - predicted| / measured over the ranks."""
        return max(abs(m - self.predicted) / m for m in self.measured)


def held_by_gloo(got: dict[str, Any]) -> set[int]:
    """Bytes a real rank may hold at a moment beyond what the trace holds then: the tensors of a
    collective's work that gloo had not yet released. gloo's worker thread keeps a work, and with it
    the tensors the collective was handed, until the end of its loop iteration, a moment after the
    caller's wait has returned; on a busy machine the thread is descheduled in between and the rank's
    tracker still counts them when the trace (fake tensors, no threads) has freed them. The real run
    records what each collective's work holds in each phase (``held``: its inputs, its outputs, both;
    plangen.cost.peak._collective_holds): one work, or two at once (each process group has two worker
    threads). Measured: the loss's per-token statistics (1 or 2 KiB), an SP all-gather's input and
    output (+96 KiB activations, forward of the small Qwen3-MoE with SP). Timing, which a trace cannot see."""
    one = set(got.get("held", ()))
    return one | {a + b for a in one for b in one}


def kind_matches(kind: str, got: int, want: int, held: set[int]) -> bool:
    """A kind of memory as the prediction says: byte for byte; activations may be above it by exactly
    what gloo still held (:func:`held_by_gloo`); temporaries at least the predicted ones (gloo can hold
    a reduce-scatter input, a layer's unsharded gradients, of any size the step has)."""
    if kind == "temporary":
        return got >= want
    return got == want or (kind == "activations" and got - want in held)


def gathered_early(got: dict[str, int], want: dict[str, int]) -> bool:
    """A rank whose peak is another moment than the trace's, one where FSDP2's next all-gather
    already holds its buffer: gloo finishes the prefetch sooner or later than the trace orders it,
    so the rank's highest moment has more gathered and fewer activations, its total at most the
    extra buffer above the trace's (measured once in a few launches: +243 KiB gathered, -205 KiB
    activations, +38 KiB in all, forward of the small Qwen3-MoE). Timing, which a trace cannot see."""
    extra = got["gathered"] - want["gathered"]
    return extra > 0 and 0 <= got["total"] - want["total"] <= extra


def peaked_while_held(got: dict[str, Any], want: dict[str, int]) -> bool:
    """A rank whose highest moment is another than the trace's because gloo still held a work's
    tensors then: that moment's total is the trace's total at it (at most the trace's peak) plus
    what gloo held, so the rank's peak is above the trace's by more than 0 and at most that holding
    (:func:`held_by_gloo`), and its kinds are another moment's (the CI run of a fresh clone: backward
    of the small Qwen3 with SP and checkpointing, fewer temporaries and other activations than the
    trace's moment). Any total outside that bound is a difference."""
    excess = got["total"] - want["total"]
    # What no moment of a phase changes stays exact: the sharded parameters and the optimizer states;
    # another moment differs in more than one kind (one kind off alone is a wrong prediction).
    steady = all(got[k] == want[k] for k in ("parameters", "optimizer"))
    moved = sum(got[k] != want[k] for k in want if k != "total") >= 2
    return steady and moved and excess > 0 and any(excess <= h for h in held_by_gloo(got))


def differing_kinds(got: dict[str, Any], want: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The kinds of one rank's phase (``got``, with what gloo held in it) that are not the prediction's
    (``want``, with its ``total``), by :func:`kind_matches`; nothing where the rank's peak is another
    moment than the trace's for a reason of timing (:func:`gathered_early`, :func:`peaked_while_held`)."""
    if gathered_early(got, want) or peaked_while_held(got, want):
        return {}
    return {
        k: (got[k], v) for k, v in want.items() if k != "total" and not kind_matches(k, got[k], v, held_by_gloo(got))
    }


def compare_phase(report: Any, per_rank: list[dict[str, Any]], phase: str) -> PhaseComparison:
    """One phase of a case: the prediction beside every rank's measurement (``per_rank``: the case's
    result on each rank, as :func:`run_peak_cases` returns it)."""
    peak = next(p for p in report.phases if p.phase == phase)
    want = {"total": peak.breakdown.total, **dict(peak.breakdown.items())}
    got = [r["phases"][phase] for r in per_rank]
    wrong = set().union(*(differing_kinds(g, want) for g in got))
    differing = tuple(k for k in want if k in wrong)
    return PhaseComparison(phase, peak.breakdown.total, tuple(g["total"] for g in got), differing)


# ---------------------------------------------------------------------------------------------
# Worker side (each gloo rank)


def run_peak_cases(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Every case on this rank of a DP 2 x TP 2 mesh; an error is reported per case, the others run."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (DP_SIZE, TP_SIZE), mesh_dim_names=("dp", "tp"))
    results: dict[str, Any] = {}
    for case in cases:
        try:
            results[case["name"]] = run_peak_case(case, mesh["dp"], mesh["tp"])
        except Exception as err:  # per case: one broken case must not hide the others
            import traceback

            results[case["name"]] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-3000:]}
    return results


def run_peak_case(
    case: dict[str, Any], dp_mesh, tp_mesh, before_step: Callable[[], None] | None = None
) -> dict[str, Any]:
    """One case: the model built from its config (real fp32 weights, the same on every rank) on the
    case's ``device`` (default CPU), parallelized as ``plangen cost --peak`` does it,
    :func:`plangen.cost.peak.track_step`'s peaks; for a mixture of experts, the experts kernel and the
    share of routes each TP rank's experts got. ``before_step`` runs once the model is parallelized,
    before the step (``benchmarks/gpu_check.py`` resets CUDA's peak statistics there: building the
    whole model first is not the step's memory)."""
    import resource

    import torch

    from plangen.cost.choices import resolve_plan_choice
    from plangen.cost.peak import parallelize_for_trace, track_step
    from plangen.cost.settings import build_cost_settings
    from plangen.model.resolve import resolve_model_class

    config = build_config(case["config"])
    settings = build_cost_settings(
        tp_size=tp_mesh.size(),
        dp_size=dp_mesh.size(),
        seq_len=case["seq_len"],
        micro_batch=case["batch"],
        sequence_parallel=case["sp"],
    )
    torch.manual_seed(0)
    with torch.device(case.get("device", "cpu")):
        model = resolve_model_class(config)._from_config(config, dtype=torch.float32)
    routers = [m for m in model.modules() if _is_router(m)]
    if case.get("routing", "random") == "one-rank":
        with torch.no_grad():
            for router in routers:
                router.weight.zero_()
    routes = [0] * tp_mesh.size()
    for router in routers:
        router.register_forward_hook(_route_counter(routes, router.num_experts // tp_mesh.size()))
    choice = resolve_plan_choice("default", model, settings.sequence_parallel)
    model = parallelize_for_trace(model, choice, settings, case["ac"], dp_mesh, tp_mesh)
    model.train()
    if before_step is not None:
        before_step()
    held: dict[str, set[int]] = {}
    peaks = track_step(model, settings.micro_batch, settings.seq_len, config.vocab_size, held=held)
    result = {
        "phases": {
            p: {"total": v.breakdown.total, **dict(v.breakdown.items()), "held": sorted(_may_hold(held, p))}
            for p, v in peaks.items()
        },
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    if routers:
        result["experts_implementation"] = config._experts_implementation
        result["route_share"] = [n / sum(routes) for n in routes]  # by TP rank whose experts took them
    return result


def build_config(values: dict[str, Any]) -> Any:
    """The transformers config of a config.json's values (``model_type`` names its class)."""
    from transformers import AutoConfig

    values = copy.deepcopy(values)
    values.pop("architectures", None)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _may_hold(held: dict[str, set[int]], phase: str) -> set[int]:
    """What gloo may still hold during ``phase``: its own collectives' works, and the previous phase's
    (a work issued at the end of forward, the loss's per-token statistics, is released by gloo's thread
    when it next runs, which on a busy machine is after backward has begun: the CI run of a fresh clone,
    +2 KiB activations at backward's peak, the loss's two 1 KiB statistics)."""
    from plangen.cost.peak import PHASES

    index = PHASES.index(phase)
    previous = held.get(PHASES[index - 1], set()) if index else set()
    return held.get(phase, set()) | previous


def _is_router(module: Any) -> bool:
    # A top-k router: a [experts, hidden] weight, top_k and num_experts (Qwen3-MoE's TopKRouter).
    weight = getattr(module, "weight", None)
    return (
        isinstance(getattr(module, "top_k", None), int)
        and isinstance(getattr(module, "num_experts", None), int)
        and weight is not None
        and weight.dim() == 2
        and weight.shape[0] == module.num_experts
    )


def _route_counter(routes: list[int], per_rank: int):
    def count(module: Any, args: Any, output: Any) -> None:
        from plangen.stack.torch_compat import no_dispatch_modes

        # Outside the memory tracker (a dispatch mode): the count allocates, the measured step must not.
        with no_dispatch_modes():
            indices = output[-1]
            indices = indices.to_local() if hasattr(indices, "to_local") else indices
            for rank, n in enumerate((indices // per_rank).flatten().bincount(minlength=len(routes)).tolist()):
                routes[rank] += n

    return count

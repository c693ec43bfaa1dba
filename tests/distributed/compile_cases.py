"""Worker side of the compile tests: each case's plan run eagerly and compiled block by block.

Both copies of the same tiny model get the same plan through ``parallelize_model`` (the compiled one
with ``compile=True``), run one forward and backward on the same batch (split over DP), and the
case reports the largest difference of the logits, the loss and every parameter gradient, the
graph breaks and graphs dynamo counted, and both runs' collectives (``CollectiveCounter``).
"""

from __future__ import annotations

import copy
import sys
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import set_checkpoint_early_stop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import BATCH, SEQ, build_case_model, build_case_plan, build_meshes, result_or_error, share_copies  # noqa: E402

from plangen.model.module_tree import find_transformer_layers  # noqa: E402
from plangen.runtime.compile import eager_modules  # noqa: E402
from plangen.check.run import full_parameter, full_tensor, next_token_loss  # noqa: E402
from plangen.distributed.comm import CollectiveCounter, merge_c10d_counts  # noqa: E402,F401 - eager counts, for the profiler's check
from plangen.model.resolve import text_config  # noqa: E402
from plangen.parallelize import parallelize_model  # noqa: E402


# The profiler's op names (functional collectives, their in-place forms in compiled code, c10d's)
# as CollectiveCounter names them. A dispatch mode (CollectiveCounter's) stops dynamo from compiling
# anything; the profiler sees the collectives of compiled code and of eager code alike.
PROFILED = {
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather_into_tensor",
    "allgather": "all_gather",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "broadcast": "broadcast",
}


@contextmanager
def count_collectives():
    """``with count_collectives() as counts:`` the collectives run inside, by name, once done."""
    from torch.profiler import ProfilerActivity, profile

    counts: Counter[str] = Counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield counts
    for event in prof.events():
        name = _collective(event.name)
        parent = event.cpu_parent
        while (
            parent is not None and name is not None
        ):  # one collective, counted once: not c10d's under a functional one
            # nor one traced while compiling (a recompile in the counted step: AOTAutograd traces the
            # backward on fake tensors, which the profiler records as collectives that never ran)
            name = None if _collective(parent.name) or parent.name.endswith("(dynamo_timed)") else name
            parent = parent.cpu_parent
        if name is not None:
            counts[name] += 1


def _collective(event_name: str) -> str | None:
    namespace, _, op = event_name.partition("::")
    if namespace not in ("_c10d_functional", "c10d", "_c10d_functional_autograd"):
        return None
    op = op[:-1] if op.endswith("_") else op  # all_reduce_ (in place, compiled) is an all_reduce
    op = PROFILED.get(op, op)
    return op if op in COLLECTIVES else None


COLLECTIVES = {
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather",
    "broadcast",
    "all_to_all_single",
    "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_reduce_coalesced",
}


def run_compile_case(case: dict[str, Any], dp_mesh, tp_mesh) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # every case compiles its own graphs: counted alone, no recompile limit across cases
    model = build_case_model(case)
    for key, value in case.get("config", {}).items():
        setattr(model.config, key, value)
    if case.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=case["lora"], lora_dropout=0.0))
    ids = torch.randint(
        0, text_config(model.config).vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)
    )
    dp_group = dp_mesh.get_group()
    dp = dp_mesh.size()
    rows = slice(dist.get_rank(dp_group) * BATCH // dp, (dist.get_rank(dp_group) + 1) * BATCH // dp)
    runs: dict[str, Any] = {}
    # Layers compiled around eager experts (transformers 5.5/5.8: plangen.runtime.compile.eager_modules).
    layers = find_transformer_layers(model)  # model.model.layers; Mamba's backbone.layers
    eager_experts = eager_modules(layers)
    layers_in_pieces = sum(any(m in eager_experts for m in layer.modules()) for layer in layers)
    # With activation checkpointing, a compiled layer's forward is one autograd node: backward's
    # recomputation reruns all of it, where eager's stops after the last tensor backward needs
    # (non-reentrant checkpoint's early stop), before the layer's last collective. "eager-whole"
    # recomputes whole layers eagerly: the collectives the compiled run must match.
    modes = ("eager", "compiled", "eager-whole") if case.get("ac") else ("eager", "compiled")
    for mode in modes:
        counters.clear()
        copy_ = copy.deepcopy(model)
        sharded = parallelize_model(
            copy_,
            dp_mesh,
            tp_mesh,
            torch.float32,
            sequence_parallel=case.get("sp", False),
            activation_checkpointing=case.get("ac", False),
            custom_parallel_plan=build_case_plan(case, copy_),
            plan_variant=case.get("variant", "optimized"),
            compile=mode == "compiled",
        )
        early_stop = partial(set_checkpoint_early_stop, False) if mode == "eager-whole" else nullcontext
        started = time.process_time()
        with early_stop():
            logits = sharded(input_ids=ids[rows]).logits
        next_token_loss(logits, ids[rows]).backward()  # compiles; counted: the second step
        compile_cpu = time.process_time() - started
        first_graphs = counters["stats"].get("unique_graphs", 0)
        sharded.zero_grad(set_to_none=True)
        started = time.process_time()
        with count_collectives() as forward, early_stop():
            logits = sharded(input_ids=ids[rows]).logits
        loss = next_token_loss(logits, ids[rows])
        with count_collectives() as backward:
            loss.backward()
        runs[mode] = dict(
            logits=full_tensor(logits).detach(),
            loss=loss.item(),
            cpu=time.process_time() - started,
            first=compile_cpu,
            grads={n: full_parameter(sharded, n, p.grad) for n, p in sharded.named_parameters() if p.grad is not None},
            forward=dict(forward),
            backward=dict(backward),
            graph_breaks=sum(counters["graph_break"].values()),
            graphs=counters["stats"].get("unique_graphs", 0),
            recompiled=counters["stats"].get("unique_graphs", 0) - first_graphs,  # graphs the counted step added
        )
    eager, compiled = runs["eager"], runs["compiled"]
    grad_diffs = {
        n: (compiled["grads"][n] - g).abs().max().item() for n, g in eager["grads"].items() if n in compiled["grads"]
    }
    worst = max(grad_diffs, key=grad_diffs.get) if grad_diffs else None
    return {
        "logits": (compiled["logits"] - eager["logits"]).abs().max().item(),
        "loss": abs(compiled["loss"] - eager["loss"]),
        "grad": grad_diffs[worst] if worst else None,
        "worst_grad": worst,
        "grads": len(grad_diffs),
        "missing_grads": sorted(set(eager["grads"]) ^ set(compiled["grads"])),
        "graph_breaks": compiled["graph_breaks"],
        "graphs": compiled["graphs"],
        "recompiled": compiled["recompiled"],
        "collectives": {mode: [run["forward"], run["backward"]] for mode, run in runs.items()},
        "layers_in_pieces": layers_in_pieces,
        "cpu_seconds": {mode: [round(run["first"], 2), round(run["cpu"], 2)] for mode, run in runs.items()},
    }


def run_compile_cases(payload: dict[str, Any]) -> dict[str, Any]:
    """Every case's result, by ``mesh/name`` (``tp2``: the two copies of TP 2 take turns)."""
    results: dict[str, Any] = {}
    mesh_size: dict[str, int] = {}
    for mesh_kind, cases in payload.items():
        dp_mesh, tp_mesh = build_meshes(mesh_kind)
        size = mesh_size[mesh_kind] = dp_mesh.size() * tp_mesh.size()
        copies, copy_index = dist.get_world_size() // size, dist.get_rank() // size
        for index, case in enumerate(cases):
            if index % copies == copy_index:
                results[f"{mesh_kind}/{case['name']}"] = result_or_error(run_compile_case, case, dp_mesh, tp_mesh)
    return share_copies(results, mesh_size)

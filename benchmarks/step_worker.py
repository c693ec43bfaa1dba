"""One rank of benchmark 2/3: train steps of a small Llama under plangen or under transformers' own TP + FSDP2.

Run by :func:`plangen.distributed.launch.run_distributed` (4 gloo ranks, DP 2 x TP 2, TP the inner dimension in
both layouts). Both variants load the same saved weights and see the same batch; they differ only
in who parallelizes the model:

* ``plangen``: ``from_pretrained(dir)`` then :func:`plangen.parallelize.parallelize_model` (its
  optimized plan; logits stay sharded on the vocabulary, loss :func:`plangen.loss.vocab_parallel_cross_entropy`);
* ``hf``: ``from_pretrained(dir, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))``
  (its Hugging Face plan gathers the logits; loss ``F.cross_entropy``).

Each rank returns its step times (between barriers, so a step counts when every rank is done),
the CPU time it spent on each step (its own work, ``time.process_time``, which other jobs on a
shared machine do not inflate as they do the wall time), its losses, and its peak resident memory
above what it held before building the model.
"""

from __future__ import annotations

import os
import time
from typing import Any

# Imported here, before the launcher forks, so that neither variant pays an import inside the timing
# or the memory figures.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

from plangen.loss import vocab_parallel_cross_entropy
from plangen.parallelize import parallelize_model

DP, TP = 2, 2
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_resident() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def build_model(variant: str, weights: str, sequence_parallel: bool) -> torch.nn.Module:
    if variant == "hf":
        config = DistributedConfig(tp_size=TP, fsdp_size=DP)
        return AutoModelForCausalLM.from_pretrained(weights, distributed_config=config, dtype=torch.float32)
    if variant in ("plangen", "compiled"):  # compiled: each decoder layer compiled (benchmarks/compile_time.py)
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
        return parallelize_model(
            model,
            mesh["dp"],
            mesh["tp"],
            torch.float32,
            sequence_parallel=sequence_parallel,
            compile=variant == "compiled",
        )
    raise ValueError(f"unknown variant {variant!r}")


def step_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(logits, DTensor):  # plangen: sharded on the vocabulary
        return vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:])
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def run_steps(payload: dict[str, Any]) -> dict[str, Any]:
    if dist.get_world_size() != DP * TP:
        raise RuntimeError(f"run with {DP * TP} ranks, not {dist.get_world_size()}")
    baseline = resident_bytes()
    reset_peak_resident()
    model = build_model(payload["variant"], payload["weights"], payload.get("sequence_parallel", False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp_rank = dist.get_rank() // TP  # TP is the inner mesh dimension in both layouts
    generator = torch.Generator().manual_seed(1000 + dp_rank)
    ids = torch.randint(0, model.config.vocab_size, (payload["batch"], payload["seq"]), generator=generator)

    times, cpu_times, losses, first = [], [], [], None
    for step in range(payload["warmup"] + payload["steps"]):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step_loss(model(input_ids=ids).logits, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        cpu = time.process_time() - cpu_start  # this rank's own work, not the barrier's wait for the others
        dist.barrier()
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        first = elapsed if first is None else first  # the first step's: a compiled variant compiles in it
        if step >= payload["warmup"]:
            times.append(elapsed)
            cpu_times.append(cpu)
    return {
        "times": times,
        "cpu_times": cpu_times,
        "losses": losses,
        "first_step": first,
        "peak_bytes": peak_resident_bytes() - baseline,
    }

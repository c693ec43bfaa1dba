"""Worker of tests/test_launch_stress.py: torch alone, no plangen. Async functional collectives on one
gloo group, several in flight at once, tiny tensors, waited in varying order (what DTensor and the TP
styles' async outputs do), ``iters`` times. Issue 35: one run of 20 (20 000 iterations each, 2 cores
under load) lost rank 3 to a SIGSEGV while its main thread was in ``funcol.reduce_scatter_tensor``,
as the synthesized-plans launch lost a rank inside gloo's worker thread: the heap corruption needs
nothing of plangen.

The cause (plangen.distributed.launch.gloo_worker_threads): the group's two gloo worker threads both write its
status string after each collective, unlocked; ``all_gather_tensor``'s op name
(``ALLGATHER_COALESCED``) is long enough to live on the heap, so one thread frees the buffer the
other writes "ALLREDUCE" into. Under AddressSanitizer (LD_PRELOAD) 3 launches of 5 000 iterations
in 9 report it on torch 2.13, 1 in 5 on 2.15 (2.11: 0 in 5, but 2 in 6 with all_reduce_coalesced in
the mix); with one worker thread a group, none in 5 on each."""

from __future__ import annotations

import time
from typing import Any


def main(payload: dict[str, Any]) -> list[float]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]
    generator = torch.Generator().manual_seed(dist.get_rank())
    started = time.time()
    total = 0.0
    for i in range(payload.get("iters", 20_000)):
        n = 1 + i % 7
        x = torch.randn(2 * n, 3, generator=generator)
        a = funcol.reduce_scatter_tensor(x, "sum", 0, tp)  # gloo: an all-reduce of a copy, the copy-out in wait
        b = funcol.all_gather_tensor(x[:n], 0, tp)
        c = funcol.all_reduce(x[0], "sum", tp)
        d = funcol.all_to_all_single(x, None, None, tp)
        order = [(a + 1).sum(), b.sum(), c.sum(), d.sum()]
        total = float(sum(order[i % 4 :] + order[: i % 4]))
        del a, b, c, d, x
        if i % 500 == 0:
            dist.barrier()
    return [time.time() - started, total]

"""A single-process fake process group: tensor parallelism at any size in one process, for shapes.

torch's ``fake`` backend answers every collective without moving data, so a plan can be applied and
a step traced at TP 8 (or a whole TP x DP layout) in one CPU process: level 2's fake run of
``plangen verify`` (PG215), ``plangen cost``'s measurements and peak traces, and ``plangen list``'s
sharded share all run on it. It sits below :mod:`plangen.check` and :mod:`plangen.cost`, which both
use it.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from plangen.stack.torch_compat import (
    fake_group_reduce_scatters_this_ranks_chunk,
    fake_group_scatters_this_ranks_chunk,
    reduce_scatter,
)

# Ranks of the process's one fake group (TP x DP of any layout plangen measures fits in it).
FAKE_WORLD_SIZE = 64


class FakeGroupError(ValueError):
    """Another process group is running, or the running fake group is too small."""


@contextmanager
def fake_process_group(world_size: int, error: type[Exception] = FakeGroupError) -> Iterator[None]:
    """A fake process group of at least ``world_size`` ranks: the one running, or the process's own,
    made with ``max(world_size, FAKE_WORLD_SIZE)`` ranks and left running. ``error``: the exception
    a caller reports in its own terms when neither can be had (``plangen cost``'s one-line error).

    Never destroyed and made again: DTensor keeps the meshes of its sharding decisions, so after a
    group is destroyed and another made at another size, a later sequence-parallel step in the same
    process gathers over the old group's ranks (seen in the test run: level 2's fake run of every SP
    plan failed after a cost measurement had made and destroyed a group of its own).
    """
    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise error(
                f"a {dist.get_backend()} process group is running: this needs a process without one "
                "(it runs on a single-process fake group)"
            )
        if dist.get_world_size() < world_size:
            raise error(f"the running fake process group has {dist.get_world_size()} ranks, TP needs {world_size}")
        scatters_give_each_rank_its_chunk()
        yield
        return
    dist.init_process_group("fake", rank=0, world_size=max(world_size, FAKE_WORLD_SIZE))
    scatters_give_each_rank_its_chunk()
    yield


def scatters_give_each_rank_its_chunk() -> None:
    """Where the installed torch's fake group leaves a scatter's or a reduce-scatter's output
    unwritten (torch 2.11; 2.13 on copy this rank's chunk), a value computed on the fake group reads
    garbage: ``distribute_tensor`` of a sharded placement would not give the unsharded module's
    slices, and a gradient reduce-scattered (a sharded norm's under SP, FSDP2's) would be memory never
    written (the GPU check's bf16 and compile sections met NaN). Both are made to give this rank its
    chunk on fake groups, as 2.13's fake group does; other groups are untouched. Once per process."""
    global _SCATTERS_CHECKED
    if _SCATTERS_CHECKED:
        return
    _SCATTERS_CHECKED = True
    world = dist.get_world_size()
    probe = torch.full((1,), -1.0)
    dist.scatter(probe, [torch.zeros(1)] * world, src=0)
    if probe.item() != 0.0:
        fake_group_scatters_this_ranks_chunk()
    probe = torch.full((1,), -1.0)
    reduce_scatter(probe, torch.zeros(world))
    if probe.item() != 0.0:
        fake_group_reduce_scatters_this_ranks_chunk()


_SCATTERS_CHECKED = False


def tp_mesh(tp_size: int):
    """A 1-D CPU mesh of the fake group's first ``tp_size`` ranks."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(tp_size))


@contextmanager
def quiet_partial_matches() -> Iterator[None]:
    """Silence torch's warning for a plan key that matches in some layers only (hybrid stacks).

    The runtime's check already refuses keys that match no module at all.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Parallelize plan key .* could not be resolved")
        yield


@contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Keep torch's fake-tensor logger from printing a traceback for an op that fails: the failure
    is the plan's, and it is reported once, on one line by the caller."""
    from plangen.stack.torch_compat import FAKE_TENSOR_LOGGER

    logger = logging.getLogger(FAKE_TENSOR_LOGGER)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)

"""plangen.launch: results in rank order, and a rank that dies says how."""

from __future__ import annotations

import os
import signal

import pytest

from plangen.launch import DistributedRunError, run_distributed, start_distributed


def rank_and_payload(payload):
    import torch.distributed as dist

    return [dist.get_rank(), payload]


def rank_one_killed(payload):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a rank: no traceback
    dist.barrier()  # the others wait for it, as in a collective
    return dist.get_rank()


def test_a_background_launch_returns_each_ranks_result_in_order():
    launch = start_distributed(f"{__file__}:rank_and_payload", 2, {"x": 1}, timeout=120)
    assert launch.result() == [[0, {"x": 1}], [1, {"x": 1}]]


def test_a_rank_killed_by_a_signal_is_named_with_the_signal():
    with pytest.raises(DistributedRunError, match=r"rank1 failed:\nrank 1 was killed by signal SIGKILL \(the kernel's out-of-memory"):
        run_distributed(f"{__file__}:rank_one_killed", 2, timeout=120)

"""plangen.distributed.launch: results in rank order, and a rank that dies says how."""

from __future__ import annotations

import os
import signal
import time

import pytest

from plangen.distributed.launch import DistributedRunError, run_distributed, start_distributed


def rank_and_payload(payload):
    import torch.distributed as dist

    print("x" * 100_000, flush=True)  # more than a pipe holds (64 KiB)
    return [dist.get_rank(), payload, os.nice(0), _autogroup_nice()]


def _autogroup_nice() -> int | None:
    # Empty where the process is in a cgroup of its own (a container): autogroup does not apply there.
    try:
        with open("/proc/self/autogroup") as group:
            fields = group.read().split("nice")
    except OSError:
        return None
    return int(fields[1]) if len(fields) == 2 else None


def rank_one_killed(payload):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a rank: no traceback
    dist.barrier()  # the others wait for it, as in a collective
    return dist.get_rank()


def rank_one_aborts(payload):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.abort()  # as glibc's heap checks end a process ("malloc(): ...", then SIGABRT)
    dist.barrier()
    return dist.get_rank()


def gloo_worker_threads_of_each_group(payload):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    groups = {
        "world": dist.group.WORLD,
        "new_group": dist.new_group([0, 1]),
        "dp": mesh.get_group("dp"),
        "tp": mesh.get_group("tp"),
    }
    threads = {name: group._get_backend(torch.device("cpu")).options._threads for name, group in groups.items()}
    gathered = torch.ones(2) * dist.get_rank()
    dist.all_reduce(gathered, group=mesh.get_group("tp"))  # a collective runs on the replaced class
    return [threads, gathered.tolist()]


def test_every_gloo_group_of_a_launched_rank_runs_on_one_worker_thread_unless_asked_for_torchs_two():
    """Issue 35: torch's ProcessGroupGloo corrupts the heap when two worker threads of one group end
    collectives at once (plangen.distributed.launch.gloo_worker_threads): a launch's groups, the world's and
    those made later (a device mesh's, new_group's), get one worker thread; gloo_threads=2 is
    torch's own count (what the stress test showing torch's bug launches with)."""
    for asked, threads in ((None, 1), (2, 2)):
        kwargs = {} if asked is None else {"gloo_threads": asked}
        result = run_distributed(f"{__file__}:gloo_worker_threads_of_each_group", 2, timeout=120, **kwargs)
        names = ("world", "new_group", "dp", "tp")
        assert result == [[dict.fromkeys(names, threads), [1.0, 1.0]]] * 2


def test_a_background_launch_runs_to_its_end_unattended_and_returns_each_ranks_result_in_order():
    launch = start_distributed(f"{__file__}:rank_and_payload", 2, {"x": 1}, timeout=120, nice=5)
    # Nobody reads its output meanwhile (the tests before a launching module run): it still ends.
    deadline = time.monotonic() + 90
    while not launch.finished() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launch.finished(), "the launch blocked on its own output"
    niced = min(os.nice(0) + 5, 19)  # the ranks run at a lower priority than this process
    result = launch.result()
    assert [rank[:3] for rank in result] == [[0, {"x": 1}, niced], [1, {"x": 1}, niced]]
    # Under autogroup scheduling the ranks' session group is niced too, or the nice would not count
    # against this process's group. Whether a new session has a group is not this process's to say:
    # in CI's container this process had none and the ranks' new session had one.
    assert [rank[3] for rank in result] in ([None, None], [5, 5])


def test_a_rank_killed_by_a_signal_is_named_with_the_signal():
    with pytest.raises(
        DistributedRunError, match=r"rank1 failed:\nrank 1 was killed by signal SIGKILL \(the kernel's out-of-memory"
    ):
        run_distributed(f"{__file__}:rank_one_killed", 2, timeout=120)


def test_a_rank_killed_by_a_fatal_signal_says_where_it_was():
    """SIGABRT or SIGSEGV leave no traceback: the rank's Python stack (faulthandler) and the ranks'
    last output (glibc's own message before its abort) come with the error."""
    with pytest.raises(DistributedRunError) as raised:
        run_distributed(f"{__file__}:rank_one_aborts", 2, timeout=120)
    message = str(raised.value)
    assert "rank1 failed:\nrank 1 was killed by signal SIGABRT" in message
    assert "Fatal Python error: Aborted" in message and "in rank_one_aborts" in message


def test_a_background_command_gives_its_exit_code_and_both_streams_and_can_be_killed(tmp_path):
    import sys

    from conftest import BackgroundCommand

    script = "import os, sys; print('x' * 100_000); print('err', os.nice(0), file=sys.stderr); sys.exit(3)"
    code, out, err = BackgroundCommand([sys.executable, "-c", script], tmp_path, 60, nice=5).result()
    # Output past a pipe's size, niced by 5 more (the kernel stops at 19: a test run itself niced stays there).
    assert (code, len(out), err) == (3, 100_001, f"err {min(os.nice(0) + 5, 19)}\n")
    hung = BackgroundCommand([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 60)
    began = time.monotonic()
    hung.kill()
    assert hung._proc.poll() is not None and time.monotonic() - began < 5

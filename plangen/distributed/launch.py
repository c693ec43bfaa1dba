"""Run a function on N local processes with gloo, bounded in time, failing loudly.

A torchrun launch costs 10-25 s here, almost all of it imports in every worker. This launcher
starts one fresh interpreter, imports torch, transformers and the target once, then forks the
workers (before any torch computation, so no thread pool is forked). A worker that raises ends
the run with its rank and traceback; a run past its deadline is killed whole, never left hanging.

Target: ``"package.module:function"`` or ``"path/to/file.py:function"``; the function takes the
JSON payload and returns a JSON-serialisable result. Results come back in rank order.

Every gloo process group a rank creates (the world's, a device mesh's) runs its collectives on one
worker thread (``gloo_threads``; torch's default is two): torch's ProcessGroupGloo corrupts the heap
when two of one group's workers finish collectives at once (issue 35, :func:`gloo_worker_threads`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class DistributedRunError(RuntimeError):
    """A worker failed or the run exceeded its deadline."""


GLOO_THREADS = 1
"""Worker threads of each gloo process group in a launched rank (torch's own default: 2; issue 35)."""


def run_distributed(
    target: str,
    world_size: int,
    payload: Any = None,
    timeout: float = 300.0,
    *,
    python: str | None = None,
    gloo_threads: int = GLOO_THREADS,
) -> list[Any]:
    """Run ``target(payload)`` on ``world_size`` gloo ranks; return each rank's result."""
    return start_distributed(target, world_size, payload, timeout, python=python, gloo_threads=gloo_threads).result()


def start_distributed(
    target: str,
    world_size: int,
    payload: Any = None,
    timeout: float = 300.0,
    *,
    nice: int = 0,
    python: str | None = None,
    gloo_threads: int = GLOO_THREADS,
) -> "Launch":
    """Start ``target(payload)`` on ``world_size`` gloo ranks in the background; ``result()`` waits.

    ``nice`` lowers the ranks' priority: work in the foreground keeps its core, the ranks take the rest.
    ``python``: the interpreter the ranks run in (default: this one); plangen must import there.
    ``gloo_threads``: worker threads of each gloo process group in the ranks (:func:`gloo_worker_threads`;
    2 is torch's own default, which issue 35's heap corruption needs)."""
    return Launch(target, world_size, payload, timeout, nice=nice, python=python, gloo_threads=gloo_threads)


def gloo_worker_threads(threads: int) -> None:
    """Make every gloo process group this process creates from now on run on ``threads`` worker threads.

    torch's ProcessGroupGloo (2.11 to 2.15 at least) runs a group's collectives on two worker threads,
    and each, after a collective, writes the group's status (``pgStatus_->lastCompletedWorkName =
    opTypeToString(...)``, a std::string) in ``ProcessGroupGloo::runLoop`` outside any lock. A name
    longer than 15 characters (``ALLGATHER_COALESCED``: every ``funcol.all_gather_tensor``, DTensor's
    all-gathers; ``ALLREDUCE_COALESCED``) lives on the heap: when the other worker finishes a
    collective at the same moment, one thread frees the buffer the other is writing ("ALLREDUCE",
    9 bytes, into a freed 20-byte chunk, as AddressSanitizer reports it), and glibc aborts later on
    "malloc(): unaligned tcache chunk detected", or a thread segfaults (issue 35). With one worker
    thread nothing races there; the group's collectives then run one at a time, in issue order
    (the synthesized-plans launch took 45 s against 44 s on a quiet 2-core machine; a loop of many
    tiny async collectives in flight at once takes about twice as long).

    torch takes no thread count for gloo groups it creates (``init_process_group``, ``new_group``,
    a device mesh's): this replaces the class ``torch.distributed.distributed_c10d`` builds them from
    by a subclass that passes ``threads`` in the options torch would build (the same device, timeout
    and, on 2.15, ``enable_reconfigure``). Called again, the last count wins."""
    import torch.distributed.distributed_c10d as c10d

    gloo = getattr(c10d.ProcessGroupGloo, "_plangen_torch_class", c10d.ProcessGroupGloo)

    class ProcessGroupGloo(gloo):
        _plangen_torch_class = gloo

        def __init__(self, store, rank, size, timeout=None, **kwargs):
            options = gloo._Options()
            if any(not hasattr(options, key) for key in kwargs):  # an argument this torch's options lack
                super().__init__(store, rank, size, **({} if timeout is None else {"timeout": timeout}), **kwargs)
                return
            interfaces = os.environ.get("GLOO_SOCKET_IFNAME")  # what torch's own constructor reads
            options._devices = (
                [gloo.create_device(interface=name) for name in interfaces.split(",")]
                if interfaces
                else [gloo.create_default_device()]
            )
            options._threads = threads
            if timeout is not None:
                options._timeout = timeout
            for key, value in kwargs.items():
                setattr(options, key, value)
            super().__init__(store, rank, size, options)

    ProcessGroupGloo.__module__ = gloo.__module__
    c10d.ProcessGroupGloo = ProcessGroupGloo


def lower_priority(nice: int) -> None:
    """Lower this (new session's) process's priority by ``nice``, its children's with it.

    With the kernel's autogroup scheduling (Linux's default on desktops and here) every session is
    a group that gets a fair share whatever its processes' nice values: a new session's own nice
    only ranks its processes among themselves. Its group's nice (``/proc/self/autogroup``) ranks it
    against the others: without it, niced ranks in a new session take as much as the caller."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(min(nice, 19)))
    except OSError:  # no autogroup (disabled, or not Linux): the process's nice is all there is
        pass


class Launch:
    """A run on gloo ranks, started at construction; ``result()`` is each rank's result, in order."""

    def __init__(
        self,
        target: str,
        world_size: int,
        payload: Any,
        timeout: float,
        *,
        nice: int = 0,
        python: str | None = None,
        gloo_threads: int = GLOO_THREADS,
    ) -> None:
        self.target, self.world_size, self.timeout = target, world_size, timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="plangen-run-")
        self._out = Path(self._tmp.name)
        (self._out / "payload.json").write_text(json.dumps(payload))
        cmd = [
            python or sys.executable,
            "-m",
            "plangen.distributed.launch",
            target,
            str(world_size),
            str(self._out),
            str(timeout),
            str(gloo_threads),
        ]
        self._deadline = time.monotonic() + timeout + 30  # the launcher's own deadline comes first
        # The ranks' output goes to a file: a pipe nobody reads until result() would fill and block them.
        self._log = open(self._out / "launch.log", "w+")
        self._proc = subprocess.Popen(
            cmd,
            start_new_session=True,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=(lambda: lower_priority(nice)) if nice else None,
        )

    def finished(self) -> bool:
        return self._proc.poll() is not None

    def result(self) -> list[Any]:
        try:
            return self._collect()
        finally:
            self._log.close()
            self._tmp.cleanup()

    def kill(self) -> None:
        """End the run whole (a launch nobody waits for must not outlive its caller)."""
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._log.close()
        self._tmp.cleanup()

    def _collect(self) -> list[Any]:
        target, out, proc = self.target, self._out, self._proc
        try:
            proc.wait(timeout=max(self._deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise DistributedRunError(f"{target}: no result after {self.timeout:.0f} s; all ranks killed") from None
        self._log.seek(0)
        log = self._log.read()
        # A killed rank first: the others' errors (a peer's connection reset) follow from it.
        errors = sorted(out.glob("rank*.killed")) + sorted(out.glob("rank*.err"))
        if errors:
            first = errors[0]
            # A signal's own message (glibc's "malloc(): ..." before its SIGABRT) is in the ranks' log.
            tail = f"\nthe ranks' output ends:\n{log[-2000:]}" if first.suffix == ".killed" and log else ""
            raise DistributedRunError(f"{target}: {first.stem} failed:\n{first.read_text()}{tail}")
        if proc.returncode != 0:
            raise DistributedRunError(f"{target}: launcher exited with {proc.returncode}:\n{log[-4000:]}")
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(self.world_size)]


def _import_target(target: str):
    import importlib
    import importlib.util

    location, _, name = target.rpartition(":")
    if location.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(location).stem, location)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    return getattr(module, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, rank: int, world_size: int, port: int, out: Path, payload: Any, gloo_threads: int) -> None:
    import traceback

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    code = 0
    # A fatal signal (SIGSEGV, SIGABRT from glibc's heap checks) leaves no traceback to write: the
    # rank's Python stacks, every thread's, go to its own file, which the run's error then quotes.
    import faulthandler

    fault = open(out / f"rank{rank}.fault", "w")
    faulthandler.enable(file=fault, all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        # Several ranks share few cores: one thread each avoids oversubscription.
        torch.set_num_threads(1)
        gloo_worker_threads(gloo_threads)  # before any group is made (issue 35)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(payload)
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report every failure, whatever it is
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _note_signal(out: Path, rank: int | None, code: int) -> None:
    if rank is not None and os.WIFSIGNALED(code):  # no traceback to write: say how it ended
        number = os.WTERMSIG(code)
        hint = " (the kernel's out-of-memory killer sends this)" if number == signal.SIGKILL else ""
        note = f"rank {rank} was killed by signal {signal.Signals(number).name}{hint}\n"
        fault = out / f"rank{rank}.fault"
        if fault.exists() and fault.stat().st_size:  # its threads' Python stacks (faulthandler)
            note += fault.read_text()[-6000:]
        (out / f"rank{rank}.killed").write_text(note)


def _main(target: str, world_size: int, out: Path, timeout: float, gloo_threads: int = GLOO_THREADS) -> int:
    import torch  # noqa: F401 - imported once here, shared by every forked worker
    import transformers  # noqa: F401
    import transformers.modeling_utils  # noqa: F401 - what building any model imports first (~1 s a rank)

    fn = _import_target(target)
    payload = json.loads((out / "payload.json").read_text())
    port = _free_port()
    pids = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _worker(fn, rank, world_size, port, out, payload, gloo_threads)
        pids[pid] = rank
    deadline = time.monotonic() + timeout
    status = 0
    while pids:
        pid, code = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                status = 124
                break
            time.sleep(0.05)
            continue
        rank = pids.pop(pid, None)
        _note_signal(out, rank, code)
        if code != 0:
            # A rank that died of a signal makes its peers fail a moment later: reap what has ended
            # by then, so the one that died first is named (its peers' errors follow from it).
            time.sleep(0.5)
            while pids and (ended := os.waitpid(-1, os.WNOHANG))[0]:
                _note_signal(out, pids.pop(ended[0], None), ended[1])
            status = 1
            break
    for pid in pids:  # a failed or late rank would leave the others blocked in a collective
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if status == 124:
        (out / "rank-timeout.err").write_text(f"ranks {sorted(pids.values())} still running after {timeout:.0f} s\n")
    return status


if __name__ == "__main__":
    sys.exit(
        _main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), *(int(n) for n in sys.argv[5:6]))
    )

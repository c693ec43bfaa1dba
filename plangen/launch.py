"""Run a function on N local processes with gloo, bounded in time, failing loudly.

A torchrun launch costs 10-25 s here, almost all of it imports in every worker. This launcher
starts one fresh interpreter, imports torch, transformers and the target once, then forks the
workers (before any torch computation, so no thread pool is forked). A worker that raises ends
the run with its rank and traceback; a run past its deadline is killed whole, never left hanging.

Target: ``"package.module:function"`` or ``"path/to/file.py:function"``; the function takes the
JSON payload and returns a JSON-serialisable result. Results come back in rank order.
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


def run_distributed(target: str, world_size: int, payload: Any = None, timeout: float = 300.0) -> list[Any]:
    """Run ``target(payload)`` on ``world_size`` gloo ranks; return each rank's result."""
    with tempfile.TemporaryDirectory(prefix="plangen-run-") as tmp:
        out = Path(tmp)
        (out / "payload.json").write_text(json.dumps(payload))
        cmd = [sys.executable, "-m", "plangen.launch", target, str(world_size), str(out), str(timeout)]
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            log, _ = proc.communicate(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            raise DistributedRunError(f"{target}: no result after {timeout:.0f} s; all ranks killed") from None
        errors = sorted(out.glob("rank*.err"))
        if errors:
            first = errors[0]
            raise DistributedRunError(f"{target}: {first.stem} failed:\n{first.read_text()}")
        if proc.returncode != 0:
            raise DistributedRunError(f"{target}: launcher exited with {proc.returncode}:\n{log[-4000:]}")
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


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


def _worker(fn, rank: int, world_size: int, port: int, out: Path, payload: Any) -> None:
    import traceback

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    code = 0
    try:
        import torch
        import torch.distributed as dist

        # Several ranks share few cores: one thread each avoids oversubscription.
        torch.set_num_threads(1)
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


def _main(target: str, world_size: int, out: Path, timeout: float) -> int:
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
            _worker(fn, rank, world_size, port, out, payload)
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
        pids.pop(pid, None)
        if code != 0:
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
    sys.exit(_main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])))

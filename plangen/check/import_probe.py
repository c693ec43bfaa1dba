"""Import a plan file in a forked child process first, with a time bound.

Level 2 must import a plan file (the runtime does), and importing runs the user's top-level code.
Run in the verify process, a file that loops forever hangs verify, one that calls ``os._exit``
ends it with exit 0 and the other files' findings unprinted, one that raises
``KeyboardInterrupt`` loses every finding. So each file is imported once in a child forked from
verify (torch and transformers already loaded: the child pays only for the file's own import);
only a file whose import finished there, within the bound, is imported again in verify's own
process, where level 2 reads its styles. A file that hung, ended the child or raised
``KeyboardInterrupt`` becomes a PG201 finding on that file, and the run goes on.

Where ``os.fork`` does not exist the probe is skipped and files are imported in process, as before.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from typing import Optional

IMPORT_TIMEOUT = 60.0  # seconds for one file's import; --timeout lowers it

Failure = tuple[str, Optional[tuple[int, int]]]  # why, and where in the file (None: nowhere known)


def check_import(path: str, timeout: float = IMPORT_TIMEOUT) -> Optional[Failure]:
    """None when ``path`` imports within ``timeout`` seconds in a forked child (or the platform
    cannot fork); else why it failed and where, as :func:`plangen.check.model.check_model`'s
    ``probe`` returns it."""
    if not hasattr(os, "fork"):
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, answer, and leave without running any exit handler
        os.close(read_end)
        try:
            quiet = os.open(os.devnull, os.O_RDWR)
            os.dup2(quiet, 0)
            os.dup2(quiet, 1)  # the plan's prints: verify's own import shows them
            os.dup2(quiet, 2)
            os.write(write_end, json.dumps(_import_reply(path)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data, finished = _read_until(read_end, time.monotonic() + timeout)
    finally:
        os.close(read_end)
    if not finished:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return f"importing it did not finish within {timeout:g} s (a loop or a wait at its top level?)", None
    _, status = os.waitpid(pid, 0)
    if not data:
        code = os.waitstatus_to_exitcode(status)
        return f"importing it ended the process (exit code {code}): os._exit, a signal or a crash at import", None
    reply = json.loads(data)
    if reply["error"] is None:
        return None
    position = reply.get("position")
    return reply["error"], (tuple(position) if position else None)  # type: ignore[return-value]


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything the child writes until it closes the pipe (True), or what came before ``deadline``."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _import_reply(path: str) -> dict:
    from plangen.check.model import PlanLoadFailure, load_plan_styles, position_in_file
    from plangen.output.errors import one_line

    try:
        load_plan_styles(path)
    except PlanLoadFailure as failure:
        return {"error": str(failure), "position": failure.position}
    except KeyboardInterrupt as interrupt:  # raised by the file itself: nobody pressed Ctrl-C here
        return {"error": one_line(interrupt, with_type=True), "position": position_in_file(interrupt, path)}
    return {"error": None}

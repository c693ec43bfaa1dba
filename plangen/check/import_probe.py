"""Import plan files in a child process first, with a time bound.

Level 2 must import a plan file (the runtime does), and importing runs the user's top-level code.
Run in the verify process, a file that loops forever hangs verify, one that calls ``os._exit``
ends it with exit 0 and the other files' findings unprinted, one that raises
``KeyboardInterrupt`` loses every finding. So each file is imported once in a child process; only
a file whose import finished there, within the bound, is imported again in verify's own process
(where level 2 reads its styles). A file that hung, killed the child or raised
``KeyboardInterrupt`` becomes a PG201 finding on that file, and the run goes on.

The child is started once per verify process and reused (a file only pays for its own import); it
is replaced after a file kills or hangs it.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, Optional

IMPORT_TIMEOUT = 60.0  # seconds for one file's import; --timeout lowers it
STARTUP_TIMEOUT = 300.0  # the child imports torch before its first file: slow on a loaded machine
_MARK = "\x1eplangen-probe "  # lines of the protocol; anything else on stdout is the plan's own output
GONE, LATE = "gone", "late"  # the child died; the child did not answer in time


@dataclass(frozen=True)
class ImportFailure:
    """Why a plan file could not be imported, and where in it (None: nowhere in particular)."""

    message: str
    position: Optional[tuple[int, int]] = None


class _Child:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "plangen.check.import_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the plan's prints: verify's own import shows them
            text=True,
            env=env,
            start_new_session=True,  # a plan that signals its process group hits only the child
        )
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=_pump, args=(self.process.stdout, self.lines), daemon=True).start()

    def ask(self, path: str, timeout: float) -> dict | str:
        """The child's answer for ``path``, or ``GONE`` (it died) or ``LATE`` (past ``timeout``)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(path + "\n")
            self.process.stdin.flush()
        except OSError:
            return GONE
        return self.answer(timeout)

    def answer(self, timeout: float) -> dict | str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return LATE
        return GONE if line is None else json.loads(line)

    def kill(self) -> int:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.process.wait()


def _pump(stream: IO[str], lines: "queue.Queue[Optional[str]]") -> None:
    for line in stream:
        if line.startswith(_MARK):
            lines.put(line[len(_MARK):])
    lines.put(None)  # end of stream: the child is gone


class ImportProbe:
    """Imports plan files in a reusable child process; see the module docstring."""

    def __init__(self) -> None:
        self._child: Optional[_Child] = None
        self._unavailable = False

    def check(self, path: str, timeout: float = IMPORT_TIMEOUT) -> Optional[ImportFailure]:
        """None when ``path`` imports within ``timeout`` seconds (or the child cannot start at all,
        in which case verify imports in its own process as it always could); else the failure."""
        child = self._ready()
        if child is None:
            return None
        reply = child.ask(os.path.abspath(path), timeout)
        if isinstance(reply, dict):
            if reply.get("error") is None:
                return None
            position = reply.get("position")
            return ImportFailure(reply["error"], tuple(position) if position else None)
        self._child = None
        if reply == LATE:
            child.kill()
            return ImportFailure(f"importing it did not finish within {timeout:g} s (a loop or a wait at its top level?)")
        code = child.process.wait()
        return ImportFailure(f"importing it ended the process (exit code {code}): os._exit, a signal or a crash at import")

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None

    def _ready(self) -> Optional[_Child]:
        if self._child is None and not self._unavailable:
            child = _Child()
            if child.answer(STARTUP_TIMEOUT) == {"ready": True}:
                self._child = child
            else:
                child.kill()
                self._unavailable = True
        return self._child


_PROBE = ImportProbe()
atexit.register(_PROBE.close)


def check_import(path: str, timeout: float = IMPORT_TIMEOUT) -> Optional[tuple[str, Optional[tuple[int, int]]]]:
    """Import ``path`` in the shared child process (see :meth:`ImportProbe.check`): None, or why
    it failed and where, as :func:`plangen.check.model.check_model`'s ``probe`` returns it."""
    failure = _PROBE.check(path, timeout)
    return None if failure is None else (failure.message, failure.position)


def _serve() -> None:
    """The child: import each path read from stdin, answer one protocol line per path."""
    from plangen.check.model import PlanLoadFailure, load_plan_styles

    out = sys.stdout
    out.write(_MARK + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        path = line.rstrip("\n")
        reply: dict = {"error": None}
        try:
            load_plan_styles(path)
        except PlanLoadFailure as failure:
            reply = {"error": str(failure), "position": failure.position}
        except KeyboardInterrupt as interrupt:  # raised by the file itself: nobody pressed Ctrl-C here
            from plangen.check.model import position_in_file
            from plangen.errors import one_line

            reply = {"error": one_line(interrupt, with_type=True), "position": position_in_file(interrupt, path)}
        out.write(_MARK + json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()

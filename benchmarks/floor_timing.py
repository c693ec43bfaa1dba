"""Timing a command against its import floor, shared by init_speed.py, verify_speed.py and cli_speed.py.

Both run as fresh processes, interleaved; the best (smallest) run of each is compared. The verdict
is on CPU time (user + system of the child), which other work on a shared machine hardly inflates.
On this kind of virtual machine the CPU time of one and the same command still swings by ~20 %
from run to run (frequency, neighbours), so two rounds can leave a slow "best" on one side and a
fast one on the other. :func:`ratio_to_floor` therefore keeps adding interleaved rounds, up to a
limit, while the ratio is over budget: a command that is really over budget stays over it however
many rounds run, a noisy pair of rounds does not fail the check.
"""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cwd: Path | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``command``; raises SystemExit if it fails."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    wall, cpu = time.perf_counter() - start, _cpu_of_children() - cpu
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}... exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return cpu, wall


def best_of(timed, commands: list[list[str]], repeat: int, best=None) -> list[tuple[float, float]]:
    """Per command, the smallest (CPU, wall) seconds over ``repeat`` interleaved rounds (and ``best``)."""
    best = list(best or [(float("inf"), float("inf"))] * len(commands))
    for _ in range(repeat):
        for i, command in enumerate(commands):
            cpu, wall = timed(command)
            best[i] = (min(best[i][0], cpu), min(best[i][1], wall))
    return best


def ratio_to_floor(
    floor: list[str], command: list[str], repeat: int, budget: float, max_repeat: int, cwd: Path | None = None
) -> tuple[tuple[float, float], tuple[float, float], int]:
    """Best (CPU, wall) of ``floor`` and of ``command`` and the rounds run: ``repeat`` rounds, then
    one more at a time while the CPU ratio is over ``budget``, up to ``max_repeat`` in all."""
    run = lambda c: timed(c, cwd)  # noqa: E731
    best = best_of(run, [floor, command], repeat)
    rounds = repeat
    while best[1][0] / best[0][0] > budget and rounds < max_repeat:
        best = best_of(run, [floor, command], 1, best)
        rounds += 1
    return best[0], best[1], rounds

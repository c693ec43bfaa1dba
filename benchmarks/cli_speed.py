"""Benchmark 4: `plangen init` and `plangen verify` against the import floor, reusing their own benchmarks.

* init: ``init_speed.py``'s floor (import torch and transformers, build Llama 3.1 405B on the meta
  device) and command (``python -m plangen init <405B config> -o ... --force``);
* verify: ``verify_speed.py``'s floor (the same, through ``plangen.model.resolve``) and command (levels 1
  and 2 of ``generated/llama_plan.py`` against the 405B config at TP 8).

Each command and its floor run as fresh processes, interleaved, several times; the best of each is
kept. The verdict is on CPU time (user + system of the process), as ``verify_speed.py`` does:
other work on a shared machine does not inflate it. Wall time is reported beside it.

Goal for both: within 1.2x of the floor (the budget both scripts hold their command to).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Callable

from common import Goal, Section, format_ratio
from floor_timing import best_of

HERE = Path(__file__).resolve().parent
GOAL = 1.2  # init_speed.py's --goal and verify_speed.py's --budget defaults


def load_benchmark(name: str):
    """A benchmark script another engineer owns, as a module (its floor, its command, its timing)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli_benchmark(quick: bool = False, timed: Callable[[list[str]], tuple[float, float]] | None = None) -> Section:
    """``timed(command) -> (CPU s, wall s)`` runs a command; verify_speed.py's own by default."""
    init_speed, verify_speed = load_benchmark("init_speed"), load_benchmark("verify_speed")
    timed = timed or verify_speed.timed  # a fresh process; raises if it fails
    repeat = 1 if quick else 5
    config = init_speed.DEFAULT_CONFIG
    with tempfile.TemporaryDirectory(prefix="plangen-bench-") as tmp:
        commands = [
            [sys.executable, "-c", init_speed.FLOOR, str(config)],
            [sys.executable, "-m", "plangen", "init", str(config), "-o", str(Path(tmp) / "plan.py"), "--force"],
            verify_speed.FLOOR,
            verify_speed.VERIFY,
        ]
        if not quick:
            timed(commands[1])  # warm the file cache (the floors' imports are the same)
        init_floor, init, verify_floor, verify = best_of(timed, commands, repeat)
    section = Section(
        f"4. CLI time against the import floor (import torch, transformers; {config.stem} on the meta device), "
        f"best of {repeat} fresh processes",
        ["command", "CPU", "floor CPU", "ratio", "wall", "floor wall", "wall ratio"],
    )
    rows = (
        (f"plangen init {config.name}", init, init_floor),
        (
            f"plangen verify {Path(verify_speed.PLAN).name} --tp-size {verify_speed.TP_SIZE} (levels 1-2)",
            verify,
            verify_floor,
        ),
    )
    for name, (cpu, wall), (floor_cpu, floor_wall) in rows:
        section.rows.append(
            [
                name,
                f"{cpu:.2f} s",
                f"{floor_cpu:.2f} s",
                format_ratio(cpu / floor_cpu),
                f"{wall:.2f} s",
                f"{floor_wall:.2f} s",
                format_ratio(wall / floor_wall),
            ]
        )
    section.goals = [
        Goal(f"{name.split()[1]} within {GOAL}x of the floor (CPU)", cpu / floor_cpu <= GOAL, f"{cpu / floor_cpu:.2f}x")
        for name, (cpu, _), (floor_cpu, _) in rows
    ]
    section.notes = ["floors and commands: benchmarks/init_speed.py and benchmarks/verify_speed.py"]
    return section

"""Benchmark 4: wall time of `plangen init` and `plangen verify` against the import floor.

Both commands run as fresh processes through their real entry point (``python -m plangen``),
interleaved with the floor, several times; the fastest run of each is compared (the minimum is the
figure least disturbed by other work on the machine). The floor and the init command are
``benchmarks/init_speed.py``'s: importing torch and transformers and building Llama 3.1 405B on the
meta device, which any tool must pay to know the model's module tree. ``plangen verify`` then
checks the plan file init just wrote, with its default levels (it reads the model from the file).

Goal for both: within ``init_speed.py``'s 1.2x of the floor.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

from common import Goal, Section, format_ratio

HERE = Path(__file__).resolve().parent
GOAL = 1.2  # init_speed.py's --goal default


def load_init_speed():
    """The init benchmark another file owns: its floor, its command's timing."""
    spec = importlib.util.spec_from_file_location("init_speed", HERE / "init_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fastest(timed, commands: list[list[str]], repeat: int) -> list[float]:
    """The fastest of ``repeat`` interleaved rounds of the commands, run in order each round."""
    best = [float("inf")] * len(commands)
    for _ in range(repeat):
        for i, command in enumerate(commands):
            best[i] = min(best[i], timed(command))
    return best


def run_cli_benchmark(quick: bool = False) -> Section:
    init_speed = load_init_speed()
    repeat = 2 if quick else 5
    config = init_speed.DEFAULT_CONFIG
    with tempfile.TemporaryDirectory(prefix="plangen-bench-") as tmp:
        plan = Path(tmp) / "plan.py"
        floor_cmd = [sys.executable, "-c", init_speed.FLOOR, str(config)]
        init_cmd = [sys.executable, "-m", "plangen", "init", str(config), "-o", str(plan), "--force"]
        verify_cmd = [sys.executable, "-m", "plangen", "verify", str(plan)]
        if not quick:
            init_speed.timed(init_cmd)  # warm the file cache (the floor's imports are the same)
        floor_s, init_s, verify_s = fastest(init_speed.timed, [floor_cmd, init_cmd, verify_cmd], repeat)
    section = Section(
        f"4. CLI wall time, fastest of {repeat} fresh processes, against the import floor ({floor_s:.2f} s)",
        ["command", "wall time", "ratio to floor", "beyond floor"],
    )
    for name, seconds in ((f"plangen init {config.name}", init_s), ("plangen verify (the plan init wrote)", verify_s)):
        section.rows.append([name, f"{seconds:.2f} s", format_ratio(seconds / floor_s), f"{seconds - floor_s:+.2f} s"])
    section.goals = [
        Goal(f"init within {GOAL}x of the floor", init_s / floor_s <= GOAL, f"{init_s / floor_s:.2f}x"),
        Goal(f"verify within {GOAL}x of the floor", verify_s / floor_s <= GOAL, f"{verify_s / floor_s:.2f}x"),
    ]
    section.notes = [f"floor: python -c 'import torch, transformers; {config.name} on the meta device' (init_speed.py)"]
    return section

"""Is `plangen init` within 1.2x of the floor: importing torch and transformers and building the model on meta?

Both run as fresh processes, interleaved, several times; the fastest run of each is compared (the
minimum is the figure least disturbed by other work on the machine). The floor is what any tool
must pay to know the model's module tree:

    import torch, transformers; build the config's class from its config.json on the meta device

and `plangen init` is run through its real entry point (`python -m plangen init ... --force`).
Prints both figures and the ratio; exits 1 when the ratio is above the goal.

    .venv/bin/python benchmarks/init_speed.py [--config PATH] [--repeat N] [--goal 1.2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "tests" / "data" / "model-configs" / "llama-3.1-405b.json"

FLOOR = """
import json, sys
import torch, transformers
config_file = sys.argv[1]
architecture = json.load(open(config_file))["architectures"][0]
config = transformers.AutoConfig.from_pretrained(config_file)
with torch.device("meta"):
    model = getattr(transformers, architecture)(config)
"""


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run. The verdict uses CPU time: on a shared machine the
    wall time of either command swings with the load, its CPU time hardly does."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _cpu_of_children() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--goal", type=float, default=1.2)
    args = parser.parse_args(argv)

    floor_runs: list[tuple[float, float]] = []
    init_runs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="plangen-bench-") as tmp:
        out = Path(tmp) / "plan.py"
        floor_cmd = [sys.executable, "-c", FLOOR, str(args.config)]
        init_cmd = [sys.executable, "-m", "plangen", "init", str(args.config), "-o", str(out), "--force"]
        timed(init_cmd)  # warm the file cache for both (same imports)
        for _ in range(args.repeat):
            floor_runs.append(timed(floor_cmd))
            init_runs.append(timed(init_cmd))
    (floor, floor_wall), (init, init_wall) = min(floor_runs), min(init_runs)
    ratio = init / floor
    print(f"floor (import torch, transformers + {args.config.name} on meta): {floor:.2f} s CPU, {floor_wall:.2f} s wall")
    print(f"plangen init {args.config.name}: {init:.2f} s CPU, {init_wall:.2f} s wall")
    print(f"ratio: {ratio:.2f} (CPU time; wall {init_wall / floor_wall:.2f}; goal <= {args.goal})")
    return 0 if ratio <= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())

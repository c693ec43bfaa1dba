"""How long `plangen verify` (levels 1 and 2) takes on a 405B-shaped model, against its floor.

The floor is what any check against the model must pay: start Python, ``import torch,
transformers``, and build the model on the meta device. The budget is 1.2 times the floor. Both
run as fresh processes, interleaved, several times; the best of each is compared. The verdict is
on CPU time (user + system of the process), which other work on a shared machine does not
inflate; wall time is printed beside it. Prints both and the ratio; exits 1 over budget.

    python benchmarks/verify_speed.py [--repeat 5] [--budget 1.2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "tests/data/model-configs/llama-3.1-405b.json"
PLAN = "generated/llama_plan.py"
TP_SIZE = 8

FLOOR = [
    sys.executable,
    "-c",
    "import torch, transformers\n"
    "from plangen.models import build_meta_model, resolve_model\n"
    f"build_meta_model(resolve_model({CONFIG!r}))\n",
]
VERIFY = [sys.executable, "-m", "plangen", "verify", PLAN, "--model", CONFIG, "--tp-size", str(TP_SIZE)]


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``command``."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    wall, cpu = time.perf_counter() - start, _cpu_of_children() - cpu
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}... exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return cpu, wall


def measure(repeat: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Best (CPU, wall) of the floor and of verify over ``repeat`` interleaved runs of each."""
    floors, verifies = [], []
    for _ in range(repeat):
        floors.append(timed(FLOOR))
        verifies.append(timed(VERIFY))
    best = lambda runs: (min(r[0] for r in runs), min(r[1] for r in runs))  # noqa: E731
    return best(floors), best(verifies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each (default 5)")
    parser.add_argument("--budget", type=float, default=1.2, help="allowed verify / floor ratio (default 1.2)")
    args = parser.parse_args(argv)
    (floor, floor_wall), (verify, verify_wall) = measure(args.repeat)
    ratio = verify / floor
    print(f"floor:  import torch, transformers; build {Path(CONFIG).stem} on meta:  {floor:.2f} s CPU ({floor_wall:.2f} s wall)")
    print(f"verify: levels 1 and 2 of {PLAN} at TP={TP_SIZE}:   {verify:.2f} s CPU ({verify_wall:.2f} s wall)")
    print(f"ratio {ratio:.3f} CPU ({verify_wall / floor_wall:.3f} wall), budget {args.budget}")
    if ratio > args.budget:
        print(f"verify_speed: over budget: {ratio:.3f} > {args.budget}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

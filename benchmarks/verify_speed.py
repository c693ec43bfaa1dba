"""How long `plangen verify` (levels 1 and 2) takes on a 405B-shaped model, against its floor.

The floor is what any check against the model must pay: start Python, ``import torch,
transformers``, and build the model on the meta device. The budget is 1.2 times the floor. Both
run as fresh processes, interleaved, several times; the best of each is compared, on CPU time
(floor_timing.py says why, and why more rounds run while over budget); wall time is printed beside
it. Prints both and the ratio; exits 1 over budget.

    python benchmarks/verify_speed.py [--repeat 5] [--budget 1.2] [--max-repeat 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling floor_timing.py
import floor_timing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "tests/data/model-configs/llama-3.1-405b.json"
PLAN = "generated/llama_plan.py"
TP_SIZE = 8

FLOOR = [
    sys.executable,
    "-c",
    "import torch, transformers\n"
    "from plangen.model.resolve import build_meta_model, resolve_model\n"
    f"build_meta_model(resolve_model({CONFIG!r}))\n",
]
VERIFY = [sys.executable, "-m", "plangen", "verify", PLAN, "--model", CONFIG, "--tp-size", str(TP_SIZE)]


def timed(command: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``command`` in the checkout."""
    return floor_timing.timed(command, ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each (default 5)")
    parser.add_argument("--budget", type=float, default=1.2, help="allowed verify / floor ratio (default 1.2)")
    parser.add_argument(
        "--max-repeat", type=int, default=None, help="rounds allowed while over budget (default 2x --repeat)"
    )
    args = parser.parse_args(argv)
    max_repeat = args.max_repeat or 2 * args.repeat
    (floor, floor_wall), (verify, verify_wall), rounds = floor_timing.ratio_to_floor(
        FLOOR, VERIFY, args.repeat, args.budget, max_repeat, ROOT
    )
    ratio = verify / floor
    print(f"best of {rounds} interleaved rounds")
    print(
        f"floor:  import torch, transformers; build {Path(CONFIG).stem} on meta:  {floor:.2f} s CPU ({floor_wall:.2f} s wall)"
    )
    print(f"verify: levels 1 and 2 of {PLAN} at TP={TP_SIZE}:   {verify:.2f} s CPU ({verify_wall:.2f} s wall)")
    print(f"ratio {ratio:.3f} CPU ({verify_wall / floor_wall:.3f} wall), budget {args.budget}")
    if ratio > args.budget:
        print(f"verify_speed: over budget: {ratio:.3f} > {args.budget}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

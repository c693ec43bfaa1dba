"""Is `plangen init` within 1.2x of the floor: importing torch and transformers and building the model on meta?

Both run as fresh processes, interleaved, several times; the fastest run of each is compared (the
minimum is the figure least disturbed by other work on the machine; floor_timing.py says why more
rounds run while over the goal). The floor is what any tool
must pay to know the model's module tree:

    import torch, transformers; build the config's class from its config.json on the meta device

and `plangen init` is run through its real entry point (`python -m plangen init ... --force`).
Prints both figures and the ratio; exits 1 when the ratio is above the goal.

    .venv/bin/python benchmarks/init_speed.py [--config PATH] [--repeat N] [--goal 1.2] [--max-repeat M]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling floor_timing.py
import floor_timing  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--goal", type=float, default=1.2)
    parser.add_argument(
        "--max-repeat", type=int, default=None, help="rounds allowed while over the goal (default 2x --repeat)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="plangen-bench-") as tmp:
        out = Path(tmp) / "plan.py"
        floor_cmd = [sys.executable, "-c", FLOOR, str(args.config)]
        init_cmd = [sys.executable, "-m", "plangen", "init", str(args.config), "-o", str(out), "--force"]
        floor_timing.timed(init_cmd, ROOT)  # warm the file cache for both (same imports)
        (floor, floor_wall), (init, init_wall), rounds = floor_timing.ratio_to_floor(
            floor_cmd, init_cmd, args.repeat, args.goal, args.max_repeat or 2 * args.repeat, ROOT
        )
    print(f"best of {rounds} interleaved rounds")
    ratio = init / floor
    print(
        f"floor (import torch, transformers + {args.config.name} on meta): {floor:.2f} s CPU, {floor_wall:.2f} s wall"
    )
    print(f"plangen init {args.config.name}: {init:.2f} s CPU, {init_wall:.2f} s wall")
    print(f"ratio: {ratio:.2f} (CPU time; wall {init_wall / floor_wall:.2f}; goal <= {args.goal})")
    return 0 if ratio <= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())

"""``plangen cost`` on every config of tests/data/model-configs at TP 1-8 (DP 2, sequence parallel where
the plan has it): the table of docs/cost.md's "Every config, every TP size".

    .venv/bin/python scripts/sweep_cost.py                     # the whole sweep; rewrites the table in docs/cost.md
    .venv/bin/python scripts/sweep_cost.py --only llama-3.1-8b,mixtral-8x7b --tp 2,4 --no-write

Each case runs the core function the CLI calls (plangen.cost.sweep.sweep_cost_case), in this one
process. A case that raises anything but the one-line CostError is a bug: it stops the sweep with
its traceback (``--keep-going`` records it as "internal error" and goes on).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "model-configs"
DOC = ROOT / "docs" / "cost.md"
BEGIN, END = "<!-- sweep_cost: begin -->", "<!-- sweep_cost: end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="config stems, comma-separated (default: every config)")
    parser.add_argument("--tp", help="TP sizes, comma-separated (default: 1-8)")
    parser.add_argument("--no-write", action="store_true", help="print the table; leave docs/cost.md alone")
    parser.add_argument("--keep-going", action="store_true", help="record an internal error and go on")
    args = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    from plangen.cost.sweep import SWEEP_TP_SIZES, SweepCase, render_sweep_summary, render_sweep_table, sweep_cost_case

    hf_logging.set_verbosity_error()
    configs = sorted(CONFIGS.glob("*.json"))
    if args.only:
        wanted = args.only.split(",")
        configs = [c for c in configs if c.stem in wanted]
    tps = [int(t) for t in args.tp.split(",")] if args.tp else list(SWEEP_TP_SIZES)
    cases = []
    for config in configs:
        for tp in tps:
            start = time.perf_counter()
            try:
                case = sweep_cost_case(config, tp)
            except Exception as error:
                if not args.keep_going:
                    raise
                traceback.print_exc()
                line = f"internal error: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
                case = SweepCase(config.stem, tp, False, None, None, None, line, None, time.perf_counter() - start)
            print(
                f"{case.config} TP {case.tp_size}: {case.seconds:.1f} s: "
                f"{case.refusal or f'{case.memory_bytes} / {case.ideal_bytes} B, TP-sharded {case.tp_sharded_fraction:.4f}, SP {case.sequence_parallel}'}"
                f"{'; no SP: ' + case.no_sp if case.no_sp else ''}",
                file=sys.stderr,
                flush=True,
            )
            cases.append(case)
    table = render_sweep_table(cases) + "\n" + render_sweep_summary(cases) + ".\n"
    if args.no_write:
        print(table, end="")
        return 0
    text = DOC.read_text()
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN not in text:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} markers to write the table between")
    DOC.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.DOTALL))
    print(f"wrote the table into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

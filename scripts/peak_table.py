"""The figures table of docs/cost.md ("Peak memory per rank"): ``plangen cost --peak`` on the shared
Llama-3.1-8B/70B/405B and Qwen3-30B-A3B configs at TP 2/4/8, SP off and on, DP 4, 1 x 8192 tokens
per DP rank, bf16 compute, fp32 state, the runtime's plan.

    .venv/bin/python scripts/peak_table.py [--only llama-3.1-8b,...] [--tp 2,4,8]

Prints the markdown table (paste it over the one in docs/cost.md); a layout the model cannot take
(heads not divisible by TP) is a row that says why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "model-configs"
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-30b-a3b")
GIB = 2**30
HEADER = (
    "| model | TP | SP | peak | when | params | AdamW | activations | gathered | temporary | fw act | time | depth |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def render_row(model: str, tp: int, sp: bool) -> str:
    from plangen.cost.peak import measure_peak
    from plangen.cost.settings import CostError

    try:
        report = measure_peak(str(CONFIGS / f"{model}.json"), tp_size=tp, dp_size=4, seq_len=8192, sequence_parallel=sp)
    except CostError as error:
        return f"| {model} | {tp} | {'on' if sp else 'off'} | - | {error} | | | | | | | | |"
    peak = report.peak
    b = peak.breakdown
    forward = next((p for p in report.phases if p.phase == "forward"), None)
    depth = "3, 4, 5" if report.notes[0].startswith("depth: traced at") else "every layer"
    cells = (
        b.total / GIB,
        b.parameters / GIB,
        b.optimizer / GIB,
        b.activations / GIB,
        b.gathered / GIB,
        b.temporary / GIB,
    )
    fw = f"{forward.breakdown.activations / GIB:.1f}" if forward else "-"
    return (
        f"| {model} | {tp} | {'on' if sp else 'off'} | {cells[0]:.1f} | {peak.phase} | {cells[1]:.2f} | {cells[2]:.2f} | "
        f"{cells[3]:.1f} | {cells[4]:.2f} | {cells[5]:.2f} | {fw} | {report.seconds:.0f} s | {depth} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--tp", default="2,4,8")
    args = parser.parse_args(argv)
    print(HEADER, flush=True)
    for model in args.only.split(","):
        for tp in map(int, args.tp.split(",")):
            for sp in (False, True):
                print(render_row(model, tp, sp), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The plot in README.md and docs/cost.md: ``plangen cost --peak --plot`` of Llama-3.1-70B at TP 8 x DP 4,
1 x 8192 tokens per DP rank, sequence parallel off and on, against an 80 GiB GPU (the runtime's plan,
bf16 compute, fp32 weights, gradients and AdamW; traced at 3, 4 and 5 layers and extrapolated to 80).

    .venv/bin/python scripts/plot_cost.py [--output docs/images/cost-peak-llama-3.1-70b.svg]

The two traces are the ones ``plangen cost tests/data/model-configs/llama-3.1-70b.json --peak --tp-size 8
--dp-size 4 --seq-len 8192 [--sequence-parallel] --gpu-memory 80GiB --plot FILE`` draws one at a time;
here both are drawn in one figure. Prints each trace's time and the stack it ran on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "model-configs" / "llama-3.1-70b.json"
OUTPUT = ROOT / "docs" / "images" / "cost-peak-llama-3.1-70b.svg"
GPU = "80GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help=f"the .svg, .png or .html to write (default {OUTPUT})"
    )
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from plangen.cost.peak import measure_peak, parse_memory
    from plangen.cost.plot import check_plot_path, write_peak_plot
    from plangen.cost.render import build_peak_json

    hf_logging.set_verbosity_error()
    output = args.output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    check_plot_path(output)
    gpu_bytes = parse_memory(GPU)
    os.chdir(ROOT)  # the model as the docs' command names it, relative to the checkout
    documents = []
    for sequence_parallel in (False, True):
        report = measure_peak(
            str(CONFIG.relative_to(ROOT)), tp_size=8, dp_size=4, seq_len=8192, sequence_parallel=sequence_parallel
        )
        print(
            f"SP {'on' if sequence_parallel else 'off'}: peak {report.peak.breakdown.total} bytes, "
            f"traced in {report.seconds:.1f} s ({report.notes[0]})",
            flush=True,
        )
        documents.append(build_peak_json([report], gpu_bytes))
    write_peak_plot(output, documents)
    print(
        f"wrote {output} (torch {torch.__version__}, transformers {transformers.__version__}, CPU, fake-tensor trace)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

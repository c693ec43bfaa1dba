"""plangen's benchmarks, side by side with the alternatives, each with goals: exits 1 when one is missed.

    .venv/bin/python benchmarks/run.py [--quick] [--only comm,step,cli,moe,moe_step,loss,peak,compile] [--markdown PATH]

1. comm: TP communication per step of plangen's plans vs the Hugging Face and NeMo-RL-style plans
   (Llama-3.1-8B/70B, Qwen3-8B at TP 2, 4, 8), at the Megatron minimum (``comm_bytes.py``);
2. step and 3. memory: step time and peak memory per rank on CPU, DP 2 x TP 2, plangen's
   ``parallelize_model`` vs transformers' ``DistributedConfig(tp_size=2, fsdp_size=2)`` (``step_time.py``);
4. cli: ``plangen init`` and ``plangen verify`` wall time vs their import floor (``cli_speed.py``);
5. moe: memory per rank against the ideal and TP traffic of Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V3
   and gpt-oss-120b at TP 2, 4, 8 x DP 2, plangen vs the Hugging Face plan (``moe_memory.py``);
6. moe_step and 7.: step time and peak memory per rank as 2 and 3, for a small Qwen3-MoE: plangen's
   experts split whole over TP vs transformers' ``moe_tp_experts`` (``step_time.py``).
8. loss: peak memory and time of the loss on vocabulary-parallel logits (bf16, 8192 tokens, vocabulary
   151,936, TP 2): a naive full-vocabulary log_softmax, the previous cross-entropy, the chunked one
   (``loss_memory.py``).
9. peak: ``plangen cost --peak``'s predicted peak per rank (forward, backward, optimizer step) beside the
   peak measured on real tensors, small Llama, Qwen3 and Qwen3-MoE at DP 2 x TP 2, SP and activation
   checkpointing off and on, one gloo launch (``peak_memory.py``).
10. compile: step time of ``parallelize_model(compile=True)`` against eager, the small Llama and
   Qwen3-MoE of 2 and 6 at DP 2 x TP 2, paired launches, the compile time apart (``compile_time.py``).

``--quick`` runs a small subset of each (what the test suite runs); ``--markdown`` writes the
results with the date and versions (``docs/benchmarks.md`` holds the latest full run).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the sections are sibling files, not a package

from common import Section, render_section_markdown, render_section_text  # noqa: E402

SECTIONS = ("comm", "step", "cli", "moe", "moe_step", "loss", "peak", "compile")


def run_sections(names: list[str], quick: bool) -> list[Section]:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # shrunk configs make transformers warn about sizes
    hf_logging.disable_progress_bar()  # save_pretrained's progress bar
    sections: list[Section] = []
    for name in names:
        if name == "comm":
            from comm_bytes import run_comm_benchmark

            sections.append(run_comm_benchmark(quick))
        elif name == "step":
            from step_time import run_step_benchmark

            sections.extend(run_step_benchmark(quick))
        elif name == "cli":
            from cli_speed import run_cli_benchmark

            sections.append(run_cli_benchmark(quick))
        elif name == "moe":
            from moe_memory import run_moe_benchmark

            sections.append(run_moe_benchmark(quick))
        elif name == "moe_step":
            from step_time import run_step_benchmark

            sections.extend(run_step_benchmark(quick, kind="moe"))
        elif name == "loss":
            from loss_memory import run_loss_benchmark

            sections.append(run_loss_benchmark(quick))
        elif name == "peak":
            from peak_memory import run_peak_benchmark

            sections.append(run_peak_benchmark(quick))
        elif name == "compile":
            from compile_time import run_compile_benchmark

            sections.append(run_compile_benchmark(quick))
    return sections


def describe_environment() -> str:
    import torch
    import transformers

    from plangen import __version__

    return (
        f"plangen {__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()} ({platform.processor() or 'cpu'}), "
        f"{_cpu_count()} CPU cores"
    )


def load_average() -> str:
    import os

    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "unknown"


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def render_markdown(sections: list[Section], quick: bool, elapsed: float, load: str) -> str:
    today = datetime.date.today().isoformat()
    kind = "quick subset (--quick)" if quick else "full run"
    lines = [
        "# Benchmarks",
        "",
        f"Latest {kind} of `python benchmarks/run.py`: {today}, {elapsed:.0f} s.",
        f"{describe_environment()}; load average {load} when it started",
        "(a shared machine: timings are best-of or medians, CPU-time verdicts where the benchmark allows).",
        "",
        "Each section states its goals; the run exits non-zero when one is missed. How each figure is",
        "made: the docstrings of `benchmarks/*.py` and, for communication, `docs/cost.md`.",
        "",
        "## Goals",
        "",
    ]
    for section in sections:
        number = section.title.split(".")[0]
        lines += [f"- {'met' if g.met else '**missed**'} ({number}): {g.name}: {g.detail}" for g in section.goals]
    lines += ["", "## Results"]
    return "\n".join(lines) + "\n" + "\n".join(render_section_markdown(s) for s in sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="A fast subset of every benchmark.")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"Comma-separated sections: {', '.join(SECTIONS)}.")
    parser.add_argument("--markdown", type=Path, help="Also write the results as Markdown to this file.")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")

    start, load = time.perf_counter(), load_average()
    sections = run_sections(names, args.quick)
    elapsed = time.perf_counter() - start
    for section in sections:
        print(render_section_text(section))
    missed = [f"{s.title.split(':')[0]}: {g.name}" for s in sections for g in s.goals if not g.met]
    print(f"{sum(len(s.goals) for s in sections) - len(missed)} goals met, {len(missed)} missed ({elapsed:.0f} s)")
    for line in missed:
        print(f"MISSED {line}")
    if args.markdown:
        args.markdown.write_text(render_markdown(sections, args.quick, elapsed, load))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks 2 and 3: step time and peak memory per rank, plangen vs transformers' own TP + FSDP2.

A small random Llama is saved with ``save_pretrained`` to a temporary folder (no hub) and both
variants load it from there (:mod:`step_worker`): DP 2 x TP 2 on 4 gloo ranks on CPU, the same
weights and batch, float32, AdamW. Launches alternate (plangen, hf, plangen, hf, ...) so that
drift in the machine's load hits both alike; the step times of all launches of a variant are
pooled. Reported: the median step time and its spread (min-max; the fastest step, least disturbed
by other work, is shown with its ratio too), the peak resident memory per
rank above what the rank held before building its model (the largest rank, median over
launches), and the first step's loss, which must agree: same model, same batch.

Goals: plangen's median step is not slower (within ``TIME_TOLERANCE``, the noise of timing on
shared CPU cores; ``QUICK_TIME_TOLERANCE`` on the fastest step for the few steps of one launch each of
``--quick``)
and its peak memory per rank not larger (within ``MEMORY_TOLERANCE``).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from common import Goal, Section, format_mib, format_ratio

HERE = Path(__file__).resolve().parent
WORKER = f"{HERE / 'step_worker.py'}:run_steps"
TIME_TOLERANCE = 0.10
QUICK_TIME_TOLERANCE = 0.25
MEMORY_TOLERANCE = 0.05
LOSS_TOLERANCE = 1e-4
MODEL = dict(
    vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, use_cache=False,
)
# --quick has four steps of one launch per variant: their median swings with whatever else the
# machine runs, so it compares the fastest step (the least disturbed) instead.
FULL = dict(batch=2, seq=128, warmup=3, steps=15, repeats=3, time_tolerance=TIME_TOLERANCE, statistic="median")
QUICK = dict(batch=2, seq=128, warmup=2, steps=4, repeats=1, time_tolerance=QUICK_TIME_TOLERANCE, statistic="fastest")
VARIANTS = ("plangen", "hf")


def save_small_llama(directory: Path) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL)).save_pretrained(directory)
    return str(directory)


def run_variant(variant: str, weights: str, options: dict) -> list[dict]:
    from plangen.launch import run_distributed

    payload = {"variant": variant, "weights": weights, **{k: options[k] for k in ("batch", "seq", "warmup", "steps")}}
    return run_distributed(WORKER, 4, payload, timeout=300)


def run_step_benchmark(quick: bool = False) -> list[Section]:
    options = QUICK if quick else FULL
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    peaks: dict[str, list[int]] = {v: [] for v in VARIANTS}
    first_loss: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="plangen-bench-llama-") as tmp:
        weights = save_small_llama(Path(tmp))
        for _ in range(options["repeats"]):
            for variant in VARIANTS:
                ranks = run_variant(variant, weights, options)
                times[variant] += ranks[0]["times"]  # every rank's step ends at the same barrier
                peaks[variant].append(max(r["peak_bytes"] for r in ranks))
                first_loss[variant] = ranks[0]["losses"][0]
    return [build_time_section(times, first_loss, options), build_memory_section(peaks)]


def build_time_section(times: dict[str, list[float]], first_loss: dict[str, float], options: dict) -> Section:
    median = {v: statistics.median(t) for v, t in times.items()}
    statistic = options["statistic"]
    judged = median if statistic == "median" else {v: min(t) for v, t in times.items()}
    ratio = judged["plangen"] / judged["hf"]
    tolerance = options["time_tolerance"]
    section = Section(
        f"2. Step time on CPU (gloo), DP 2 x TP 2, small Llama ({MODEL['num_hidden_layers']} layers, hidden "
        f"{MODEL['hidden_size']}, vocab {MODEL['vocab_size']}), batch {options['batch']} x {options['seq']}, "
        f"{len(times['plangen'])} steps each",
        ["variant", "median step", "ratio to HF", "spread (min-max)", "fastest, ratio to HF", "first loss"],
    )
    for v in VARIANTS:
        spread = f"{min(times[v]) * 1e3:.1f}-{max(times[v]) * 1e3:.1f} ms"
        fastest = f"{min(times[v]) * 1e3:.1f} ms, {format_ratio(min(times[v]) / min(times['hf']))}"
        section.rows.append([
            _label(v), f"{median[v] * 1e3:.1f} ms", format_ratio(median[v] / median["hf"]), spread, fastest, f"{first_loss[v]:.5f}",
        ])
    loss_gap = abs(first_loss["plangen"] - first_loss["hf"])
    section.goals = [
        Goal("same weights and batch: the first step's loss agrees", loss_gap <= LOSS_TOLERANCE * abs(first_loss["hf"]), f"gap {loss_gap:.2e}"),
        Goal(f"plangen is not slower ({statistic} step within {tolerance:.0%})", ratio <= 1 + tolerance, f"plangen / HF {ratio:.2f}x"),
    ]
    return section


def build_memory_section(peaks: dict[str, list[int]]) -> Section:
    peak = {v: statistics.median(p) for v, p in peaks.items()}
    ratio = peak["plangen"] / peak["hf"]
    section = Section(
        "3. Peak memory per rank (resident, above the rank's memory before building the model; same runs)",
        ["variant", "peak per rank", "ratio to HF"],
    )
    for v in VARIANTS:
        section.rows.append([_label(v), format_mib(peak[v]), format_ratio(peak[v] / peak["hf"])])
    section.goals = [
        Goal(f"plangen's peak memory per rank is not larger (within {MEMORY_TOLERANCE:.0%})", ratio <= 1 + MEMORY_TOLERANCE, f"plangen / HF {ratio:.2f}x"),
    ]
    return section


def _label(variant: str) -> str:
    return {"plangen": "plangen parallelize_model", "hf": "transformers DistributedConfig(tp_size=2, fsdp_size=2)"}[variant]

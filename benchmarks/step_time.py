"""Benchmarks 2 and 3 (a small Llama) and 6 and 7 (a small Qwen3-MoE): step time and peak memory per
rank, plangen vs transformers' own TP + FSDP2.

A small random model is saved with ``save_pretrained`` to a temporary folder (no hub) and both
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
and its peak memory per rank not larger (within ``MEMORY_TOLERANCE``). A third goal judges the CPU
time each rank spends on a step (its own work, pooled over ranks and steps; ``time.process_time``):
on a loaded machine the wall time also counts how long a rank that blocked in a collective waits to
be scheduled again, which the CPU time leaves out.

The MoE model (``--only moe_step``): 8 experts, top-2, every layer sparse. plangen splits the experts
whole over TP (``ExpertsParallel``: 4 experts per rank, each rank computes the routes to its own);
transformers' plan splits each expert's intermediate dimension (``moe_tp_experts`` on the experts
module, ``packed_colwise`` on ``gate_up_proj``, ``rowwise`` on ``down_proj``: every rank computes
every route, half as wide). Both sum the partial outputs with one all-reduce per MoE layer.
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
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    use_cache=False,
)
MOE_MODEL = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    moe_intermediate_size=256,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    use_cache=False,
)
# kind -> (config class, model class, its config, how the tables name it, numbers of the time and memory sections)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", MODEL, "small Llama", ("2", "3")),
    "moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", MOE_MODEL, "small Qwen3-MoE", ("6", "7")),
}
# --quick has four steps of one launch per variant: their median swings with whatever else the
# machine runs, so it compares the fastest step (the least disturbed) instead.
FULL = dict(batch=2, seq=128, warmup=3, steps=15, repeats=3, time_tolerance=TIME_TOLERANCE, statistic="median")
QUICK = dict(batch=2, seq=128, warmup=2, steps=4, repeats=1, time_tolerance=QUICK_TIME_TOLERANCE, statistic="fastest")
VARIANTS = ("plangen", "hf")


def save_small_model(directory: Path, kind: str = "llama") -> str:
    import torch
    import transformers

    config_class, model_class, values, _, _ = MODELS[kind]
    torch.manual_seed(0)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**values)).save_pretrained(directory)
    return str(directory)


def describe_model(kind: str) -> str:
    _, _, m, name, _ = MODELS[kind]
    experts = f", {m['num_experts']} experts top-{m['num_experts_per_tok']}" if "num_experts" in m else ""
    return f"{name} ({m['num_hidden_layers']} layers, hidden {m['hidden_size']}{experts}, vocab {m['vocab_size']})"


def run_variant(variant: str, weights: str, options: dict) -> list[dict]:
    from plangen.distributed.launch import run_distributed

    payload = {"variant": variant, "weights": weights, **{k: options[k] for k in ("batch", "seq", "warmup", "steps")}}
    return run_distributed(WORKER, 4, payload, timeout=300)


def run_step_benchmark(quick: bool = False, kind: str = "llama") -> list[Section]:
    options = QUICK if quick else FULL
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    peaks: dict[str, list[int]] = {v: [] for v in VARIANTS}
    first_loss: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=f"plangen-bench-{kind}-") as tmp:
        weights = save_small_model(Path(tmp), kind)
        for _ in range(options["repeats"]):
            for variant in VARIANTS:
                ranks = run_variant(variant, weights, options)
                times[variant] += ranks[0]["times"]  # every rank's step ends at the same barrier
                cpu[variant] += [t for r in ranks for t in r["cpu_times"]]
                peaks[variant].append(max(r["peak_bytes"] for r in ranks))
                first_loss[variant] = ranks[0]["losses"][0]
    return [build_time_section(times, first_loss, options, kind, cpu), build_memory_section(peaks, kind)]


def build_time_section(
    times: dict[str, list[float]],
    first_loss: dict[str, float],
    options: dict,
    kind: str = "llama",
    cpu: dict[str, list[float]] | None = None,
) -> Section:
    median = {v: statistics.median(t) for v, t in times.items()}
    statistic = options["statistic"]
    judged = median if statistic == "median" else {v: min(t) for v, t in times.items()}
    ratio = judged["plangen"] / judged["hf"]
    tolerance = options["time_tolerance"]
    section = Section(
        f"{MODELS[kind][4][0]}. Step time on CPU (gloo), DP 2 x TP 2, {describe_model(kind)}, "
        f"batch {options['batch']} x {options['seq']}, {len(times['plangen'])} steps each",
        ["variant", "median step", "ratio to HF", "spread (min-max)", "fastest, ratio to HF", "first loss"]
        + (["CPU per rank and step, ratio to HF"] if cpu else []),
    )
    cpu_median = {v: statistics.median(t) for v, t in cpu.items()} if cpu else {}
    for v in VARIANTS:
        spread = f"{min(times[v]) * 1e3:.1f}-{max(times[v]) * 1e3:.1f} ms"
        fastest = f"{min(times[v]) * 1e3:.1f} ms, {format_ratio(min(times[v]) / min(times['hf']))}"
        section.rows.append(
            [
                _label(v),
                f"{median[v] * 1e3:.1f} ms",
                format_ratio(median[v] / median["hf"]),
                spread,
                fastest,
                f"{first_loss[v]:.5f}",
            ]
            + ([f"{cpu_median[v] * 1e3:.1f} ms, {format_ratio(cpu_median[v] / cpu_median['hf'])}"] if cpu else [])
        )
    loss_gap = abs(first_loss["plangen"] - first_loss["hf"])
    section.goals = [
        Goal(
            "same weights and batch: the first step's loss agrees",
            loss_gap <= LOSS_TOLERANCE * abs(first_loss["hf"]),
            f"gap {loss_gap:.2e}",
        ),
        Goal(
            f"plangen is not slower ({statistic} step within {tolerance:.0%})",
            ratio <= 1 + tolerance,
            f"plangen / HF {ratio:.2f}x",
        ),
    ]
    if cpu:
        cpu_ratio = cpu_median["plangen"] / cpu_median["hf"]
        section.goals.append(
            Goal(
                f"plangen does no more work (median CPU time per rank and step within {tolerance:.0%})",
                cpu_ratio <= 1 + tolerance,
                f"plangen / HF {cpu_ratio:.2f}x",
            )
        )
    return section


def build_memory_section(peaks: dict[str, list[int]], kind: str = "llama") -> Section:
    peak = {v: statistics.median(p) for v, p in peaks.items()}
    ratio = peak["plangen"] / peak["hf"]
    section = Section(
        f"{MODELS[kind][4][1]}. Peak memory per rank (resident, above the rank's memory before building the model; "
        f"same runs{'' if kind == 'llama' else ', ' + MODELS[kind][3]})",
        ["variant", "peak per rank", "ratio to HF"],
    )
    for v in VARIANTS:
        section.rows.append([_label(v), format_mib(peak[v]), format_ratio(peak[v] / peak["hf"])])
    section.goals = [
        Goal(
            f"plangen's peak memory per rank is not larger (within {MEMORY_TOLERANCE:.0%})",
            ratio <= 1 + MEMORY_TOLERANCE,
            f"plangen / HF {ratio:.2f}x",
        ),
    ]
    return section


def _label(variant: str) -> str:
    return {"plangen": "plangen parallelize_model", "hf": "transformers DistributedConfig(tp_size=2, fsdp_size=2)"}[
        variant
    ]

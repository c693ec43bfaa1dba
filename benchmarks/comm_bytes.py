"""Benchmark 1: TP communication per step of plangen's plans vs the Hugging Face and NeMo-RL-style plans.

For each model shape and TP size, ``plangen cost``'s core (:func:`plangen.cost.build_cost_report`)
costs plangen's optimized plan, the NeMo-RL-style plan (``plangen/cost/nemo_plan.py``: NeMo RL's
``_parallelize_llama``) and the model's Hugging Face plan, without and with sequence parallel
(Hugging Face plans have none: the same plan in both rows). Figures are bytes each rank sends per
step (ring algorithms), bf16 activations, one micro-batch of 1 x 4096 tokens. FSDP2's traffic is
the same for every plan (same parameter shards) and left out.

Goals, for every row: plangen sends no more than either alternative, and its per-layer
activation traffic is the Megatron minimum: two all-reduces of the hidden state B x S x H per
layer each way (TP), or two all-gathers and two reduce-scatters (SP), 4 x 2(n-1)/n x B·S·H bytes.
"""

from __future__ import annotations

from pathlib import Path

from common import Goal, Section, format_gib, format_ratio

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "model-configs"
MODELS = {"Llama-3.1-8B": "llama-3.1-8b.json", "Llama-3.1-70B": "llama-3.1-70b.json", "Qwen3-8B": "qwen3-8b.json"}
TP_SIZES = (2, 4, 8)
QUICK = (("Llama-3.1-8B", 2),)
SEQ_LEN, MICRO_BATCH, DTYPE = 4096, 1, "bf16"


def megatron_minimum_per_layer(hidden: int, tp: int, dtype_bytes: int = 2) -> float:
    """Bytes one rank sends per layer, forward and backward, for the activation collectives."""
    return 4 * 2 * (tp - 1) / tp * MICRO_BATCH * SEQ_LEN * hidden * dtype_bytes


def activation_bytes_per_layer(plan, layers: int) -> float:
    return (
        sum(
            c.sent_bytes
            for c in plan.collectives
            if c.source == "TP" and c.scope == "per layer" and c.tensor == "B·S·H"
        )
        / layers
    )


def activation_counts_per_layer(plan, layers: int) -> dict[str, float]:
    counts: dict[str, float] = {}
    for c in plan.collectives:
        if c.source == "TP" and c.scope == "per layer" and c.tensor == "B·S·H":
            counts[c.kind] = counts.get(c.kind, 0) + c.count / layers
    return counts


def run_comm_benchmark(quick: bool = False) -> Section:
    from plangen.cost import build_cost_report

    cases = QUICK if quick else tuple((m, tp) for m in MODELS for tp in TP_SIZES)
    section = Section(
        "1. TP communication per rank per step (bf16, 1 x 4096 tokens): plangen vs Hugging Face and NeMo-RL-style plans",
        [
            "model",
            "TP",
            "mode",
            "plangen",
            "HF / plangen",
            "NeMo / plangen",
            "plangen / Megatron min.",
            "collectives plangen / HF / NeMo",
        ],
    )
    worst_hf, worst_nemo, off_minimum = float("inf"), float("inf"), []
    for model, tp in cases:
        for sp in (False, True):
            report = build_cost_report(
                str(CONFIGS / MODELS[model]),
                ["hf", "nemo"],
                tp_size=tp,
                seq_len=SEQ_LEN,
                micro_batch=MICRO_BATCH,
                dtype=DTYPE,
                sequence_parallel=sp,
            )
            plangen, hf, nemo = report.plans
            mine = plangen.sent_bytes("TP")
            hf_ratio, nemo_ratio = hf.sent_bytes("TP") / mine, nemo.sent_bytes("TP") / mine
            hidden = _hidden_size(report.model)
            minimum = megatron_minimum_per_layer(hidden, tp)
            at_minimum = activation_bytes_per_layer(plangen, report.layers) / minimum
            counts = activation_counts_per_layer(plangen, report.layers)
            expected = {"all-reduce": 4} if not sp else {"all-gather": 4, "reduce-scatter": 4}
            if abs(at_minimum - 1) > 1e-9 or counts != expected:
                off_minimum.append(f"{model} TP {tp} {'SP' if sp else 'TP'}: {at_minimum:.3f}x, {counts}")
            worst_hf, worst_nemo = min(worst_hf, hf_ratio), min(worst_nemo, nemo_ratio)
            section.rows.append(
                [
                    model,
                    str(tp),
                    "SP" if sp else "TP",
                    format_gib(mine),
                    format_ratio(hf_ratio),
                    format_ratio(nemo_ratio),
                    format_ratio(at_minimum),
                    f"{plangen.count('TP')} / {hf.count('TP')} / {nemo.count('TP')}",
                ]
            )
    section.goals = [
        Goal(
            "plangen never sends more than the Hugging Face plan",
            worst_hf >= 1,
            f"smallest HF / plangen {worst_hf:.2f}x",
        ),
        Goal(
            "plangen never sends more than the NeMo-RL-style plan",
            worst_nemo >= 1,
            f"smallest NeMo / plangen {worst_nemo:.2f}x",
        ),
        Goal(
            "plangen's per-layer activation traffic is the Megatron minimum (4 all-reduces, or 4 all-gathers + 4 reduce-scatters, of B·S·H)",
            not off_minimum,
            "every row" if not off_minimum else "; ".join(off_minimum),
        ),
    ]
    section.notes = [
        "HF has no sequence parallel: its SP rows repeat its TP plan. NeMo's SP plan gathers the sequence once per "
        "projection (five per layer), plangen's once per block (two). Per-layer norm-gradient all-reduces (H and D "
        "elements) are in the totals, not in the Megatron column."
    ]
    return section


def _hidden_size(config_path: str) -> int:
    import json

    return json.loads(Path(config_path).read_text())["hidden_size"]

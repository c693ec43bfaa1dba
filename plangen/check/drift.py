"""``plangen verify --run --drift``: how far a plan's outputs move from one device's (TP=1).

Row-parallel layers sum partial results across ranks in another order than one device's matmul,
so logits move with the TP size (NeMo RL's TP-accuracy guide); the stable plan variant
(:mod:`plangen.plans.variants`) has no such sums in the forward. The drift report applies a plan
file at each TP size of :data:`DRIFT_TP_SIZES` over gloo, on the shrunk model of its class, in
float32 and bfloat16, and compares the logits and the next-token log-probabilities with the
unsharded model's on the same batch: max and mean absolute difference, and whether they are
bitwise equal. Nothing is judged: the figures are reported (text, or JSON for CI).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

DRIFT_TP_SIZES = (2, 4)
DRIFT_DTYPES = ("float32", "bfloat16")
WORLD_SIZE = max(DRIFT_TP_SIZES)  # each TP size runs on all ranks: TP 2 as two replicas
DRIFT_TARGET = "plangen.check.drift:drift_worker"


@dataclass(frozen=True)
class DriftRow:
    """One plan at one TP size and dtype, against the unsharded model (TP=1)."""

    path: str
    tp_size: int
    dtype: str
    logits_max: float
    logits_mean: float
    logprobs_max: float
    logprobs_mean: float
    bitwise: bool  # logits bit for bit those of TP=1
    error: str | None = None


def _differences(logits: Any, reference: Any, ids: Any) -> dict[str, Any]:
    import torch

    def logprobs(x: Any) -> Any:  # of each next token, in float32 as RL losses take them
        return torch.log_softmax(x[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    dl = (logits.float() - reference.float()).abs()
    dp = (logprobs(logits) - logprobs(reference)).abs()
    return {
        "logits_max": dl.max().item(),
        "logits_mean": dl.mean().item(),
        "logprobs_max": dp.max().item(),
        "logprobs_mean": dp.mean().item(),
        "bitwise": bool(torch.equal(logits, reference)),
    }


def measure_drift(case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """On every rank of a :data:`WORLD_SIZE` gloo group: the rows of one plan file."""
    import copy

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from plangen.check.run import full_tensor, sample_batch
    from plangen.model.resolve import resolve_model
    from plangen.plan.source import load_custom_plan
    from plangen.model.shrink import build_tiny_model
    from plangen.runtime.tensor_parallel import apply_tp

    base = build_tiny_model(resolve_model(case["model"]), tp_size=WORLD_SIZE, seed=0)
    ids = sample_batch(base, WORLD_SIZE)
    rows = []
    for dtype in DRIFT_DTYPES:
        model = copy.deepcopy(base).to(getattr(torch, dtype))
        with torch.no_grad():
            reference = model(input_ids=ids).logits
        for tp in DRIFT_TP_SIZES:
            row = {"path": case["path"], "tp_size": tp, "dtype": dtype}
            try:
                mesh = init_device_mesh("cpu", (WORLD_SIZE // tp, tp), mesh_dim_names=("rep", "tp"))
                sharded = copy.deepcopy(model)
                apply_tp(sharded, mesh["tp"], load_custom_plan(case["path"]))
                with torch.no_grad():
                    logits = full_tensor(sharded(input_ids=ids).logits)
                row.update(_differences(logits, reference, ids))
            except Exception as err:  # reported per row: one failing size must not hide the others
                nan = float("nan")
                row.update(
                    logits_max=nan,
                    logits_mean=nan,
                    logprobs_max=nan,
                    logprobs_mean=nan,
                    bitwise=False,
                    error=f"{type(err).__name__}: {' '.join(str(err).split())}"[:300],
                )
            rows.append(row)
    return rows


def drift_worker(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case in payload["cases"]:
        rows += measure_drift(case)
    return rows


def drift_cases(paths: Sequence[str], options: Any) -> list[dict[str, str]]:
    """Each file with the model it is for (``--model``, else its ``PLANGEN_MODEL``), as verify reads it."""
    from plangen.check import VerifyUsageError, plan_settings

    cases = []
    for path in paths:
        model = plan_settings(path, options).model
        if model is None:
            raise VerifyUsageError(f"{path}: --drift needs the model: pass --model or record PLANGEN_MODEL")
        cases.append({"path": path, "model": model})
    return cases


def check_drift(cases: Sequence[Mapping[str, str]], timeout: float = 600.0) -> list[DriftRow]:
    """``cases``: ``{"path": plan file, "model": its model spec}``; the rows of rank 0 (every rank
    compares the same full logits)."""
    from plangen.distributed.launch import run_distributed

    per_rank = run_distributed(DRIFT_TARGET, WORLD_SIZE, {"cases": list(cases)}, timeout=timeout)
    return [DriftRow(**row) for row in per_rank[0]]


def render_drift_text(rows: Sequence[DriftRow]) -> str:
    lines = ["drift from TP=1 (shrunk model, gloo, same batch): max / mean |difference|"]
    header = f"  {'TP':>2}  {'dtype':<8}  {'logits max':>10}  {'mean':>9}  {'logprobs max':>12}  {'mean':>9}  bitwise"
    path = None
    for row in rows:
        if row.path != path:
            path = row.path
            lines += [f"{path}:", header]
        if row.error:
            lines.append(f"  {row.tp_size:>2}  {row.dtype:<8}  error: {row.error}")
            continue
        lines.append(
            f"  {row.tp_size:>2}  {row.dtype:<8}  {row.logits_max:>10.3g}  {row.logits_mean:>9.3g}"
            f"  {row.logprobs_max:>12.3g}  {row.logprobs_mean:>9.3g}  {'yes' if row.bitwise else 'no'}"
        )
    return "\n".join(lines) + "\n"


def render_drift_json(rows: Sequence[DriftRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]


__all__ = [
    "DRIFT_DTYPES",
    "DRIFT_TP_SIZES",
    "DriftRow",
    "check_drift",
    "drift_cases",
    "render_drift_json",
    "render_drift_text",
]

"""``plangen cost`` on every real config at TP 1-8 (DP 2, sequence parallel where the plan has it):
each case is costed or refused in one line with the right reason, never an internal error.

The whole sweep (``scripts/sweep_cost.py``, the table of docs/cost.md; about 4 minutes) is ``slow``.
The default run checks every refusal (made before anything is measured), TP 1 of every config, and
the real configs that once failed (Mixtral-8x7B at TP 4: grouped_mm's 16-byte strides on CPU;
gpt-oss-20b: no sdpa, at TP 2, where its shrunk model is smallest): about 15 s on a quiet machine
(each measured case is five shrunk steps under CommDebugMode, 3-8 s; several times that under load).
"""

from __future__ import annotations

import pytest

from conftest import DATA
from plangen.cost.sweep import SWEEP_TP_SIZES, render_sweep_summary, render_sweep_table, sweep_cost, sweep_cost_case

CONFIGS = sorted((DATA / "model-configs").glob("*.json"))
# Once failed: "strides should be multiple of 16 bytes" (Mixtral at TP 4), "does not support ...
# scaled_dot_product_attention" (gpt-oss).
ONCE_FAILED = [("mixtral-8x7b", 4), ("gpt-oss-20b", 2)]
# A well-sharded plan: at most this much above the ideal per rank, and at least this share sharded.
# (KV heads replicated where TP exceeds them cost the most: Qwen2.5-1.5B at TP 6, 1.07x.)
MEMORY_OVER_IDEAL, SHARDED_SHARE = 1.10, 0.98


def expected_refusal(config, tp_size: int) -> str | None:
    """The largest legal TP size the refusal must name, from the heads (KV heads may be replicated),
    as a message fragment; None where the heads allow ``tp_size``."""
    from plangen.model.heads import head_counts, largest_legal_tp_size, legal_tp_size
    from plangen.model.resolve import config_for_class, resolve_model

    resolved = resolve_model(str(config))
    heads, kv_heads = head_counts(config_for_class(resolved.config, resolved.model_class))
    if legal_tp_size(heads, kv_heads, tp_size, replicate_kv=True):
        return None
    largest = largest_legal_tp_size(heads, kv_heads, tp_size, replicate_kv=True)
    return f"the largest legal TP size for {resolved.model_class.__name__} is {largest} "


def check_case(case, config) -> None:
    expected = expected_refusal(config, case.tp_size)
    if expected is not None:
        assert case.refusal is not None and expected in case.refusal, (case.config, case.tp_size, case.refusal)
        assert "\n" not in case.refusal and case.refusal.startswith(f"--tp-size {case.tp_size}: ")
        return
    assert case.works, (case.config, case.tp_size, case.refusal)
    assert case.no_sp is None, (case.config, case.tp_size, case.no_sp)  # every config's plan has SP
    assert case.sequence_parallel == (case.tp_size > 1)
    if case.tp_size == 1:
        assert (case.memory_bytes, case.tp_sharded_fraction) == (case.ideal_bytes, 0.0)
    else:
        assert case.memory_bytes < MEMORY_OVER_IDEAL * case.ideal_bytes, (case.config, case.tp_size)
        assert case.tp_sharded_fraction > SHARDED_SHARE, (case.config, case.tp_size)


def _quick_cases() -> list[tuple[str, int]]:
    cases = [(c.stem, 1) for c in CONFIGS] + ONCE_FAILED
    cases += [(c.stem, tp) for c in CONFIGS for tp in SWEEP_TP_SIZES if expected_refusal(c, tp) is not None]
    return cases


@pytest.mark.parametrize("name, tp_size", _quick_cases())
def test_cost_works_or_refuses_with_the_largest_legal_tp_size(fake_pg, name, tp_size):
    config = DATA / "model-configs" / f"{name}.json"
    check_case(sweep_cost_case(config, tp_size), config)


@pytest.mark.slow
def test_cost_sweep_of_every_config_at_tp_1_to_8(fake_pg):
    cases = sweep_cost(CONFIGS)
    by_name = {c.stem: c for c in CONFIGS}
    for case in cases:
        check_case(case, by_name[case.config])
    table = render_sweep_table(cases)
    assert len(table.splitlines()) == 2 + len(CONFIGS)
    assert render_sweep_summary(cases).startswith(f"{sum(c.works for c in cases)} of {len(CONFIGS) * 8} cases costed")

"""Plan variants: ``optimized`` (the Megatron-style plans as written) and ``stable``.

``stable`` follows NeMo RL's TP-accuracy guide: row-parallel layers sum partial results across
ranks (an all-reduce or reduce-scatter) in an order that differs from one device's matmul, so the
outputs move with the TP size. The stable variant rewrites each row-parallel linear (a
``RowwiseParallel`` entry whose input is feature-sharded, ``Shard(-1)``: ``o_proj``,
``down_proj``) into a column-parallel one on a gathered input: its input is all-gathered
(``Shard(-1)`` -> ``Replicate``), each rank computes its slice of output features from the whole
input, and the output is all-gathered to ``Replicate``. The forward then has all-gathers only, no
cross-rank sums; the backward still sums (the input gradient of a column-parallel linear is a
partial sum, reduce-scattered). The weights stay sharded over TP (now by output rows).

The vocab-parallel embedding keeps its all-reduce: each token's row lives on one rank, the others
add exact zeros, so that sum is exact in any order.

This module is the one place that says what ``stable`` changes; :func:`plangen.plans.choice.choose_plan`
applies it to any plan given as data (hand-written, synthesized, Hugging Face).
"""

from __future__ import annotations

from dataclasses import replace

from plangen.plan import Plan, PlanEntry, VariantError, check_variant  # noqa: F401 - re-exported

DEFAULT_VARIANT = "optimized"

# Styles whose forward sums partial results across TP ranks and that the stable variant cannot
# rewrite into a gather: the plan is refused rather than silently left with a sum.
_SUMMING_STYLES = (
    "PackedRowwiseParallel",
    "Conv1DRowwiseParallel",
    "RowwiseParallelOwnOutput",
    "ExpertsParallel",
    "ShardedNormParallel",
)


def _feature_sharded_input(entry: PlanEntry) -> bool:
    from torch.distributed.tensor import Shard

    layouts = entry.kwargs.get("input_layouts")
    return isinstance(layouts, Shard) and layouts.dim == -1


def stable_entry(entry: PlanEntry) -> PlanEntry:
    """A row-parallel linear as a column-parallel one on its all-gathered input, output replicated."""
    from torch.distributed.tensor import Replicate, Shard

    return PlanEntry(
        entry.pattern,
        "ColwiseParallel",
        {"input_layouts": Shard(-1), "output_layouts": Replicate(), "use_local_output": True},
        entry.group,
        "stable variant: column-parallel on the all-gathered input, output all-gathered: no cross-rank sum in forward",
    )


def build_stable_plan(plan: Plan) -> Plan:
    """``plan`` with every cross-rank sum of its forward replaced by all-gathers (pure)."""
    if plan.sequence_parallel:
        raise VariantError(
            "the stable variant has no sequence parallel: its residual stream stays replicated "
            "(sequence parallel reduce-scatters it, a cross-rank sum): use sequence_parallel=False"
        )
    entries = []
    for entry in plan.entries:
        if entry.style in _SUMMING_STYLES:
            raise VariantError(
                f"no stable variant for {entry.pattern}: its style {entry.style} sums across TP ranks in forward"
            )
        if entry.style == "RowwiseParallel" and _feature_sharded_input(entry):
            entry = stable_entry(entry)
        entries.append(entry)
    return replace(plan, entries=tuple(entries))


def build_plan_variant(plan: Plan, variant: str) -> Plan:
    """``plan`` as ``variant`` asks: as written (``optimized``) or :func:`build_stable_plan`."""
    return build_stable_plan(plan) if check_variant(variant) == "stable" else plan

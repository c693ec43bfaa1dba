"""The registry of hand-written ("optimized") plans, keyed by model class name.

Plans are data (:class:`plangen.plan.Plan`); the runtime turns them into styles. Keying by class
*name* keeps this module free of transformers' modeling imports, so the CLI can list and render
plans without loading every architecture.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from plangen.plan import Plan

PlanBuilder = Callable[[nn.Module, bool], Plan]

HAND_WRITTEN: dict[str, PlanBuilder] = {}

# Which decoder blocks to checkpoint, by class name; absent: every block.
CHECKPOINT_FILTERS: dict[str, Callable[[nn.Module], bool]] = {}


def register_plan(*class_names: str) -> Callable[[PlanBuilder], PlanBuilder]:
    """Register ``builder(model, sequence_parallel) -> Plan`` for each class name."""

    def decorate(builder: PlanBuilder) -> PlanBuilder:
        for name in class_names:
            if name in HAND_WRITTEN:
                raise ValueError(f"a plan for {name} is already registered")
            HAND_WRITTEN[name] = builder
        return builder

    return decorate


def build_optimized_plan(model: nn.Module, sequence_parallel: bool) -> Plan | None:
    """The hand-written plan for ``model``'s class, or None when there is none."""
    builder = HAND_WRITTEN.get(type(model).__name__)
    return None if builder is None else builder(model, sequence_parallel)


def build_seed_plan(model: nn.Module, sequence_parallel: bool) -> Plan:
    """The plan to start a custom plan from: what the runtime would use, else the best candidate.

    Order: the hand-written plan (its error, if it has no SP variant, is final, as at run time);
    the synthesized plan where the sweep proved it; the Hugging Face plan (no SP); the synthesized
    plan although unproven (``plan.source == "synthesized"`` and
    ``is_proven(type(model).__name__, sequence_parallel)`` is False: a start to edit and verify).
    Raises a one-line ``ValueError`` saying why when there is none.
    """
    from plangen.plans.proven import is_proven
    from plangen.plans.synthesize import build_synthesized_plan

    class_name = type(model).__name__
    optimized = build_optimized_plan(model, sequence_parallel)
    if optimized is not None:
        return optimized
    try:
        synthesized: Plan | None = build_synthesized_plan(model, sequence_parallel)
        synthesis_error = ""
    except ValueError as err:
        synthesized, synthesis_error = None, str(err)
    if synthesized is not None and is_proven(class_name, sequence_parallel):
        return synthesized
    if sequence_parallel:
        hf_error = "Hugging Face plans have no sequence parallel"
    else:
        from plangen.hf_plan import build_hf_plan

        try:
            return build_hf_plan(model)
        except ValueError as err:
            hf_error = str(err).rstrip(".")
    if synthesized is not None:
        return synthesized
    raise ValueError(f"no plan for {class_name}: {hf_error}; {synthesis_error}")


# Importing the families registers their plans.
from plangen.plans import dense, hybrid  # noqa: E402,F401

"""The registry of hand-written plans, keyed by model class name.

Which plan a model gets (custom, hand-written, synthesized, Hugging Face) is decided in one place:
:func:`plangen.plans.choice.choose_plan`.

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


# Importing the families registers their plans.
from plangen.plans import dense, hybrid  # noqa: E402,F401

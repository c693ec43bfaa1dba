"""The registry of hand-written plans: builders by model class name, and activation-checkpoint filters.

Its own module so that the plan families (``dense``, ``hybrid``, ``moe``) register themselves
without importing the package that imports them.
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

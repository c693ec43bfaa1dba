"""The registry of hand-written plans: builders by model class name, and activation-checkpoint filters.

Its own module so that the plan families (``dense``, ``hybrid``, ``moe``) register themselves
without importing the package that imports them.
"""

from __future__ import annotations

import functools
from typing import Callable

from torch import nn

from plangen.plan import Plan
from plangen.plans.tied import tie_plan_entries

PlanBuilder = Callable[[nn.Module, bool], Plan]

HAND_WRITTEN: dict[str, PlanBuilder] = {}

# Which decoder blocks to checkpoint, by class name; absent: every block.
CHECKPOINT_FILTERS: dict[str, Callable[[nn.Module], bool]] = {}


def register_plan(*class_names: str) -> Callable[[PlanBuilder], PlanBuilder]:
    """Register ``builder(model, sequence_parallel) -> Plan`` for each class name.

    The registered builder (also what the decorator returns) gives a tied embedding and head the
    pair of tied styles (:func:`plangen.plans.tied.tie_plan_entries`), so every hand-written plan
    keeps the tie by itself, under any runtime.
    """

    def decorate(builder: PlanBuilder) -> PlanBuilder:
        @functools.wraps(builder)
        def tied_builder(model: nn.Module, sequence_parallel: bool) -> Plan:
            return tie_plan_entries(model, builder(model, sequence_parallel))

        for name in class_names:
            if name in HAND_WRITTEN:
                raise ValueError(f"a plan for {name} is already registered")
            HAND_WRITTEN[name] = tied_builder
        return tied_builder

    return decorate

"""The registry of hand-written plans, keyed by model class name.

Which plan a model gets (custom, hand-written, synthesized, Hugging Face) is decided in one place:
:func:`plangen.plans.choice.choose_plan`.

Plans are data (:class:`plangen.plan.Plan`); the runtime turns them into styles. Keying by class
*name* keeps this module free of transformers' modeling imports, so the CLI can list and render
plans without loading every architecture.
"""

from __future__ import annotations

from plangen.plans.registry import CHECKPOINT_FILTERS, HAND_WRITTEN, PlanBuilder, register_plan

__all__ = ["CHECKPOINT_FILTERS", "HAND_WRITTEN", "PlanBuilder", "register_plan"]

# Importing the families registers their plans.
from plangen.plans import cpmant, dense, fused, hybrid, moe, rwkv, zamba2  # noqa: E402,F401

"""Plans as data: which plan a model gets, and how each is made.

Which plan a model gets (custom, hand-written, synthesized, Hugging Face) is decided in one place:
:func:`plangen.plans.choice.choose_plan`. Around it:

- hand-written plans, registered by class name (:mod:`~plangen.plans.registry`): dense decoders
  (``dense``), fused projections (``fused``), hybrids (``hybrid``, ``zamba2``), mixtures of experts
  (``moe``), CpmAnt (``cpmant``) and RWKV (``rwkv``), with the entries every plan shares (``tied``,
  ``layouts``) and a model's own Hugging Face plan as data (``hf_plan``);
- :mod:`plangen.plans.families`: the block families, each recognizing its blocks and writing their
  plan entries (used by the hand-written plans and the synthesizer alike);
- :mod:`plangen.plans.source`: reading a block's forward source;
- :mod:`plangen.plans.synthesis`: the synthesizer, a plan for any class from its modules;
- the plan's variants (``variants``), the proofs (``proven``) and the runtime's checks of a plan
  against a model (``checks``).

Plans are data (:class:`plangen.plan.Plan`); the runtime turns them into styles. Keying by class
*name* keeps this package free of transformers' modeling imports, so the CLI can list and render
plans without loading every architecture.
"""

from __future__ import annotations

from plangen.plans.registry import CHECKPOINT_FILTERS, HAND_WRITTEN, PlanBuilder, register_plan

__all__ = ["CHECKPOINT_FILTERS", "HAND_WRITTEN", "PlanBuilder", "register_plan"]

# Importing the families registers their plans.
from plangen.plans import cpmant, dense, fused, hybrid, moe, rwkv, zamba2  # noqa: E402,F401

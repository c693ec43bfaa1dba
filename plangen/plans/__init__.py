"""Plans as data: which plan a model gets, and how each is made.

Which plan a model gets (custom, hand-written, synthesized, Hugging Face) is decided in one place:
:func:`plangen.plans.choice.choose_plan`. The modules here do five jobs:

- hand-written plans, registered by class name (:mod:`~plangen.plans.registry`): dense decoders
  (``dense``), fused projections (``fused``), hybrids (``hybrid``, ``zamba2``), mixtures of experts
  (``moe``), CpmAnt (``cpmant``) and RWKV (``rwkv``);
- plan entries per block family, shared by the hand-written and the synthesized plans: ``latent``,
  ``mamba1``, ``mamba2``, ``linear_attention``, ``recurrent``, ``bucketed``, ``tied``,
  ``layer_experts``, ``per_layer_inputs``, ``towers``, ``layouts``;
- recognizers, which read a block's family from its modules and shapes (``recognize*``, driven by
  ``analysis``);
- readers of a block's forward source (``forward_source``, the public home; ``*_source``);
- the synthesizer (``synthesize``), its variants (``variants``), the proofs (``proven``) and the
  choice (``choice``).

Plans are data (:class:`plangen.plan.Plan`); the runtime turns them into styles. Keying by class
*name* keeps this package free of transformers' modeling imports, so the CLI can list and render
plans without loading every architecture.
"""

from __future__ import annotations

from plangen.plans.registry import CHECKPOINT_FILTERS, HAND_WRITTEN, PlanBuilder, register_plan

__all__ = ["CHECKPOINT_FILTERS", "HAND_WRITTEN", "PlanBuilder", "register_plan"]

# Importing the families registers their plans.
from plangen.plans import cpmant, dense, fused, hybrid, moe, rwkv, zamba2  # noqa: E402,F401

"""Tied embeddings in plan data: both ends of the tie get the pair of tied styles.

A plan that shards a tied embedding with ``RowwiseParallel`` and its head with ``ColwiseParallel``
is right under plangen's runtime, which re-ties the two parameters ``parallelize_module`` makes
(:func:`plangen.runtime.tensor_parallel.apply_retie`), and wrong under any runtime that does not (NeMo RL's
``_parallelize_model``): :func:`tie_plan_entries` turns the two entries into the pair
:class:`~plangen.styles.tied.TiedEmbeddingParallel` / :class:`~plangen.styles.tied.TiedHeadParallel`
(same arguments, same layouts), which keeps one parameter by itself. Pure: plan data in, plan data
out. Hand-written plans (:func:`plangen.plans.registry.register_plan`), synthesized plans and
``plangen init`` (:mod:`plangen.commands.render`) all pass their plans through it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from plangen.model.module_tree import key_matches, tied_embeddings
from plangen.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

# The vocabulary sharding at each end, and the tied style that keeps the same arguments.
TIED_STYLE_OF = {
    "embedding": ("RowwiseParallel", "TiedEmbeddingParallel"),
    "head": ("ColwiseParallel", "TiedHeadParallel"),
}
# An embedding that scales its own lookup, untied, and its tied form (the same local lookup).
SCALED, SCALED_TIED_KWARGS = "ScaledEmbeddingParallel", {"local_lookup": True}


def _covering_index(plan: Plan, path: str) -> int | None:
    # The last matching key wins, as parallelize_module applies them in order.
    found = [i for i, entry in enumerate(plan.entries) if key_matches(entry.pattern, path)]
    return found[-1] if found else None


def tie_plan_entries(model: "nn.Module", plan: Plan) -> Plan:
    """``plan`` with its tied embedding and head entries as the tied pair; unchanged when the model
    has no tie, or when either end is not vocabulary-sharded (a plan that leaves one end whole or
    shards the embedding's hidden dim is not rewritten: PG208 and the runtime judge it)."""
    tied = tied_embeddings(model)
    if tied is None:
        return plan
    entries = list(plan.entries)
    for path, end in zip(tied, ("embedding", "head")):
        index = _covering_index(plan, path)
        plain, paired = TIED_STYLE_OF[end]
        if index is not None and end == "embedding" and entries[index].style == SCALED:
            entries[index] = replace(
                entries[index], style=plain, kwargs={**entries[index].kwargs, **SCALED_TIED_KWARGS}
            )
        if index is None or entries[index].style not in (plain, paired):
            return plan
        partner = tied[1] if end == "embedding" else tied[0]
        why = entries[index].why
        note = f"one weight with {partner} (tied), sharded once"
        if entries[index].style == plain:
            entries[index] = replace(entries[index], style=paired, why=f"{why}; {note}" if why else note)
    return replace(plan, entries=tuple(entries))


__all__ = ["TIED_STYLE_OF", "tie_plan_entries"]

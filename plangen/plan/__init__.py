"""A parallel plan as data.

A plan stays data (pattern, style name, keyword arguments, the reason) until the runtime turns it
into torch ``ParallelStyle`` objects with :func:`plangen.styles.build_parallel_styles`. The same data renders the
generated plan file, feeds the checks, and applies at run time, so the three cannot disagree.

Keyword values are plain Python values or torch placements (``Shard(1)``, ``Replicate()``), and
tuples of those; ``None`` is kept where a style takes it for a non-tensor argument.

Beside the data, torch-free like it: the words styles are described in
(:mod:`~plangen.plan.style_facts`), every style's facts as a generated table
(:mod:`~plangen.plan.style_table`), loading a user's plan from a dotted path (:mod:`~plangen.plan.source`)
and the runtimes a plan is handed to (:mod:`~plangen.plan.targets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

# Where a plan came from, in the order of priority used by the runtime.
PlanSource = Literal["custom", "hand-written", "synthesized", "hf"]

# Plan variants (plangen.plans.variants says what each changes); here, torch-free, for verify --static.
VARIANTS: tuple[str, ...] = ("optimized", "stable")


class VariantError(ValueError):
    """The variant is unknown, or the plan has no form without cross-rank sums in the forward."""


def check_variant(variant: str) -> str:
    """``variant`` if it is known; a one-line :class:`VariantError` naming the known ones otherwise.
    Torch-free, so ``plangen init`` refuses a bad ``--variant`` before importing anything heavy."""
    if variant not in VARIANTS:
        raise VariantError(f"unknown plan variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    return variant


# Groups in the order the generated file lists them.
GROUPS = ("embeddings", "attention", "mlp", "norms", "output", "other")
# The share of a model's parameters a plan should shard over TP at its class's default size: below
# it, much of the model stays on every TP rank (plangen list flags it; MLA's rule aims at it).
WELL_SHARDED = 0.95


@dataclass(frozen=True)
class PlanEntry:
    """One plan line: modules matching ``pattern`` get style ``style(**kwargs)``."""

    pattern: str
    style: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    group: str = "other"
    why: str = ""


@dataclass(frozen=True)
class Replicated:
    """A module the plan leaves replicated on purpose, and why (shown, commented out, in files)."""

    pattern: str
    why: str
    group: str = "other"


@dataclass(frozen=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    source: PlanSource
    replicated: tuple[Replicated, ...] = ()
    sequence_parallel: bool = False

    def patterns(self) -> list[str]:
        return [e.pattern for e in self.entries]

"""The cost report as data: what the renderers print and the JSON output serialises."""

from __future__ import annotations

from dataclasses import dataclass

from plangen.cost.settings import CostSettings

SOURCES = ("TP", "FSDP2")
PHASES = ("forward", "backward")


@dataclass(frozen=True)
class MemoryCost:
    """Bytes one rank holds for the training state (rank 0, the largest when shards are uneven)."""

    parameters: int
    gradients: int
    optimizer: int  # AdamW: exp_avg and exp_avg_sq
    # Of the total: bytes of tensors that TP leaves whole on every TP rank (sharded by FSDP2 only).
    replicated: int
    # The whole model's parameters, gradients and optimizer state divided by DP x TP.
    ideal: int
    model_parameters: int  # elements, whole model
    local_parameters: int  # elements, one rank
    tp_sharded_parameters: int  # elements, whole model, of the parameters TP shards (the rest it leaves whole)

    @property
    def tp_sharded_fraction(self) -> float:
        """The share of the model's parameter elements that TP shards (0 for a model without any)."""
        return self.tp_sharded_parameters / self.model_parameters if self.model_parameters else 0.0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


@dataclass(frozen=True)
class CollectiveCost:
    """Collectives of one kind, on one tensor, in one phase of a training step, at the real size."""

    source: str  # "TP" (the plan's activations and gradients) or "FSDP2" (parameters and gradients)
    phase: str  # "forward" or "backward"
    kind: str  # "all-reduce", "all-gather", "reduce-scatter", ...
    tensor: str  # what moves: "B·S·H" (micro-batch x sequence x hidden), "layer params", ...
    scope: str  # "per layer" (count is over every layer) or "once"
    count: int
    payload_bytes: int  # the full tensor of each collective (the gathered one, the one reduced), summed
    sent_bytes: int  # bytes each rank sends, ring algorithms, summed


@dataclass(frozen=True)
class PlanCost:
    name: str  # the plan's source or name: "hand-written", "hf", "nemo", a file
    description: str
    memory: MemoryCost
    collectives: tuple[CollectiveCost, ...]
    notes: tuple[str, ...] = ()

    def sent_bytes(self, source: str | None = None) -> int:
        return sum(c.sent_bytes for c in self.collectives if source is None or c.source == source)

    def count(self, source: str | None = None) -> int:
        return sum(c.count for c in self.collectives if source is None or c.source == source)


@dataclass(frozen=True)
class CostReport:
    model: str  # the spec as given (or read from the plan file)
    model_class: str
    layers: int
    settings: CostSettings
    plans: tuple[PlanCost, ...]  # the subject first, then the alternatives in the order asked

"""What :func:`plangen.plans.synthesis.analysis.analyze_model` collects while it walks a model: the blocks it
shards at concrete paths, the replicated blocks it can wrap under sequence parallelism, and what it
keeps whole and why. Plain data, shared by the walkers of :mod:`plangen.plans.synthesis.analysis` and
:mod:`plangen.plans.synthesis.analysis_split`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plangen.plan import Replicated
from plangen.plans.source.forward import BlockCall
from plangen.plans.families.block import FamilyBlock
from plangen.plans.families.per_head_inputs import PerHeadInput


@dataclass(frozen=True)
class BlockPart:
    """A sharded block at a concrete module path, and how its layer calls it (None: unknown)."""

    path: str  # for a SplitBlock: the parent of its two halves
    block: FamilyBlock  # a family's recognized block (plangen.plans.families), which writes its own entries
    call: BlockCall | None  # for a SplitBlock: how the parent calls its inner half
    # The layer modifies the block's output in place (Falcon: mlp_output += attention_output).
    modified_in_place: bool = False
    # Keywords of an attention block stacking every batch row's heads on dim 0, built for all heads
    # outside it (Bloom's alibi): its input style keeps this rank's heads' rows.
    batch_head_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeptPart:
    """A replicated block of a decoder layer that its layer calls in a way the reader could follow.

    Under sequence parallelism such a block gets the whole sequence (one all-gather of its input)
    and hands back this rank's sequence shard of its output (a local slice; its gradient is
    all-gathered in backward): it computes whole and identical on every rank, as under plain TP.
    """

    path: str
    call: BlockCall
    # Places in the block's output tuple that hold its own parameters (GPT-NeoX-Japanese's dense_bias,
    # which its layer adds to the sequence-sharded output): handed out as Replicate DTensors.
    parameter_outputs: frozenset[int] = frozenset()


@dataclass
class Findings:
    norms: list[str] = field(default_factory=list)
    blocks: list[BlockPart] = field(default_factory=list)
    kept: list[Replicated] = field(default_factory=list)
    gathered: list[KeptPart] = field(default_factory=list)
    sp_problems: list[str] = field(default_factory=list)
    head_inputs: list[tuple[str, PerHeadInput]] = field(default_factory=list)
    token_tables: list[tuple[str, bool]] = field(default_factory=list)
    residual_parameters: list[str] = field(default_factory=list)
    row_readers: list[tuple[str, str]] = field(default_factory=list)

    def add_norm(self, path: str, call: BlockCall | None) -> None:
        """A norm on the residual stream; SequenceParallel prepares its first positional input."""
        self.norms.append(path)
        if call is None or call.positional < 1:
            self.sp_problems.append(f"cannot read that {path} takes the hidden state as its first argument")

    def keep(self, path: str, why: str, group: str, sp_problem: str | None = None) -> None:
        self.kept.append(Replicated(path, why, group))
        if sp_problem is not None:
            self.sp_problems.append(sp_problem)

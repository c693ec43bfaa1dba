"""What each registered parallel style does to a module, as data that needs no torch.

One :class:`StyleFacts` per style name of :data:`plangen.styles.STYLE_CLASSES`: which weight dim it
splits for each kind of module, whether it keeps the weights whole instead, what torch fills in for
a layout argument left ``None``, and what the module computes before its output is redistributed.
``plangen init`` describes shard shapes and writes defaults out from it, the level-2 rules ask it
what a style is (:func:`plangen.styles.style_facts`), and the torch-free static tables
(:mod:`plangen.check.known_styles`) derive theirs from it, so the answer lives here only.

Placements are written as plan files write them (``"Shard(-1)"``, ``"Replicate()"``), except
``"Partial(sum)"``, the reduce op being what the static checks compare.
``tests/test_styles.py`` applies every style to real modules and compares with this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

TORCH_STYLES = "torch.distributed.tensor.parallel"
PLANGEN_STYLES = "plangen.styles"

# The module kinds a style can split, by the weight layout torch gives them.
LINEAR = "linear"
EMBEDDING = "embedding"


@dataclass(frozen=True)
class StyleFacts:
    """What the style ``name`` does to the module it is applied to.

    ``role`` is the word the level-2 rules group styles by: ``colwise``, ``rowwise``,
    ``gather_output`` (prepares outputs), ``prepare_input``, ``grad_reduce``, ``sequence``, ``none``
    (applies nothing) or ``other``.
    """

    name: str
    module: str  # where a plan file imports it from
    role: str
    # Weight dim split across TP ranks, by module kind; empty when the weights are not split.
    shard_dim: Mapping[str, int] = field(default_factory=dict)
    # The split keeps packed parts ([gate; up]) apart: a _StridedShard, not a Shard.
    strided: bool = False
    # Every rank keeps the whole weights (as Replicate() DTensors when ``replicate_dtensor``).
    replicates: bool = False
    replicate_dtensor: bool = False
    # The placement torch uses for a layout argument given as None (or left out).
    layout_defaults: Mapping[str, str] = field(default_factory=dict)
    # What the module computes before it is redistributed to ``output_layouts``.
    produces: str | None = None

    @property
    def shards(self) -> bool:
        """The style splits the module's weights across TP ranks."""
        return bool(self.shard_dim)

    def weight_layout(self, module_kind: str) -> str:
        """The layout of the weight of a ``module_kind`` module ("plain" for an ordinary tensor)."""
        if self.shards:
            dim = self.shard_dim.get(module_kind, self.shard_dim.get(LINEAR))
            return f"_StridedShard({dim})" if self.strided else f"Shard({dim})"
        return "Replicate()" if self.replicate_dtensor else "plain"


_REPLICATE = "Replicate()"
_LAST = "Shard(-1)"
_SUM = "Partial(sum)"

STYLE_FACTS: dict[str, StyleFacts] = {
    facts.name: facts
    for facts in (
        # Output features of a Linear, the hidden dim of an Embedding.
        StyleFacts(
            "ColwiseParallel",
            TORCH_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, EMBEDDING: 1},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
        ),
        # Input features of a Linear, the vocabulary of an Embedding.
        StyleFacts(
            "RowwiseParallel",
            TORCH_STYLES,
            "rowwise",
            shard_dim={LINEAR: 1, EMBEDDING: 0},
            layout_defaults={"input_layouts": _LAST, "output_layouts": _REPLICATE},
            produces=_SUM,
        ),
        StyleFacts("SequenceParallel", TORCH_STYLES, "sequence", replicates=True, replicate_dtensor=True),
        StyleFacts("PrepareModuleInput", TORCH_STYLES, "prepare_input"),
        StyleFacts("PrepareModuleOutput", TORCH_STYLES, "gather_output"),
        StyleFacts("PrepareModuleInputOutput", TORCH_STYLES, "gather_output"),
        StyleFacts("RotaryEmbedParallel", PLANGEN_STYLES, "sequence", replicates=True, replicate_dtensor=True),
        StyleFacts(
            "ReplicatedWithGradAllReduce", PLANGEN_STYLES, "grad_reduce", replicates=True, replicate_dtensor=True
        ),
        StyleFacts("AllReduceParamGrads", PLANGEN_STYLES, "grad_reduce", replicates=True),
        StyleFacts("LeaveUnsharded", PLANGEN_STYLES, "none", replicates=True),
        StyleFacts(
            "PackedColwiseParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0},
            strided=True,
            layout_defaults={"input_layouts": _REPLICATE},
        ),
        StyleFacts(
            "PackedRowwiseParallel",
            PLANGEN_STYLES,
            "rowwise",
            shard_dim={LINEAR: 1},
            strided=True,
            layout_defaults={"output_layouts": _REPLICATE},
            produces=_SUM,
        ),
        StyleFacts("MlaKvAProjParallel", PLANGEN_STYLES, "other", replicates=True),
        # NeMo RL's ColwiseParallel; gather_output=True sets output_layouts=Replicate().
        StyleFacts(
            "ColwiseParallelWithGather",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, EMBEDDING: 1},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
        ),
    )
}


"""The words plangen's styles are described in, torch-free.

A style class carries its facts (:class:`StyleFacts`: which weight dim it splits for each kind of
module, whether it keeps the weights whole instead, what torch fills in for a layout argument left
``None``, what the module computes before its output is redistributed), defined with the class
(:mod:`plangen.styles`). The table of every style's facts and keyword parameters that ``plangen
verify --static`` and ``plangen init`` read without torch (:mod:`plangen.plan.style_table`) is generated
from those classes; this module holds the vocabulary that table is written in (:class:`StyleFacts`,
:class:`StyleParam`, the module kinds, the value kinds).

Placements are written as plan files write them (``"Shard(-1)"``, ``"Replicate()"``), except
``"Partial(sum)"``, the reduce op being what the static checks compare.
Importing this module does not import torch; :func:`placement_from_text` imports it when called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.tensor import Placement

TORCH_STYLES = "torch.distributed.tensor.parallel"
PLANGEN_STYLES = "plangen.styles"

# The module kinds a style can split, by the weight layout torch gives them.
LINEAR = "linear"
EMBEDDING = "embedding"
CONV1D = "conv1d"  # GPT-2's Conv1D: an nn.Linear whose weight is stored transposed, [in, out]
EXPERTS = "experts"  # transformers' packed experts: [experts, ...] weights in one module
HEADS = "heads"  # an attention block's own per-head parameters (gpt-oss's sinks: [heads])
NORM = "norm"  # one weight value per feature (a norm), the module's only kind of parameter
FLAT_EXPERTS = "flat_experts"  # DBRX's experts: flat [experts * ffn, hidden] weights in a child
SHARED_EXPERTS = "shared_experts"  # Inkling's shared experts: 3-D [S, I, H] / [S, H, I] weights applied by bmm
SHORT_CONV = "short_conv"  # a module around one depthwise nn.Conv1d and nothing else (Inkling's k/v short convs)
HEAD_TABLE = "head_table"  # a [buckets, heads] table its module looks up itself (CpmAnt's position bias)
MIXER = "mamba1_mixer"  # a Mamba1 mixer, split by its channels (its own A_log [channels, state] and D [channels])

# How a style lays out the module's inputs and outputs, which level 2 follows through each block
# (plangen.check.flow): see StyleFacts.hooks.
MODULE_HOOKS = "module"
SEQUENCE_HOOKS = "sequence"
PREPARE_INPUT = "prepare_input"
PREPARE_OUTPUT = "prepare_output"
PREPARE_INPUT_OUTPUT = "prepare_input_output"

# Placements as the facts write them.
REPLICATE = "Replicate()"
SHARD_LAST = "Shard(-1)"
PARTIAL_SUM = "Partial(sum)"


@dataclass(frozen=True)
class StyleFacts:
    """What a style does to the module it is applied to.

    ``role`` is the word the level-2 rules group styles by: ``colwise``, ``rowwise``,
    ``gather_output`` (prepares outputs), ``prepare_input``, ``grad_reduce``, ``sequence``,
    ``sharded_norm``, ``experts``, ``none`` (applies nothing) or ``other``. A class states the rest;
    ``name`` and ``module`` (where a plan file imports it from) are filled in when it is registered.
    """

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
    # One end of a tied-embedding pair: the style the other end must have (plangen.styles.tied).
    tied_partner: str | None = None
    # How the style lays out the module's inputs and outputs: MODULE_HOOKS (a plain first input is
    # read as ``input_layouts``, the output left as ``output_layouts``, plain when
    # ``use_local_output``), SEQUENCE_HOOKS (read and left as ``sequence_sharding``), PREPARE_INPUT /
    # PREPARE_OUTPUT / PREPARE_INPUT_OUTPUT (torch's PrepareModule* attributes); None: its hooks do
    # something else, and level 2 does not judge the layouts that meet there.
    hooks: str | None = None
    # Children the style lays out itself, by name, with the role each then plays (a Mamba1 mixer's
    # in_proj column-parallel, x_proj row-parallel; a Mamba2 mixer's in_proj and conv1d, which its
    # forward reads directly): the rules count them as sharded by that role.
    lays_out_children: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    module: str = ""

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

    def default_placements(self) -> dict[str, "Placement"]:
        """What torch uses for the layout arguments given as None, as placements (imports torch)."""
        return {arg: placement_from_text(text) for arg, text in self.layout_defaults.items()}


# --- the keyword parameters of a style, as far as a literal in a plan file can show them ----------


@dataclass(frozen=True)
class ValueKind:
    """The type a keyword argument accepts, as far as a literal in the source can show it.

    ``name`` is the annotation's text in the style's signature (what the table's generator matches);
    ``base`` is ``"placement"``, ``"placement_dict"``, ``"bool"``, ``"int"`` or ``"str"``; a tuple of
    the base type is accepted when ``allows_tuple``, and ``None`` at top level / inside the tuple when
    the flags say so.
    """

    name: str
    base: str
    allows_none: bool = False
    allows_tuple: bool = False
    tuple_allows_none: bool = False


PLACEMENT_OR_NONE = ValueKind("Placement | None", "placement", allows_none=True)
PLACEMENTS_OR_NONE = ValueKind(
    "Placement | tuple[Placement | None, ...] | None",
    "placement",
    allows_none=True,
    allows_tuple=True,
    tuple_allows_none=True,
)
PLACEMENTS = ValueKind(
    "Placement | tuple[Placement | None, ...]", "placement", allows_tuple=True, tuple_allows_none=True
)
PLACEMENTS_STRICT = ValueKind("Placement | tuple[Placement, ...]", "placement", allows_tuple=True)
# The values of the kwarg-layout dicts.
PLACEMENT = ValueKind("Placement", "placement")
PLACEMENT_DICT_OR_NONE = ValueKind("dict[str, Placement] | None", "placement_dict", allows_none=True)
BOOL = ValueKind("bool", "bool")
INT = ValueKind("int", "int")
# A tuple literal of ints / of strings (a fused projection's part sizes, attribute names).
INT_TUPLE = ValueKind("tuple[int, ...]", "int", allows_tuple=True)
STR_TUPLE = ValueKind("tuple[str, ...]", "str", allows_tuple=True)
STR = ValueKind("str", "str")

# Every kind a style's keyword parameter may have, by the name the generated table writes.
VALUE_KINDS: dict[str, ValueKind] = {
    "PLACEMENT_OR_NONE": PLACEMENT_OR_NONE,
    "PLACEMENTS_OR_NONE": PLACEMENTS_OR_NONE,
    "PLACEMENTS": PLACEMENTS,
    "PLACEMENTS_STRICT": PLACEMENTS_STRICT,
    "PLACEMENT_DICT_OR_NONE": PLACEMENT_DICT_OR_NONE,
    "BOOL": BOOL,
    "INT": INT,
    "INT_TUPLE": INT_TUPLE,
    "STR_TUPLE": STR_TUPLE,
    "STR": STR,
}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


# Marks a keyword argument without a default.
REQUIRED = _Required()


@dataclass(frozen=True)
class StyleParam:
    name: str
    kind: ValueKind
    default: object = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


# --- placements, as the facts write them ------------------------------------------------------------


def placement_from_text(text: str) -> "Placement":
    """The placement a facts text names: ``Shard(-1)``, ``Replicate()``, ``Partial(sum)``."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if text == "Replicate()":
        return Replicate()
    shard = re.fullmatch(r"Shard\((-?\d+)\)", text)
    if shard is not None:
        return Shard(int(shard.group(1)))
    partial = re.fullmatch(r"Partial\((\w+)\)", text)
    if partial is not None:
        return Partial(partial.group(1))
    raise ValueError(f"not a placement: {text!r}")

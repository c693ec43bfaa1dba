"""What each registered parallel style does to a module, as data that needs no torch.

One :class:`StyleFacts` per style name of :data:`plangen.styles.STYLE_CLASSES`: which weight dim it
splits for each kind of module, whether it keeps the weights whole instead, what torch fills in for
a layout argument left ``None``, and what the module computes before its output is redistributed.
``plangen init`` describes shard shapes and writes defaults out from it, the level-2 rules ask it
what a style object is (:func:`facts_of`, :func:`is_sharding`, :func:`style_kind`,
:func:`weight_layout`), and the torch-free static tables
(:mod:`plangen.check.known_styles`) derive theirs from it, so the answer lives here only.

Placements are written as plan files write them (``"Shard(-1)"``, ``"Replicate()"``), except
``"Partial(sum)"``, the reduce op being what the static checks compare.
``tests/test_styles.py`` applies every style to real modules and compares with this table.
Importing this module does not import torch (``plangen verify --static`` reads it); the functions
that take or make torch objects import it when called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.distributed.tensor import Placement
    from torch.distributed.tensor.parallel import ParallelStyle

TORCH_STYLES = "torch.distributed.tensor.parallel"
PLANGEN_STYLES = "plangen.styles"

# The module kinds a style can split, by the weight layout torch gives them.
LINEAR = "linear"
EMBEDDING = "embedding"
CONV1D = "conv1d"  # GPT-2's Conv1D: an nn.Linear whose weight is stored transposed, [in, out]
EXPERTS = "experts"  # transformers' packed experts: [experts, ...] weights in one module
HEADS = "heads"  # an attention block's own per-head parameters (gpt-oss's sinks: [heads])
NORM = "norm"  # one weight value per feature (a norm), the module's only kind of parameter
FLAT_EXPERTS = (
    "flat_experts"  # DBRX's experts: flat [experts * ffn, hidden] weights in a child (plangen.flat_expert_styles)
)
SHARED_EXPERTS = "shared_experts"  # Inkling's shared experts: 3-D [S, I, H] / [S, H, I] weights applied by bmm (plangen.shared_expert_styles)
SHORT_CONV = "short_conv"  # a module around one depthwise nn.Conv1d and nothing else (Inkling's k/v short convs)
HEAD_TABLE = (
    "head_table"  # a [buckets, heads] table its module looks up itself (CpmAnt's position bias), split by head columns
)
MIXER = "mamba1_mixer"  # a Mamba1 mixer, split by its channels (its own A_log [channels, state] and D [channels])


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
    # One end of a tied-embedding pair: the style the other end must have (plangen.tied_styles).
    tied_partner: str | None = None
    # How the style lays out the module's inputs and outputs, which level 2 follows through each
    # block (plangen.check.flow): MODULE_HOOKS (a plain first input is read as ``input_layouts``, the
    # output left as ``output_layouts``, plain when ``use_local_output``), SEQUENCE_HOOKS (read and
    # left as ``sequence_sharding``), PREPARE_INPUT / PREPARE_OUTPUT / PREPARE_INPUT_OUTPUT (torch's
    # PrepareModule* attributes); None: its hooks do something else, and level 2 does not judge
    # the layouts that meet there.
    hooks: str | None = None
    # Children the style lays out itself, by name, with the role each then plays (a Mamba1 mixer's
    # in_proj column-parallel, x_proj row-parallel; a Mamba2 mixer's in_proj and conv1d, which its
    # forward reads directly): the rules count them as sharded by that role.
    lays_out_children: Mapping[str, str] = field(default_factory=dict)

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


MODULE_HOOKS = "module"
SEQUENCE_HOOKS = "sequence"
PREPARE_INPUT = "prepare_input"
PREPARE_OUTPUT = "prepare_output"
PREPARE_INPUT_OUTPUT = "prepare_input_output"

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
            hooks=MODULE_HOOKS,
        ),
        # Input features of a Linear, the vocabulary of an Embedding.
        StyleFacts(
            "RowwiseParallel",
            TORCH_STYLES,
            "rowwise",
            shard_dim={LINEAR: 1, EMBEDDING: 0},
            layout_defaults={"input_layouts": _LAST, "output_layouts": _REPLICATE},
            produces=_SUM,
            hooks=MODULE_HOOKS,
        ),
        StyleFacts(
            "SequenceParallel", TORCH_STYLES, "sequence", replicates=True, replicate_dtensor=True, hooks=SEQUENCE_HOOKS
        ),
        StyleFacts("PrepareModuleInput", TORCH_STYLES, "prepare_input", hooks=PREPARE_INPUT),
        StyleFacts("PrepareModuleOutput", TORCH_STYLES, "gather_output", hooks=PREPARE_OUTPUT),
        StyleFacts("PrepareModuleInputOutput", TORCH_STYLES, "gather_output", hooks=PREPARE_INPUT_OUTPUT),
        StyleFacts("RotaryEmbedParallel", PLANGEN_STYLES, "sequence", replicates=True, replicate_dtensor=True),
        # A SequenceParallel with the heads dim as its "sequence": reads and leaves this rank's heads.
        StyleFacts(
            "ReplicatedWithGradAllReduce",
            PLANGEN_STYLES,
            "grad_reduce",
            replicates=True,
            replicate_dtensor=True,
            hooks=SEQUENCE_HOOKS,
        ),
        StyleFacts("AllReduceParamGrads", PLANGEN_STYLES, "grad_reduce", replicates=True),
        StyleFacts("SequenceParallelOwnParameters", PLANGEN_STYLES, "grad_reduce", replicates=True),
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
        # A fused projection's output features, re-laid out so each rank's rows are its own parts.
        StyleFacts(
            "FusedColwiseParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, CONV1D: 1},
            layout_defaults={"input_layouts": _REPLICATE},
            produces=_LAST,
        ),
        # A packed [q; k; v] with one KV head: q column-parallel, the shared head gathered whole per forward.
        StyleFacts(
            "MultiQueryColwiseParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, CONV1D: 1},
            layout_defaults={"input_layouts": _REPLICATE},
            produces=_LAST,
        ),
        # GPT-2's Conv1D keeps its weight [in, out]: the output features are dim 1, the input ones dim 0.
        StyleFacts(
            "Conv1DColwiseParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, CONV1D: 1},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
            hooks=MODULE_HOOKS,
        ),
        StyleFacts(
            "Conv1DRowwiseParallel",
            PLANGEN_STYLES,
            "rowwise",
            shard_dim={LINEAR: 1, CONV1D: 0},
            layout_defaults={"input_layouts": _LAST, "output_layouts": _REPLICATE},
            produces=_SUM,
            hooks=MODULE_HOOKS,
        ),
        # torch's RowwiseParallel, its local output a copy the model may modify in place.
        StyleFacts(
            "RowwiseParallelOwnOutput",
            PLANGEN_STYLES,
            "rowwise",
            shard_dim={LINEAR: 1, EMBEDDING: 0},
            layout_defaults={"input_layouts": _LAST, "output_layouts": _REPLICATE},
            produces=_SUM,
            hooks=MODULE_HOOKS,
        ),
        # torch's ColwiseParallel, its local output a copy (the stable twin of the one above).
        StyleFacts(
            "ColwiseParallelOwnOutput",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, EMBEDDING: 1},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
            hooks=MODULE_HOOKS,
        ),
        # Divides the attention module's head counts; its parameters are its children's business.
        StyleFacts("LocalHeadCounts", PLANGEN_STYLES, "other"),
        # The same on a child its parent rebuilds (BigBird's attention.self), from the parent's pre-hook.
        StyleFacts("RebuiltChildHeadCounts", PLANGEN_STYLES, "other"),
        # PrepareModuleInputOutput on attention whose head counts it also makes local (ProphetNet's n-gram one).
        StyleFacts("PrepareAttentionInputOutput", PLANGEN_STYLES, "gather_output", hooks=PREPARE_INPUT_OUTPUT),
        # The same, with ProphetNet's predict-stream relative positions computed for all heads.
        StyleFacts("BucketedAttentionInputOutput", PLANGEN_STYLES, "gather_output", hooks=PREPARE_INPUT_OUTPUT),
        StyleFacts("MlaKvAProjParallel", PLANGEN_STYLES, "other", replicates=True),
        # PrepareModuleInput on a latent-attention module (it also hooks kv_a_proj_with_mqa's rope grad).
        StyleFacts("MlaAttentionParallel", PLANGEN_STYLES, "prepare_input", hooks=PREPARE_INPUT),
        StyleFacts("AllReduceOutputGrad", PLANGEN_STYLES, "grad_reduce", replicates=True),
        # A Mamba1 mixer split by channels: its own A_log/D, in_proj, conv1d, x_proj (row), dt_proj.
        StyleFacts(
            "Mamba1MixerParallel",
            PLANGEN_STYLES,
            "other",
            shard_dim={MIXER: 0},
            lays_out_children={"in_proj": "colwise", "conv1d": "colwise", "dt_proj": "colwise", "x_proj": "rowwise"},
        ),
        # An RWKV-4 mixer split by channels (plangen.rwkv_styles): time mixing's key/value/receptance
        # and time_decay/time_first, or channel mixing's key/receptance by rows and value by columns.
        StyleFacts(
            "RwkvTimeMixParallel",
            PLANGEN_STYLES,
            "other",
            lays_out_children={"key": "colwise", "value": "colwise", "receptance": "colwise"},
        ),
        StyleFacts(
            "RwkvChannelMixParallel",
            PLANGEN_STYLES,
            "other",
            lays_out_children={"key": "colwise", "receptance": "colwise", "value": "rowwise"},
        ),
        # A [buckets, heads] table its module looks up itself, split by its head columns (CpmAnt's position bias).
        StyleFacts("HeadTableParallel", PLANGEN_STYLES, "other", shard_dim={HEAD_TABLE: 1}),
        # Whole experts per rank (the expert dim); outputs are partial sums over ranks.
        StyleFacts(
            "ExpertsParallel",
            PLANGEN_STYLES,
            "experts",
            shard_dim={EXPERTS: 0},
            layout_defaults={"output_layouts": _REPLICATE},
            produces=_SUM,
        ),
        # DBRX's experts of flat [E * ffn, H] weights in a child: whole experts per rank (Shard(0) of each).
        StyleFacts("FlatExpertsParallel", PLANGEN_STYLES, "other", shard_dim={FLAT_EXPERTS: 0}, produces=_SUM),
        # A short conv over a column-parallel projection's heads: its channels split with them.
        StyleFacts("ConvChannelsParallel", PLANGEN_STYLES, "other", shard_dim={SHORT_CONV: 0}),
        # Inkling's shared experts of 3-D weights: each expert's intermediate (gate/up dim 1, down dim 2).
        StyleFacts(
            "SharedExpertsParallel",
            PLANGEN_STYLES,
            "other",
            shard_dim={SHARED_EXPERTS: 1},
            layout_defaults={"output_layouts": _REPLICATE},
            produces=_SUM,
        ),
        # JetMoE's experts of one [E, out, in] weight: each expert's output features, or its input
        # features (the outputs all-reduced), split over TP.
        StyleFacts("GroupedColwiseParallel", PLANGEN_STYLES, "colwise", shard_dim={EXPERTS: 1}),
        StyleFacts("GroupedRowwiseParallel", PLANGEN_STYLES, "rowwise", shard_dim={EXPERTS: 2}),
        # A JetMoE block: its experts' partial sums all-reduced once (under SP: its input gathered, reduce-scattered out).
        StyleFacts("RoutedBlockParallel", PLANGEN_STYLES, "gather_output"),
        StyleFacts("RoutedBlockSequenceParallel", PLANGEN_STYLES, "gather_output"),
        # A Llama-4 MoE block's PrepareModuleInputOutput that also splits its experts (the expert dim).
        StyleFacts("EveryTokenMoeParallel", PLANGEN_STYLES, "gather_output"),
        # A MoE block's PrepareModuleInputOutput that also reduces its branches' input gradients once (Inkling's).
        StyleFacts("MoeBlockParallel", PLANGEN_STYLES, "gather_output"),
        # Shared experts' PrepareModuleInput whose input gradient is left to that block's one reduction.
        StyleFacts("PartialGradInput", PLANGEN_STYLES, "prepare_input", hooks=PREPARE_INPUT),
        # A layer whose children read one sequence-sharded input whole (Gemma 4's router and experts' norm): gathered once.
        StyleFacts("SharedInputGather", PLANGEN_STYLES, "prepare_input"),
        # An untied embedding that scales its own lookup: vocabulary-sharded, its forward on the partial lookup.
        StyleFacts(
            "ScaledEmbeddingParallel",
            PLANGEN_STYLES,
            "rowwise",
            shard_dim={EMBEDDING: 0},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _REPLICATE},
            produces=_SUM,
            hooks=MODULE_HOOKS,
        ),
        # A tied embedding and head: one weight, vocabulary-sharded at both ends (plangen.tied_styles).
        StyleFacts(
            "TiedEmbeddingParallel",
            PLANGEN_STYLES,
            "rowwise",
            shard_dim={EMBEDDING: 0},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _REPLICATE},
            produces=_SUM,
            tied_partner="TiedHeadParallel",
            hooks=MODULE_HOOKS,
        ),
        StyleFacts(
            "TiedHeadParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
            tied_partner="TiedEmbeddingParallel",
            hooks=MODULE_HOOKS,
        ),
        # On a module whose own forward reads rows of a vocabulary-sharded embedding's weight (Gemma 4):
        # those rows read whole, one small all-reduce each; the weight is the embedding style's business.
        StyleFacts("EmbeddingRowReadParallel", PLANGEN_STYLES, "other"),
        # The attention block's input; where TP exceeds the KV heads, one local KV head per rank.
        StyleFacts("PrepareAttentionInput", PLANGEN_STYLES, "prepare_input", hooks=PREPARE_INPUT),
        # An MLP's input; where it keeps the gate's Gaussian top-k, the statistics over every rank's slice.
        StyleFacts("ActivationSparsityParallel", PLANGEN_STYLES, "prepare_input", hooks=PREPARE_INPUT),
        # Column-parallel where TP divides the KV heads; where TP exceeds them (plangen.kv_styles) the
        # weight stays whole (Replicate()) and each rank computes its KV head's rows.
        StyleFacts(
            "KVHeadsColwiseParallel",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
            hooks=MODULE_HOOKS,
        ),
        # PrepareModuleInput of an attention block that also splits its own [heads] parameters (sinks).
        StyleFacts(
            "AttentionSinksParallel", PLANGEN_STYLES, "prepare_input", shard_dim={HEADS: 0}, hooks=PREPARE_INPUT
        ),
        # PrepareModuleInput of differential attention (heads paired i, i + H/2): its own parameters,
        # shared by every head, replicated with their gradient summed over TP.
        StyleFacts("PairedHeadsAttentionInput", PLANGEN_STYLES, "prepare_input", replicates=True, hooks=PREPARE_INPUT),
        # PrepareModuleInput of a gated delta net that also splits its own [value heads] parameters
        # (A_log, dt_bias), its conv's packed channels, and makes its head counts local.
        StyleFacts("GatedDeltaNetParallel", PLANGEN_STYLES, "prepare_input", shard_dim={HEADS: 0}, hooks=PREPARE_INPUT),
        # An RG-LRU (RecurrentGemma) inside such a block: its own [heads, ...] gates and [channels]
        # recurrent_param split by heads; local channels in and out, so no layouts of its own.
        StyleFacts("RGLRUParallel", PLANGEN_STYLES, "other", shard_dim={HEADS: 0}),
        # A norm of each head on its own, its weight spanning the heads (xLSTM's): sharded with them.
        StyleFacts("MultiHeadNormParallel", PLANGEN_STYLES, "sharded_norm", shard_dim={NORM: 0}),
        # A norm over a whole column-parallel projection: sharded with the heads, statistics summed over TP.
        StyleFacts("ShardedNormParallel", PLANGEN_STYLES, "sharded_norm", shard_dim={NORM: 0}),
        # Its stable-variant twin: the same slices in and out, the whole norm computed on gathered input.
        StyleFacts("GatheredNormParallel", PLANGEN_STYLES, "sharded_norm", replicates=True),
        # A Mamba2 mixer split by heads (plangen.mamba_styles): its own [heads] parameters, in_proj and
        # conv1d re-laid out by heads; it takes its input itself (gathered, gradient reduced once).
        StyleFacts(
            "Mamba2MixerParallel",
            PLANGEN_STYLES,
            "prepare_input",
            shard_dim={HEADS: 0},
            layout_defaults={"input_layouts": _REPLICATE},
            lays_out_children={"in_proj": "colwise", "conv1d": "colwise"},
        ),
        # Its gated RMSNorm on this rank's heads: weight Shard(0), a group spread over ranks all-reduced.
        StyleFacts("GatedRMSNormParallel", PLANGEN_STYLES, "sharded_norm", shard_dim={NORM: 0}),
        # Its stable-variant twin: a group spread over ranks all-gathered and normalised whole instead.
        StyleFacts("GatheredGatedRMSNormParallel", PLANGEN_STYLES, "sharded_norm", shard_dim={NORM: 0}),
        # NeMo RL's ColwiseParallel; gather_output=True sets output_layouts=Replicate().
        StyleFacts(
            "ColwiseParallelWithGather",
            PLANGEN_STYLES,
            "colwise",
            shard_dim={LINEAR: 0, EMBEDDING: 1},
            layout_defaults={"input_layouts": _REPLICATE, "output_layouts": _LAST},
            produces=_LAST,
            hooks=MODULE_HOOKS,
        ),
    )
}


def facts_of(style: "ParallelStyle") -> StyleFacts | None:
    """The facts of ``style``'s nearest registered class (a user's subclass of ColwiseParallel
    shards like it); None for a style unrelated to every registered one."""
    for cls in type(style).__mro__:
        facts = STYLE_FACTS.get(cls.__name__)
        if facts is not None and _module_home(cls.__module__) == facts.module:
            return facts
    return None


# The themed modules whose styles plangen.styles re-exports.
PLANGEN_STYLE_MODULES = (
    PLANGEN_STYLES,
    "plangen.moe_styles",
    "plangen.moe_block_styles",
    "plangen.shared_expert_styles",
    "plangen.grouped_styles",
    "plangen.replicated_styles",
    "plangen.tied_styles",
    "plangen.kv_styles",
    "plangen.attention_styles",
    "plangen.bucketed_styles",
    "plangen.linear_attention_styles",
    "plangen.mla_styles",
    "plangen.norm_styles",
    "plangen.mamba_styles",
    "plangen.fused_styles",
    "plangen.mamba1_styles",
    "plangen.rwkv_styles",
    "plangen.recurrent_styles",
)


def _module_home(module: str) -> str | None:
    # torch defines its styles in torch.distributed.tensor.parallel.style and exports them one level up.
    if module == TORCH_STYLES or module.startswith(f"{TORCH_STYLES}."):
        return TORCH_STYLES
    # plangen.styles re-exports the styles of its sibling (themed) modules.
    return PLANGEN_STYLES if module in PLANGEN_STYLE_MODULES else None


def is_sharding(style: "ParallelStyle") -> bool:
    """Column- and row-parallel styles shard the module's weights; every other style replicates them."""
    facts = facts_of(style)
    return facts is not None and facts.shards


def style_kind(style: "ParallelStyle") -> str:
    """The word the level-2 rules group styles by (:attr:`StyleFacts.role`), ``other`` if unknown."""
    facts = facts_of(style)
    return facts.role if facts is not None else "other"


def module_kind(module: "nn.Module", by_heads: bool = False) -> str | None:
    """The kind of module a style splits (:data:`LINEAR`, :data:`EMBEDDING`, :data:`CONV1D`,
    :data:`EXPERTS`, :data:`FLAT_EXPERTS`, :data:`NORM`), None for any other. ``by_heads``: the style splits a block's own per-head
    parameters (gpt-oss attention's sinks), so such a block is of kind :data:`HEADS`."""
    from torch import nn

    if isinstance(module, nn.Embedding):
        return EMBEDDING
    if isinstance(module, nn.Linear):
        return LINEAR
    from plangen.attention_styles import head_parameters
    from plangen.module_facts import is_conv1d
    from plangen.moe_styles import expert_count

    if is_conv1d(module):
        return CONV1D

    if expert_count(module):
        return EXPERTS
    from plangen.flat_expert_styles import flat_expert_shape

    if flat_expert_shape(module):
        return FLAT_EXPERTS
    from plangen.shared_expert_styles import packed_shared_shape

    if packed_shared_shape(module):
        return SHARED_EXPERTS
    from plangen.attention_styles import short_conv_only

    if short_conv_only(module) is not None:
        return SHORT_CONV
    if by_heads and head_parameters(module):
        return HEADS
    own = [p for _, p in module.named_parameters(recurse=False)]
    if own and all(p.dim() == 1 for p in own) and not any(True for c in module.children() for _ in c.parameters()):
        return NORM
    return None


def weight_layout(style: "ParallelStyle | None", module: "nn.Module") -> str | None:
    """The layout a style gives ``module.weight`` ("plain" for an ordinary tensor); None if unknown."""
    if style is None:
        return "plain"
    facts = facts_of(style)
    if facts is None:
        return None
    kind = module_kind(module)
    return facts.weight_layout(kind if kind in (EMBEDDING, NORM, CONV1D) else LINEAR)


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


def tied_partner(name: str) -> str | None:
    """The style the other end of a tied pair must have when one end has style ``name``; else None."""
    facts = STYLE_FACTS.get(name)
    return None if facts is None else facts.tied_partner


def layout_defaults(name: str) -> dict[str, "Placement"]:
    """What torch uses for style ``name``'s layout arguments given as None, as placements."""
    facts = STYLE_FACTS.get(name)
    return {} if facts is None else {arg: placement_from_text(t) for arg, t in facts.layout_defaults.items()}

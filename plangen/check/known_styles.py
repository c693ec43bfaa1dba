"""What the static checks know about parallel styles and placements, written down without torch.

Level 1 must not import torch (it is slow and plan files are checked before anything runs), so the
keyword parameters of every style a plan may use are copied here. ``tests/test_check_static.py``
compares this table with ``inspect.signature`` of the real classes and with
``plangen.styles.STYLE_CLASSES``, so a torch upgrade or a new plangen style cannot leave it stale.
What a style does (where it is imported from, what it produces) is read from
:mod:`plangen.style_facts`, torch-free as well, instead of being restated here.
"""

from __future__ import annotations

from dataclasses import dataclass

from plangen.style_facts import STYLE_FACTS, TORCH_STYLES


@dataclass(frozen=True)
class ValueKind:
    """The type a keyword argument accepts, as far as a literal in the source can show it.

    ``base`` is ``"placement"``, ``"placement_dict"``, ``"bool"``, ``"int"`` or ``"str"``; a tuple of the base
    type is accepted when ``allows_tuple``, and ``None`` at top level / inside the tuple when the
    flags say so.
    """

    name: str
    base: str
    allows_none: bool = False
    allows_tuple: bool = False
    tuple_allows_none: bool = False


# One kind per annotation torch uses; the names are what the drift test maps annotations to.
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

VALUE_KINDS: tuple[ValueKind, ...] = (
    PLACEMENT_OR_NONE,
    PLACEMENTS_OR_NONE,
    PLACEMENTS,
    PLACEMENTS_STRICT,
    PLACEMENT_DICT_OR_NONE,
    BOOL,
    INT,
    INT_TUPLE,
    STR_TUPLE,
)

# Marks a keyword argument without a default.
REQUIRED = object()


@dataclass(frozen=True)
class StyleParam:
    name: str
    kind: ValueKind
    default: object = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class StyleSpec:
    """A style class: its keyword-only parameters and the modules a plan may import it from."""

    name: str
    params: tuple[StyleParam, ...]
    modules: tuple[str, ...]

    def param(self, name: str) -> StyleParam | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def import_hint(self) -> str:
        return f"from {self.modules[0]} import {self.name}"


TORCH_PARALLEL = TORCH_STYLES
# plangen.styles imports torch's styles too, so ``from plangen.styles import ColwiseParallel`` works.
TORCH_STYLE_MODULES = (TORCH_PARALLEL, f"{TORCH_PARALLEL}.style", "plangen.styles")
PLANGEN_STYLE_MODULES = ("plangen.styles",)


def _spec(name: str, params: tuple[StyleParam, ...]) -> StyleSpec:
    modules = TORCH_STYLE_MODULES if STYLE_FACTS[name].module == TORCH_STYLES else PLANGEN_STYLE_MODULES
    return StyleSpec(name, params, modules)


_LAYOUTS = (
    StyleParam("input_layouts", PLACEMENT_OR_NONE, None),
    StyleParam("output_layouts", PLACEMENT_OR_NONE, None),
    StyleParam("use_local_output", BOOL, True),
)
_INPUT_PREPARATION = (
    StyleParam("input_layouts", PLACEMENTS_OR_NONE, None),
    StyleParam("desired_input_layouts", PLACEMENTS_OR_NONE, None),
    StyleParam("input_kwarg_layouts", PLACEMENT_DICT_OR_NONE, None),
    StyleParam("desired_input_kwarg_layouts", PLACEMENT_DICT_OR_NONE, None),
)
_OUTPUT_PREPARATION = (
    StyleParam("output_layouts", PLACEMENTS),
    StyleParam("desired_output_layouts", PLACEMENTS_STRICT),
)

STYLES: dict[str, StyleSpec] = {
    spec.name: spec
    for spec in (
        _spec("ColwiseParallel", _LAYOUTS),
        _spec("RowwiseParallel", _LAYOUTS),
        _spec(
            "SequenceParallel",
            (StyleParam("sequence_dim", INT, 1), StyleParam("use_local_output", BOOL, False)),
        ),
        _spec(
            "PrepareModuleInput",
            (*_INPUT_PREPARATION, StyleParam("use_local_output", BOOL, False)),
        ),
        _spec("PartialGradInput", (*_INPUT_PREPARATION, StyleParam("use_local_output", BOOL, False))),
        _spec(
            "PrepareModuleOutput",
            (*_OUTPUT_PREPARATION, StyleParam("use_local_output", BOOL, True)),
        ),
        _spec(
            "PrepareModuleInputOutput",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_input", BOOL, False),
                *_OUTPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec(
            "RotaryEmbedParallel",
            (StyleParam("sequence_dim", INT, 1), StyleParam("use_local_output", BOOL, False)),
        ),
        _spec(
            "ReplicatedWithGradAllReduce",
            (StyleParam("sequence_dim", INT, 2), StyleParam("use_local_output", BOOL, True)),
        ),
        _spec("AllReduceParamGrads", ()),
        _spec("SequenceParallelOwnParameters", ()),
        _spec("LeaveUnsharded", ()),
        _spec("ShardedNormParallel", ()),
        _spec("GatheredNormParallel", ()),
        _spec("GatedRMSNormParallel", ()),
        _spec("GatheredGatedRMSNormParallel", ()),
        _spec("Mamba2MixerParallel", (StyleParam("input_layouts", PLACEMENT_OR_NONE, None),)),
        # The layouts are annotated Any there and passed on to ColwiseParallel / RowwiseParallel.
        _spec(
            "PackedColwiseParallel",
            (
                StyleParam("split_factor", INT, 2),
                StyleParam("input_layouts", PLACEMENT_OR_NONE, None),
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec(
            "PackedRowwiseParallel",
            (
                StyleParam("split_factor", INT, 2),
                StyleParam("output_layouts", PLACEMENT_OR_NONE, None),
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec(
            "FusedColwiseParallel",
            (
                StyleParam("part_sizes", INT_TUPLE, (1, 1)),
                StyleParam("input_layouts", PLACEMENT_OR_NONE, None),
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec(
            "MultiQueryColwiseParallel",
            (
                StyleParam("part_sizes", INT_TUPLE, (2, 1, 1)),
                StyleParam("shared_parts", INT_TUPLE, (1, 2)),
                StyleParam("input_layouts", PLACEMENT_OR_NONE, None),
            ),
        ),
        _spec("Conv1DColwiseParallel", _LAYOUTS),
        _spec("Conv1DRowwiseParallel", _LAYOUTS),
        _spec("RowwiseParallelOwnOutput", _LAYOUTS),
        _spec("ColwiseParallelOwnOutput", _LAYOUTS),
        _spec("LocalHeadCounts", (StyleParam("attributes", STR_TUPLE, ()),)),
        _spec(
            "PrepareAttentionInputOutput",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_input", BOOL, False),
                *_OUTPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
                StyleParam("head_attributes", STR_TUPLE, ()),
                StyleParam("head_inputs", STR_TUPLE, ()),
            ),
        ),
        _spec(
            "BucketedAttentionInputOutput",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_input", BOOL, False),
                *_OUTPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
                StyleParam("head_attributes", STR_TUPLE, ()),
                StyleParam("head_inputs", STR_TUPLE, ()),
                StyleParam("bucketed", STR, "relative_pos_embeddings"),
                StyleParam("all_heads_helper", STR, "get_predict_relative_pos_embeddings"),
                StyleParam("all_heads_dim", INT, 2),
            ),
        ),
        _spec(
            "RebuiltChildHeadCounts",
            (
                StyleParam("child", STR, "self"),
                StyleParam("attributes", STR_TUPLE, ()),
                StyleParam("refused_in_training", STR_TUPLE, ()),
            ),
        ),
        _spec("MlaKvAProjParallel", (StyleParam("rope_dim", INT),)),
        # PrepareModuleInput's arguments; the rope width is read from the module when applied.
        _spec(
            "MlaAttentionParallel",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
                StyleParam("sharded_query_latent", BOOL, False),
            ),
        ),
        _spec("ColwiseParallelWithGather", (*_LAYOUTS, StyleParam("gather_output", BOOL, False))),
        _spec(
            "PrepareAttentionInput",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, False),
                StyleParam("head_attributes", STR_TUPLE, ()),
                StyleParam("shared_tables", STR_TUPLE, ()),
                StyleParam("padded_heads", BOOL, False),
                StyleParam("batch_head_inputs", STR_TUPLE, ()),
            ),
        ),
        _spec("ActivationSparsityParallel", (*_INPUT_PREPARATION, StyleParam("use_local_output", BOOL, False))),
        _spec("KVHeadsColwiseParallel", _LAYOUTS),
        _spec(
            "ExpertsParallel",
            (
                StyleParam("output_layouts", PLACEMENT_OR_NONE, None),
                StyleParam("use_local_output", BOOL, True),
                StyleParam("sum_input_grad", BOOL, True),
            ),
        ),
        _spec(
            "FlatExpertsParallel",
            (StyleParam("output_layouts", PLACEMENT_OR_NONE, None), StyleParam("sum_input_grad", BOOL, True)),
        ),
        _spec(
            "GroupedColwiseParallel",
            (StyleParam("part_sizes", INT_TUPLE, ()), StyleParam("sum_input_grad", BOOL, True)),
        ),
        _spec("GroupedRowwiseParallel", (StyleParam("sum_output", BOOL, True),)),
        _spec(
            "RoutedBlockParallel",
            (
                StyleParam("input_kwarg", STR, ""),
                StyleParam("bias", STR, "bias"),
                StyleParam("router", STR, "router"),
                StyleParam("reads_gathered", STR_TUPLE, ()),
            ),
        ),
        _spec(
            "RoutedBlockSequenceParallel",
            (
                StyleParam("input_kwarg", STR, ""),
                StyleParam("bias", STR, "bias"),
                StyleParam("router", STR, "router"),
                StyleParam("reads_gathered", STR_TUPLE, ()),
                StyleParam("sequence_dim", INT, 1),
            ),
        ),
        _spec(
            "SharedExpertsParallel",
            (StyleParam("output_layouts", PLACEMENT_OR_NONE, None), StyleParam("sum_input_grad", BOOL, True)),
        ),
        _spec("ConvChannelsParallel", ()),
        _spec("AllReduceOutputGrad", ()),
        _spec("SharedInputGather", (StyleParam("readers", STR_TUPLE), StyleParam("partial_readers", STR_TUPLE, ()))),
        _spec(
            "Mamba1MixerParallel",
            (StyleParam("input_layouts", PLACEMENT_OR_NONE, None), StyleParam("grad_reduced", STR_TUPLE, ("x_proj",))),
        ),
        _spec("RwkvTimeMixParallel", ()),
        _spec("RwkvChannelMixParallel", ()),
        _spec("HeadTableParallel", (StyleParam("parameter", STR, "relative_attention_bias"),)),
        _spec("RGLRUParallel", (StyleParam("head_attribute", STR, "num_attention_heads"),)),
        _spec("MultiHeadNormParallel", (StyleParam("head_attributes", STR_TUPLE, ("num_heads", "num_features")),)),
        _spec(
            "MoeBlockParallel",
            (
                StyleParam("router", STR, "gate"),
                StyleParam("gates", STR_TUPLE, ()),
                *_INPUT_PREPARATION,
                StyleParam("use_local_input", BOOL, True),
                *_OUTPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec(
            "EveryTokenMoeParallel",
            (
                StyleParam("input_grad_once", BOOL, False),
                *_INPUT_PREPARATION,
                StyleParam("use_local_input", BOOL, False),
                *_OUTPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, True),
            ),
        ),
        _spec("TiedEmbeddingParallel", (*_LAYOUTS, StyleParam("local_lookup", BOOL, False))),
        _spec("ScaledEmbeddingParallel", _LAYOUTS),
        _spec("TiedHeadParallel", _LAYOUTS),
        _spec("EmbeddingRowReadParallel", (StyleParam("embedding", STR),)),
        _spec("AttentionSinksParallel", (*_INPUT_PREPARATION, StyleParam("use_local_output", BOOL, False))),
        _spec("PairedHeadsAttentionInput", (*_INPUT_PREPARATION, StyleParam("use_local_output", BOOL, False))),
        _spec(
            "GatedDeltaNetParallel",
            (
                *_INPUT_PREPARATION,
                StyleParam("use_local_output", BOOL, False),
                StyleParam("head_attributes", STR_TUPLE, ()),
                StyleParam("head_parameters", STR_TUPLE, ()),
                StyleParam("conv_parts", INT_TUPLE, (1, 1, 1)),
            ),
        ),
    )
}

# Public placements and where they can be imported from.
PLACEMENT_MODULES: dict[str, tuple[str, ...]] = {
    "Shard": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
    "Replicate": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
    "Partial": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
}
# Private placements: they exist, but their behaviour and constructor change between torch releases.
PRIVATE_PLACEMENTS = ("_StridedShard", "_MaskPartial", "_Partial")
# ``torch.distributed._tensor`` is the deprecated alias of ``torch.distributed.tensor``.
PLACEMENT_MODULE_ALIASES = {"torch.distributed._tensor": "torch.distributed.tensor"}
# ``Partial.ALL_REDUCE_OPS`` in torch 2.13 on (``plangen.compat.PARTIAL_REDUCE_OPS``, which a test compares).
PARTIAL_REDUCE_OPS = ("sum", "avg", "min", "max", "product")

# Modules whose contents are fully known here: a name from one of them that is not in the tables
# is certainly wrong, whereas a name from any other module may be a user's own style.
KNOWN_MODULES = frozenset(
    {*TORCH_STYLE_MODULES, *PLANGEN_STYLE_MODULES}
    | {m for modules in PLACEMENT_MODULES.values() for m in modules}
    | set(PLACEMENT_MODULE_ALIASES)
    | {f"{m}.placement_types" for m in PLACEMENT_MODULE_ALIASES}
)

# What a style's module computes before it is redistributed to ``output_layouts``: torch refuses to
# redistribute to a Partial placement unless the tensor is already in that very placement.
PRODUCED_OUTPUT: dict[str, str] = {name: facts.produces for name, facts in STYLE_FACTS.items() if facts.produces}

# Hugging Face ``tp_plan`` strings and the plangen style with the same semantics, as code
# (``plangen.styles.HF_STYLE_SPECS``; a test builds both and compares them).
# ``qk_rope_head_dim`` is the model config's attribute of that name.
HF_STYLE_EQUIVALENTS: dict[str, str] = {
    "colwise": "ColwiseParallel()",
    "colwise_gather_output": "ColwiseParallel(output_layouts=Replicate())",
    "colwise_rep": "ColwiseParallel(output_layouts=Replicate())",
    "unit_colwise": "ColwiseParallel()",
    "unit_rowwise": "RowwiseParallel()",
    "rowwise": "RowwiseParallel()",
    "rowwise_split_input": "RowwiseParallel(input_layouts=Replicate())",
    "rowwise_rep": "RowwiseParallel(input_layouts=Replicate())",
    "embedding_rowwise": "RowwiseParallel(input_layouts=Replicate())",
    "embedding_colwise": "ColwiseParallel(output_layouts=Replicate())",
    "packed_colwise": "PackedColwiseParallel()",
    "packed_rowwise": "PackedRowwiseParallel()",
    "sequence_parallel": "SequenceParallel(use_local_output=True)",
    "replicated_with_grad_allreduce": "AllReduceParamGrads()",
    "all_reduce": "PrepareModuleOutput(output_layouts=Partial(), desired_output_layouts=Replicate())",
    "mla_kv_a_proj": "MlaKvAProjParallel(rope_dim=qk_rope_head_dim)",
    "replicate": "LeaveUnsharded()",
}
# Hugging Face strings that no torch style can honour (``plangen.styles.HF_UNSUPPORTED_STYLES``).
HF_UNSUPPORTED_STYLES = (
    "moe_tp_experts",
    "moe_identity_expert",
    "grouped_gemm",
    "ep_dispatch_experts",
    "ep_router",
    "local_params",
    "local_colwise",
    "local_rowwise",
    "local_packed_rowwise",
    "local",
    "gather",
)


def placement_import_hint(name: str) -> str:
    return f"from {PLACEMENT_MODULES[name][0]} import {name}"

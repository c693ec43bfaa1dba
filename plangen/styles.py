"""The style registry: names → torch ``ParallelStyle`` classes, and plangen's own styles.

Plans name their styles (``"ColwiseParallel"``) so that a plan can be data, rendered and checked
without torch; :func:`build_style` turns a name and its keyword arguments into the object. Every
style here is one of torch's own or a small subclass of one, documented below. What each style does
to a module (weight dims it splits, layouts it defaults to) is data in :mod:`plangen.style_facts`,
which needs no torch, and so are the questions about a style object (:func:`plangen.style_facts.facts_of`).

Hugging Face plans name their styles with transformers' strings (``"colwise"``,
``"embedding_rowwise"``, ...). :data:`HF_STYLE_SPECS` translates each string, as data, into a style
name of :data:`STYLE_CLASSES` and its keyword arguments, with the same semantics as transformers'
own ``TensorParallelLayer`` of that name (see the table's comments); :data:`HF_UNSUPPORTED_STYLES`
lists, with the reason, the strings that torch's parallel styles cannot honour. They raise
:class:`UnsupportedStyleError` rather than being skipped, because a skipped rule leaves a model
that runs and computes something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import Placement

from plangen import compat
from plangen.bucketed_styles import BucketedAttentionInputOutput
from plangen.attention_styles import (
    AttentionSinksParallel,
    ConvChannelsParallel,
    HeadTableParallel,
    PairedHeadsAttentionInput,
    PrepareAttentionInputOutput,
    RebuiltChildHeadCounts,
)
from plangen.fused_styles import (
    Conv1DColwiseParallel,
    Conv1DRowwiseParallel,
    FusedColwiseParallel,
    LocalHeadCounts,
    MultiQueryColwiseParallel,
)
from plangen.kv_styles import KVHeadsColwiseParallel, PrepareAttentionInput
from plangen.sparsity_styles import ActivationSparsityParallel
from plangen.linear_attention_styles import GatedDeltaNetParallel
from plangen.mamba1_styles import Mamba1MixerParallel
from plangen.rwkv_styles import RwkvChannelMixParallel, RwkvTimeMixParallel
from plangen.recurrent_styles import MultiHeadNormParallel, RGLRUParallel
from plangen.mamba_styles import GatedRMSNormParallel, GatheredGatedRMSNormParallel, Mamba2MixerParallel
from plangen.mla_styles import MlaAttentionParallel, MlaKvAProjParallel
from plangen.grouped_styles import (
    GroupedColwiseParallel,
    GroupedRowwiseParallel,
    RoutedBlockParallel,
    RoutedBlockSequenceParallel,
)
from plangen.flat_expert_styles import FlatExpertsParallel
from plangen.moe_block_styles import EveryTokenMoeParallel, MoeBlockParallel, PartialGradInput
from plangen.moe_styles import AllReduceOutputGrad, ExpertsParallel
from plangen.shared_input_styles import SharedInputGather
from plangen.shared_expert_styles import SharedExpertsParallel
from plangen.norm_styles import GatheredNormParallel, ShardedNormParallel
from plangen.replicated_styles import (
    AllReduceParamGrads,
    LeaveUnsharded,
    SequenceParallelOwnParameters,
    ReplicatedWithGradAllReduce,
    RotaryEmbedParallel,
)
from plangen.tied_styles import (
    EmbeddingRowReadParallel,
    ScaledEmbeddingParallel,
    TiedEmbeddingParallel,
    TiedHeadParallel,
)


def _strided_shard(dim: int, split_factor: int) -> Placement:
    return compat.strided_shard(dim, split_factor)


def _check_packed(param: torch.Tensor, dim: int, split_factor: int, device_mesh: DeviceMesh, what: str) -> None:
    if not compat.COMPUTES_ON_STRIDED_SHARD:
        raise ValueError(
            f"{what}: torch {torch.__version__}'s DTensor cannot compute on a packed (_StridedShard) layout "
            "(torch 2.13 on can): use plangen's FusedColwiseParallel(part_sizes=(1, 1)) and RowwiseParallel, "
            "whose weights are plain shards"
        )
    # Uneven strided shards would mix the packed parts on the last rank: refuse instead.
    parts = split_factor * device_mesh.size()
    if param.shape[dim] % parts:
        raise ValueError(
            f"{what}: dim {dim} of size {param.shape[dim]} packs {split_factor} parts that must each split "
            f"evenly over {device_mesh.size()} TP ranks"
        )


class PackedColwiseParallel(ColwiseParallel):
    """Column-wise for a fused ``nn.Linear`` whose output packs ``split_factor`` equal parts ([gate; up]).

    transformers' ``packed_colwise``. Each part is sharded on its own, so rank ``r`` holds
    ``[gate_r; up_r]`` and the module's own ``chunk(2, -1)`` of its local output still separates gate
    from up. The weight and bias are ``_StridedShard(0, split_factor)`` DTensors: a faithful view of
    the original tensor (``full_tensor()`` and DCP state dicts give the checkpoint's layout back), and
    DTensor's linear propagates it to a ``_StridedShard`` output without communication. Input is
    replicated like :class:`ColwiseParallel`; its gradient is all-reduced by DTensor.

    TP only: FSDP2 (torch 2.13) over such a parameter runs a correct forward but builds a wrong 2-D
    spec for it (``_StridedShard`` on both mesh dims), so ``full_tensor()``, state dicts and
    checkpoints of the FSDP-sharded parameter come back permuted. Keep packed layers at DP=1.
    """

    def __init__(
        self,
        *,
        split_factor: int = 2,
        input_layouts: Any = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(input_layouts=input_layouts, use_local_output=use_local_output)
        self.split_factor = split_factor

    def _partition_linear_fn(self, name, module, device_mesh):
        placement = _strided_shard(0, self.split_factor)
        for param_name, param in module.named_parameters():
            _check_packed(param, 0, self.split_factor, device_mesh, f"{type(self).__name__} {param_name}")
            dist_param = nn.Parameter(
                distribute_tensor(param, device_mesh, [placement], src_data_rank=self.src_data_rank),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(param_name, dist_param)

    def _partition_embedding_fn(self, name, module, device_mesh):
        raise NotImplementedError(f"{type(self).__name__} shards nn.Linear only")

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        # The strided output is already what the module's consumers expect locally; a redistribute
        # to a plain Shard(-1) would interleave the parts across ranks.
        return outputs.to_local() if use_local_output else outputs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split_factor={self.split_factor}, input_layouts={self.input_layouts}, "
            f"use_local_output={self.use_local_output})"
        )


class PackedRowwiseParallel(RowwiseParallel):
    """Row-wise for an ``nn.Linear`` whose input packs ``split_factor`` equal parts, each sharded on its own.

    transformers' ``packed_rowwise`` layout: weight ``_StridedShard(1, split_factor)`` (the input
    features), bias replicated. transformers uses it only as a parameter layout (MoE expert weights run
    by ``moe_tp_experts``) and installs no forward; a module needs one under torch, so this one is the
    row-wise forward that matches the layout: the local input is this rank's ``[a_r; b_r]`` (what
    :class:`PackedColwiseParallel` outputs), the partial output is summed to ``output_layouts``.
    """

    def __init__(
        self,
        *,
        split_factor: int = 2,
        output_layouts: Any = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(output_layouts=output_layouts, use_local_output=use_local_output)
        self.split_factor = split_factor

    def _partition_linear_fn(self, name, module, device_mesh):
        _check_packed(module.weight, 1, self.split_factor, device_mesh, f"{type(self).__name__} weight")
        module.register_parameter(
            "weight",
            nn.Parameter(
                distribute_tensor(
                    module.weight,
                    device_mesh,
                    [_strided_shard(1, self.split_factor)],
                    src_data_rank=self.src_data_rank,
                ),
                requires_grad=module.weight.requires_grad,
            ),
        )
        if getattr(module, "bias", None) is not None:
            module.register_parameter(
                "bias",
                nn.Parameter(
                    distribute_tensor(module.bias, device_mesh, [Replicate()], src_data_rank=self.src_data_rank),
                    requires_grad=module.bias.requires_grad,
                ),
            )

    @staticmethod
    def _prepare_packed_input_fn(split_factor, mod, inputs, device_mesh):
        x = inputs[0]
        placement = (_strided_shard(x.ndim - 1, split_factor),)
        if not isinstance(x, DTensor):
            return DTensor.from_local(x, device_mesh, placement, run_check=False)
        if x.placements != placement:
            x = x.redistribute(placements=placement)
        return x

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{type(self).__name__} shards nn.Linear only")
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_packed_input_fn, self.split_factor),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split_factor={self.split_factor}, output_layouts={self.output_layouts}, "
            f"use_local_output={self.use_local_output})"
        )


# Every style a plan may name. Keys are the class names written in plan files.
STYLE_CLASSES: dict[str, type[ParallelStyle]] = {
    cls.__name__: cls
    for cls in (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        PrepareModuleInputOutput,
        RotaryEmbedParallel,
        ReplicatedWithGradAllReduce,
        AllReduceParamGrads,
        SequenceParallelOwnParameters,
        LeaveUnsharded,
        PackedColwiseParallel,
        PackedRowwiseParallel,
        *(
            FusedColwiseParallel,
            MultiQueryColwiseParallel,
            LocalHeadCounts,
            Conv1DColwiseParallel,
            Conv1DRowwiseParallel,
        ),
        MlaKvAProjParallel,
        MlaAttentionParallel,
        *(
            ExpertsParallel,
            FlatExpertsParallel,
            SharedExpertsParallel,
            EveryTokenMoeParallel,
            MoeBlockParallel,
            PartialGradInput,
        ),
        *(GroupedColwiseParallel, GroupedRowwiseParallel, RoutedBlockParallel, RoutedBlockSequenceParallel),
        *(AllReduceOutputGrad, SharedInputGather),
        TiedEmbeddingParallel,
        ScaledEmbeddingParallel,
        TiedHeadParallel,
        EmbeddingRowReadParallel,
        PrepareAttentionInput,
        ActivationSparsityParallel,
        KVHeadsColwiseParallel,
        *(AttentionSinksParallel, ConvChannelsParallel, PairedHeadsAttentionInput, RebuiltChildHeadCounts),
        *(PrepareAttentionInputOutput, BucketedAttentionInputOutput),
        GatedDeltaNetParallel,
        ShardedNormParallel,
        GatheredNormParallel,
        Mamba1MixerParallel,
        *(RwkvTimeMixParallel, RwkvChannelMixParallel, HeadTableParallel),
        Mamba2MixerParallel,
        RGLRUParallel,
        MultiHeadNormParallel,
        GatedRMSNormParallel,
        GatheredGatedRMSNormParallel,
    )
}


def build_style(name: str, kwargs: Mapping[str, Any] | None = None) -> ParallelStyle:
    """Instantiate the registered style ``name`` with ``kwargs``; unknown names list the known ones."""
    try:
        cls = STYLE_CLASSES[name]
    except KeyError:
        known = ", ".join(sorted(STYLE_CLASSES))
        raise ValueError(f"unknown parallel style {name!r}; known styles: {known}") from None
    return cls(**dict(kwargs or {}))


# ---------------------------------------------------------------------------------------------
# Hugging Face style strings
# ---------------------------------------------------------------------------------------------


class UnsupportedStyleError(ValueError):
    """A transformers style string that torch's parallel styles cannot honour, on a named module."""

    def __init__(self, style: str, module_name: str | None, reason: str) -> None:
        self.style = style
        self.module_name = module_name
        self.reason = reason
        where = repr(module_name) if module_name else "an unnamed module"
        super().__init__(
            f"transformers parallel style {style!r} on {where} is not supported by plangen: {reason}. "
            "Pass a custom_parallel_plan for this model, or use TP=1."
        )


@dataclass(frozen=True)
class HfStyleSpec:
    """A transformers style string as a plangen style: ``STYLE_CLASSES[style](**kwargs)``.

    ``config_kwargs`` maps a keyword argument to the text-config attribute it is read from when the
    style is resolved (transformers reads the same attribute from the model's config).
    """

    style: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    config_kwargs: Mapping[str, str] = field(default_factory=dict)


# transformers' names (transformers/distributed/tensor_parallel.py, 5.x, and the 4.x names still in
# user plans) with the same input/output layouts, parameter shards and gradient reductions as
# transformers' own TensorParallelLayer of that name. use_local_output is True everywhere because
# transformers always returns local tensors.
_COLWISE = {"input_layouts": Replicate(), "output_layouts": Shard(-1), "use_local_output": True}
_ROWWISE = {"input_layouts": Shard(-1), "output_layouts": Replicate(), "use_local_output": True}
HF_STYLE_SPECS: dict[str, HfStyleSpec] = {
    # Linear, weight (and bias) Shard(0); replicated input (its grad all-reduced); output stays
    # sharded on the last dim.
    "colwise": HfStyleSpec("ColwiseParallel", _COLWISE),
    # As colwise, then the output is all-gathered (lm_head's full-vocabulary logits).
    "colwise_gather_output": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 4.x name of colwise_gather_output, same registration in 5.x.
    "colwise_rep": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 5.25.0: colwise by whole heads over a (heads, replicas) view of the TP mesh; where the TP size
    # divides the heads (all plangen's head checks accept) one replica: exactly colwise.
    "unit_colwise": HfStyleSpec("ColwiseParallel", _COLWISE),
    # Linear, weight Shard(1), bias replicated (added once, after the sum); input sharded on the
    # last dim; partial output all-reduced.
    "rowwise": HfStyleSpec("RowwiseParallel", _ROWWISE),
    # 5.25.0: unit_colwise's row-parallel twin; exactly rowwise where the TP size divides the heads.
    "unit_rowwise": HfStyleSpec("RowwiseParallel", _ROWWISE),
    # As rowwise, but the input arrives replicated and each rank takes its slice.
    "rowwise_split_input": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 4.x name of rowwise_split_input, same registration in 5.x.
    "rowwise_rep": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Vocab-parallel embedding: weight Shard(0), ids replicated, the partial lookups summed.
    # torch's RowwiseParallel on an nn.Embedding does exactly this.
    "embedding_rowwise": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Hidden-dim-parallel embedding: weight Shard(1), ids replicated, the slices all-gathered.
    # torch's ColwiseParallel on an nn.Embedding does exactly this.
    "embedding_colwise": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Fused [gate; up] Linear: each part sharded on its own (see PackedColwiseParallel).
    "packed_colwise": HfStyleSpec("PackedColwiseParallel", {"split_factor": 2, "use_local_output": True}),
    "packed_rowwise": HfStyleSpec(
        "PackedRowwiseParallel", {"split_factor": 2, "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Params replicated, local input taken as sharded on the sequence dim, local output (5.x;
    # 4.x gathered the output instead).
    "sequence_parallel": HfStyleSpec("SequenceParallel", {"sequence_dim": 1, "use_local_output": True}),
    "replicated_with_grad_allreduce": HfStyleSpec("AllReduceParamGrads"),
    # Forward all-reduce of the module's partial output, identity backward.
    "all_reduce": HfStyleSpec(
        "PrepareModuleOutput",
        {"output_layouts": Partial(), "desired_output_layouts": Replicate(), "use_local_output": True},
    ),
    "mla_kv_a_proj": HfStyleSpec("MlaKvAProjParallel", config_kwargs={"rope_dim": "qk_rope_head_dim"}),
    # 5.x: nothing happens (4.x made the params Replicate DTensors: the same numbers).
    "replicate": HfStyleSpec("LeaveUnsharded"),
}

_MOE = (
    "plangen splits the experts with its own ExpertsParallel instead (whole experts per TP rank, one "
    "all-reduce per MoE layer): use the class's hand-written or synthesized plan (plangen list), or "
    "plangen init to write one"
)
_LOCAL_4X = (
    "a transformers 4.x style that keeps plain local shards with no DTensor and no gradient "
    "synchronisation, for inference-only MoE expert regions"
)

# transformers' names that torch's parallel styles cannot honour, and why.
HF_UNSUPPORTED_STYLES: dict[str, str] = {
    "moe_tp_experts": (
        "runs the fused experts module on local 3-D expert weight shards set by parameter-level rules and "
        f"all-reduces the partial outputs, which torch's module-level styles cannot express; {_MOE}"
    ),
    "moe_identity_expert": (
        "divides a zero-expert's input by the TP size to cancel moe_tp_experts' all-reduce, so it is only "
        f"correct together with that unsupported style; {_MOE}"
    ),
    "grouped_gemm": f"shards MoE expert weights by expert for expert parallelism; {_MOE}",
    "ep_dispatch_experts": f"dispatches tokens to expert-parallel ranks; {_MOE}",
    "ep_router": f"a transformers 4.x expert-parallel router that masks the other ranks' experts; {_MOE}",
    "local_params": (
        "runs a module on its own parameters sharded by parameter-level rules (attention sinks); torch's "
        "parallelize_module shards modules: AttentionSinksParallel on the attention block shards its sinks"
    ),
    "local_colwise": f"{_LOCAL_4X}; the DTensor equivalent is 'colwise'",
    "local_rowwise": f"{_LOCAL_4X}; the DTensor equivalent is 'rowwise'",
    "local_packed_rowwise": f"{_LOCAL_4X}; the DTensor equivalent is 'packed_rowwise'",
    "local": f"{_LOCAL_4X} (isolates a module from DTensor inputs)",
    "gather": f"{_LOCAL_4X} (all-reduces the first output in place, no autograd); the nearest is 'all_reduce'",
}


def known_hf_styles() -> list[str]:
    """Every transformers style string plangen knows, supported or not."""
    return sorted({*HF_STYLE_SPECS, *HF_UNSUPPORTED_STYLES})


def resolve_hf_style(style: str, module_name: str | None = None, *, config: Any = None) -> tuple[str, dict[str, Any]]:
    """The plangen style name and keyword arguments for transformers' ``style`` on ``module_name``.

    ``config`` (the model's text config) supplies the arguments transformers reads from it
    (``mla_kv_a_proj``'s rope width). Raises :class:`UnsupportedStyleError` for a style that cannot
    be honoured and ``ValueError`` for a string transformers never had.
    """
    if style in HF_UNSUPPORTED_STYLES:
        raise UnsupportedStyleError(style, module_name, HF_UNSUPPORTED_STYLES[style])
    spec = HF_STYLE_SPECS.get(style)
    if spec is None:
        where = f" on {module_name!r}" if module_name else ""
        raise ValueError(
            f"unknown transformers parallel style {style!r}{where}; known styles: {', '.join(known_hf_styles())}"
        )
    kwargs = dict(spec.kwargs)
    for kwarg, attribute in spec.config_kwargs.items():
        value = getattr(config, attribute, None)
        if value is None:
            raise UnsupportedStyleError(
                style, module_name, f"needs `{attribute}` from the model's text config (pass config=)"
            )
        kwargs[kwarg] = value
    return spec.style, kwargs


def translate_parallel_style(style: str, module_name: str | None = None, *, config: Any = None) -> ParallelStyle:
    """The torch ``ParallelStyle`` for transformers' ``style`` (NeMo RL's name); see :func:`resolve_hf_style`."""
    name, kwargs = resolve_hf_style(style, module_name, config=config)
    return build_style(name, kwargs)


class ColwiseParallelWithGather(ColwiseParallel):
    """NeMo RL's name: column-parallel; with ``gather_output=True`` each rank gets the whole output,
    local (transformers' ``colwise_gather_output``; NeMo RL then ignores the output layout
    arguments too). The output is redistributed to ``Replicate()``, so DTensor's backward keeps each
    rank's gradient slice, and the style shows the layout plan checks read."""

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        gather_output: bool = False,
    ) -> None:
        if gather_output:
            output_layouts, use_local_output = Replicate(), True
        super().__init__(input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output)
        self.gather_output = gather_output


STYLE_CLASSES[ColwiseParallelWithGather.__name__] = ColwiseParallelWithGather


class RowwiseParallelOwnOutput(RowwiseParallel):
    """:class:`RowwiseParallel` whose local output is a tensor of its own, not a view.

    ``to_local()`` returns a view made inside an autograd Function, which autograd forbids to
    modify in place; a layer that adds to a block's output in place (Falcon's parallel attention:
    ``mlp_output += attention_output``) then fails. This style hands out a copy of the reduced
    output (one activation-sized copy per block, no communication); everything else is torch's.
    """

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        outputs = RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return outputs.clone() if use_local_output else outputs


class ColwiseParallelOwnOutput(ColwiseParallel):
    """:class:`ColwiseParallel` whose local output is a tensor of its own, not a view: the stable
    variant's twin of :class:`RowwiseParallelOwnOutput` (a column-parallel projection on the gathered
    input whose gathered output the layer modifies in place)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        outputs = ColwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return outputs.clone() if use_local_output else outputs


STYLE_CLASSES[RowwiseParallelOwnOutput.__name__] = RowwiseParallelOwnOutput
STYLE_CLASSES[ColwiseParallelOwnOutput.__name__] = ColwiseParallelOwnOutput


__all__ = [
    "HF_STYLE_SPECS",
    "HF_UNSUPPORTED_STYLES",
    "STYLE_CLASSES",
    "AllReduceOutputGrad",
    "AllReduceParamGrads",
    "SequenceParallelOwnParameters",
    "AttentionSinksParallel",
    "ConvChannelsParallel",
    "PairedHeadsAttentionInput",
    "RebuiltChildHeadCounts",
    "PrepareAttentionInputOutput",
    "BucketedAttentionInputOutput",
    "ColwiseParallelOwnOutput",
    "ColwiseParallelWithGather",
    *("Conv1DColwiseParallel", "Conv1DRowwiseParallel"),
    "EveryTokenMoeParallel",
    "GatedDeltaNetParallel",
    "ExpertsParallel",
    "FlatExpertsParallel",
    "MoeBlockParallel",
    "PartialGradInput",
    "SharedExpertsParallel",
    "SharedInputGather",
    "FusedColwiseParallel",
    "GatedRMSNormParallel",
    "GatheredGatedRMSNormParallel",
    "GatheredNormParallel",
    "GroupedColwiseParallel",
    "GroupedRowwiseParallel",
    "RoutedBlockParallel",
    "RoutedBlockSequenceParallel",
    "HfStyleSpec",
    "KVHeadsColwiseParallel",
    "LeaveUnsharded",
    "Mamba1MixerParallel",
    "RwkvTimeMixParallel",
    "RwkvChannelMixParallel",
    "HeadTableParallel",
    "Mamba2MixerParallel",
    "RGLRUParallel",
    "MultiHeadNormParallel",
    "MlaAttentionParallel",
    "LocalHeadCounts",
    "MlaKvAProjParallel",
    "MultiQueryColwiseParallel",
    "PackedColwiseParallel",
    "PackedRowwiseParallel",
    "PrepareAttentionInput",
    "ActivationSparsityParallel",
    "ReplicatedWithGradAllReduce",
    "RotaryEmbedParallel",
    "RowwiseParallelOwnOutput",
    "Replicate",
    "ShardedNormParallel",
    "Shard",
    "ScaledEmbeddingParallel",
    "TiedEmbeddingParallel",
    "TiedHeadParallel",
    "EmbeddingRowReadParallel",
    "UnsupportedStyleError",
    "build_style",
    "known_hf_styles",
    "resolve_hf_style",
    "torch",
    "translate_parallel_style",
]

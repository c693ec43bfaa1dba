"""What a style needs of the module it is applied to, in the few words the level-2 rules need.

Pure functions of a style and a module: whether the style fits the module's kind (PG203,
:func:`fit_problem`) and which of its dimensions must divide by the TP size (PG204,
:func:`required_dims`), and what a style does to its input and output layouts.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
)

from plangen.attention_styles import (
    ConvChannelsParallel,
    HeadTableParallel,
    PrepareAttentionInputOutput,
    depthwise_conv,
    head_parameters,
)
from plangen.kv_styles import PrepareAttentionInput
from plangen.flat_expert_styles import FlatExpertsParallel, flat_expert_shape, flat_split_rows
from plangen.shared_expert_styles import SharedExpertsParallel, packed_shared_shape
from plangen.fused_styles import Conv1DColwiseParallel, Conv1DRowwiseParallel, LocalHeadCounts
from plangen.module_facts import attention_head_counts, head_count_owner, is_conv1d
from plangen.linear_attention_styles import GatedDeltaNetParallel, gated_delta_net_misfit
from plangen.mamba1_styles import mamba1_parts_problem
from plangen.recurrent_styles import MultiHeadNormParallel, RGLRUParallel, multi_head_norm_misfit, rg_lru_misfit
from plangen.moe_styles import expert_count, expert_layout_of, expert_layout_problem
from plangen.style_facts import EMBEDDING, LINEAR, facts_of, is_sharding
from plangen.styles import (
    AllReduceParamGrads,
    AttentionSinksParallel,
    PairedHeadsAttentionInput,
    ExpertsParallel,
    GroupedColwiseParallel,
    GroupedRowwiseParallel,
    Mamba1MixerParallel,
    GatedRMSNormParallel,
    Mamba2MixerParallel,
    MlaKvAProjParallel,
    PackedColwiseParallel,
    PackedRowwiseParallel,
    ReplicatedWithGradAllReduce,
    ShardedNormParallel,
)


# --- what a style does, in the few words the rules need ---------------------------------------


def first_layout(layouts) -> object:
    return layouts[0] if isinstance(layouts, tuple) and layouts else layouts


def placement_text(placement: object) -> str:
    if isinstance(placement, Shard):
        return f"Shard({placement.dim})"
    return f"{type(placement).__name__}()" if placement is not None else "None"


def is_sequence_split(placement: object) -> bool:
    return isinstance(placement, Shard) and placement.dim in (1, -2)


def leaves_local_shard(style: ParallelStyle) -> bool:
    """The style hands on a plain local shard of its output (no DTensor that knows the global shape)."""
    if isinstance(style, PackedColwiseParallel):
        return bool(style.use_local_output)
    return isinstance(first_layout(style.output_layouts), Shard) and bool(style.use_local_output)  # type: ignore[attr-defined]


def takes_local_shard(style: ParallelStyle) -> bool:
    """The style reads a plain input as this rank's shard (``DTensor.from_local`` assumes even shards)."""
    return isinstance(style, PackedRowwiseParallel) or isinstance(first_layout(style.input_layouts), Shard)  # type: ignore[attr-defined]


def suggest_key(pattern: str, style: str) -> str:
    return f'`"{pattern}": {style}`'


def fit_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    name = type(style).__name__
    what = type(module).__name__
    if isinstance(style, (GroupedColwiseParallel, GroupedRowwiseParallel)):
        weight = getattr(module, "weight", None)
        if expert_count(module) is None or not isinstance(weight, nn.Parameter) or weight.dim() != 3:
            return f"`{name}` shards an experts module of one [experts, out, in] weight (JetMoE's), not {what}"
        return None
    if isinstance(style, ExpertsParallel):
        if expert_count(module) is None:
            return (
                f"`{name}` shards a packed experts module (num_experts and [experts, ...] weights, transformers"
                f" 5.x), not {what}"
            )
        return None
    if isinstance(style, FlatExpertsParallel) and flat_expert_shape(module) is None:
        return f"`{name}` shards experts of flat [experts * ffn, hidden] weights in a child `mlp` (DBRX's), not {what}"
    if isinstance(style, HeadTableParallel):
        table = getattr(module, style.parameter, None)
        return (
            None
            if isinstance(table, nn.Parameter) and table.dim() == 2
            else (f"`{name}` splits a [buckets, heads] table `{style.parameter}` by its head columns, not {what}")
        )
    if isinstance(style, ConvChannelsParallel):
        return (
            None
            if depthwise_conv(module)
            else f"`{name}` splits a module around one depthwise nn.Conv1d by its channels, not {what}"
        )
    if isinstance(style, SharedExpertsParallel):
        if packed_shared_shape(module) is None:
            return f"`{name}` shards shared experts of 3-D gate_proj/up_proj [S, I, H] and down_proj [S, H, I] (Inkling's), not {what}"
        return None
    if isinstance(style, ShardedNormParallel):
        from plangen.norm_styles import resolve_norm_math

        try:
            resolve_norm_math(module)
        except ValueError as err:
            return f"`{name}` shards a norm over its last dim and sums its statistics over TP: {err}"
        return None
    if isinstance(style, GatedDeltaNetParallel):
        problem = gated_delta_net_misfit(style, module)
        if problem is not None:
            return f"`{name}` splits a gated delta net by heads, but {what} {problem}"
    elif isinstance(style, MultiHeadNormParallel):
        problem = multi_head_norm_misfit(module, style.head_attributes)
        return None if problem is None else f"`{name}` splits a norm of each head by its heads, but {what} {problem}"
    elif isinstance(style, RGLRUParallel):
        problem = rg_lru_misfit(module, style.head_attribute)
        return None if problem is None else f"`{name}` splits an RG-LRU by its heads, but {what} {problem}"
    elif isinstance(style, Mamba1MixerParallel):
        problem = mamba1_parts_problem(module)
        return None if problem is None else f"`{name}` splits a Mamba1 mixer by its channels, but {what} has {problem}"
    elif isinstance(style, (Mamba2MixerParallel, GatedRMSNormParallel)):
        from plangen.mamba_styles import resolve_gated_norm, resolve_mamba2_layout

        try:
            (resolve_mamba2_layout if isinstance(style, Mamba2MixerParallel) else resolve_gated_norm)(module)
        except ValueError as err:
            return f"`{name}`: {err}"
        return None
    elif isinstance(style, PairedHeadsAttentionInput):
        if attention_head_counts(module) is None:
            return f"`{name}` keeps head pairs whole per rank, but {what} has no config with head counts to pair"
    elif isinstance(style, AttentionSinksParallel):
        if not head_parameters(module):
            return (
                f"`{name}` splits a block's own per-head parameters (gpt-oss's sinks) with its heads, but {what}"
                " has no parameters of its own: use PrepareModuleInput"
            )
    elif isinstance(style, (PackedColwiseParallel, PackedRowwiseParallel, MlaKvAProjParallel)):
        if not isinstance(module, nn.Linear):
            return f"`{name}` shards nn.Linear only, not {what}"
    elif isinstance(style, (Conv1DColwiseParallel, Conv1DRowwiseParallel)):
        if not (isinstance(module, nn.Linear) or is_conv1d(module)):
            return f"`{name}` shards nn.Linear and GPT-2's Conv1D only, not {what}"
    elif is_sharding(style):
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            return f"`{name}` shards nn.Linear and nn.Embedding only, not {what} (torch raises NotImplementedError)"
        kinds = facts_of(style).shard_dim  # type: ignore[union-attr] - is_sharding: the facts are known
        if (EMBEDDING if isinstance(module, nn.Embedding) else LINEAR) not in kinds:
            only = " and ".join(f"nn.{'Embedding' if k == EMBEDDING else 'Linear'}" for k in kinds)
            return f"`{name}` shards {only} only, not {what}"
        if isinstance(style, RowwiseParallel) and isinstance(module, nn.Embedding) and takes_local_shard(style):
            return (
                f"`{name}` on an Embedding reads token ids: they must come in whole (input_layouts=Replicate()); "
                f"with input_layouts={placement_text(first_layout(style.input_layouts))} every rank's ids are gathered into a longer sequence"
            )
    elif isinstance(style, (ReplicatedWithGradAllReduce, AllReduceParamGrads)):
        if not any(True for _ in module.parameters(recurse=False)):
            return f"`{name}` reduces parameter gradients, but {what} has no parameters of its own"
    prepare = style.prepare_module_input if isinstance(style, PrepareModuleInputOutput) else style
    if isinstance(prepare, PrepareModuleInput):
        layouts = {**(prepare.input_kwarg_layouts or {}), **(prepare.desired_input_kwarg_layouts or {})}
        try:
            parameters = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            return None
        named = [p for p, v in parameters.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
        unknown = [k for k in layouts if k not in named]
        if unknown:
            return (
                f"`{name}` lays out keyword argument `{unknown[0]}`, but `{what}.forward` has no such parameter"
                f" (it takes {', '.join(named) or 'none'}): the layout would never be applied"
            )
    return None


def required_dims(style: ParallelStyle, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
    """(what, size, parts) the style splits into ``parts`` × TP equal local shards of a plain tensor.

    DTensor handles uneven shards as long as a tensor stays a DTensor, or is gathered: a vocabulary
    split by a row-parallel embedding or a column-parallel head with DTensor logits needs no
    divisibility. A shard handed on as a plain local tensor, or read from one, does.
    """
    split = getattr(style, "split_factor", 1)
    if isinstance(style, ExpertsParallel) and expert_count(module):
        count = expert_count(module)
        if expert_layout_of(module, tp) == "experts" or expert_layout_problem(module, tp) is not None:
            return [("num_experts", count, 1)]  # whole experts per rank
        # Each expert's intermediate split (the TP size does not divide the experts): its width must divide.
        down = module.down_proj
        return [
            ("each expert's intermediate width", down.shape[1 if getattr(module, "is_transposed", False) else 2], 1)
        ]
    if isinstance(style, FlatExpertsParallel) and flat_expert_shape(module):
        return [(*flat_split_rows(module, tp), 1)]  # whole experts per rank, else each expert's ffn rows
    if isinstance(style, ConvChannelsParallel) and (conv := depthwise_conv(module)):
        return [("conv channels", conv.in_channels, 1)]  # local channels, plain tensors in the forward
    if isinstance(style, SharedExpertsParallel) and (shared := packed_shared_shape(module)):
        return [("each shared expert's intermediate width", shared[1], 1)]  # local slices, plain tensors
    if isinstance(style, GatedDeltaNetParallel):  # whole key heads and their value heads per rank
        own = [
            (p, getattr(module, p).shape[0], 1)
            for p in style.head_parameters
            if isinstance(getattr(module, p, None), nn.Parameter)
        ]
        return [
            (a, getattr(module, a), 1) for a in style.head_attributes if isinstance(getattr(module, a, None), int)
        ] + own
    if isinstance(style, MultiHeadNormParallel):  # whole heads per rank, local counts
        return [(a, getattr(module, a), 1) for a in style.head_attributes if isinstance(getattr(module, a, None), int)]
    if isinstance(style, RGLRUParallel) and isinstance(getattr(module, style.head_attribute, None), int):
        return [(style.head_attribute, getattr(module, style.head_attribute), 1)]  # whole block-diagonal heads
    if isinstance(style, Mamba1MixerParallel) and isinstance(getattr(module, "conv1d", None), nn.Conv1d):
        return [("intermediate channels", module.conv1d.in_channels, 1)]  # local channels, plain tensors
    if isinstance(style, AttentionSinksParallel):  # whole heads' parameters per rank
        return [(name, param.shape[0], 1) for name, param in head_parameters(module).items()]
    if isinstance(style, PairedHeadsAttentionInput) and (counts := attention_head_counts(module)) is not None:
        return [
            ("attention heads", counts[0], 2),
            ("key/value heads", counts[1], 2),
        ]  # each half's, whole pairs per rank
    counts = style.attributes if isinstance(style, LocalHeadCounts) else getattr(style, "head_attributes", ())
    if isinstance(style, PrepareAttentionInput) and style.padded_heads:
        return []  # its head counts become this rank's padded share: the heads check says which TP sizes can
    if (
        isinstance(style, (LocalHeadCounts, PrepareAttentionInput, PrepareAttentionInputOutput)) and counts
    ):  # the block reshapes by count / TP
        values = [(a, getattr(*head_count_owner(module, a), None)) for a in counts]
        return [(a, v, 1) for a, v in values if isinstance(v, int) and not isinstance(v, bool)]
    if isinstance(module, nn.Linear) or is_conv1d(module):
        out_features, in_features = (
            (module.nf, module.nx) if is_conv1d(module) else (module.out_features, module.in_features)
        )
        if isinstance(style, ColwiseParallel) and leaves_local_shard(style):
            return [("out_features", out_features, split)]
        if isinstance(style, RowwiseParallel) and takes_local_shard(style):
            return [("in_features", in_features, split)]
    if isinstance(style, ShardedNormParallel) and isinstance(getattr(module, "weight", None), nn.Parameter):
        return [("normalized width", module.weight.shape[0], 1)]  # local slices of the projection's output
    if isinstance(module, nn.Embedding) and isinstance(style, ColwiseParallel) and leaves_local_shard(style):
        return [("embedding_dim", module.embedding_dim, 1)]
    return []

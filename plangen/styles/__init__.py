"""plangen's parallel styles: one module per mechanism, every style importable from here.

Plan files import their styles from this package (``from plangen.styles import FusedColwiseParallel``),
and torch's too. Where each mechanism lives:

- :mod:`~plangen.styles.base`: what a style is (:class:`PlangenStyle`: its facts and its needs of a
  module), the registry (:data:`STYLE_CLASSES`, :func:`build_style`) and the questions about a style;
- :mod:`~plangen.styles.kinds`: what kind of module a style splits, and the layout it gives its weight;
- :mod:`~plangen.styles.local_tensors`: running a module on its parameters' local tensors (the swap
  written once, for every style whose module computes on local shards);
- :mod:`~plangen.styles.linear`: torch's column-wise, row-wise, sequence-parallel and module-preparing
  styles, and plangen's small variants of them; :mod:`~plangen.styles.packed`: transformers' packed
  layouts; :mod:`~plangen.styles.fused`: fused projections ([q; k; v], [gate; up]) re-laid out by part,
  GPT-2's Conv1D, head counts made local;
- :mod:`~plangen.styles.tied`: tied and scaled embeddings; :mod:`~plangen.styles.replicated`: weights
  kept whole, their gradients summed over TP; :mod:`~plangen.styles.norms`: norms over a sharded width;
- attention: :mod:`~plangen.styles.kv_heads` (KV heads replicated where TP exceeds them),
  :mod:`~plangen.styles.attention` (per-head parameters, paired heads, head tables, short convs, head
  counts of rebuilt children), :mod:`~plangen.styles.bucketed_attention` (ProphetNet's),
  :mod:`~plangen.styles.latent_attention` (MLA);
- mixture of experts: :mod:`~plangen.styles.experts` (transformers' packed experts),
  :mod:`~plangen.styles.flat_experts` (DBRX), :mod:`~plangen.styles.grouped_experts` (JetMoE),
  :mod:`~plangen.styles.shared_experts` (3-D shared experts), :mod:`~plangen.styles.moe_blocks` (a
  MoE block's one reduction), :mod:`~plangen.styles.shared_input` (one input gathered once for its
  readers), :mod:`~plangen.styles.sparsity` (Gemma 3n's activation sparsity);
- state-space and recurrent mixers: :mod:`~plangen.styles.mamba1`, :mod:`~plangen.styles.mamba2`,
  :mod:`~plangen.styles.linear_attention` (gated delta nets), :mod:`~plangen.styles.recurrent`
  (RG-LRU, per-head norms), :mod:`~plangen.styles.rwkv`;
- :mod:`~plangen.styles.hf_strings`: transformers' ``tp_plan`` strings translated to these styles;
- :mod:`~plangen.styles.table`: the torch-free table of every style (:mod:`plangen.plan.style_table`),
  generated from the classes.

A new style is a class in the module of its mechanism, with ``facts`` and (where torch's column- and
row-wise rules are not its own) ``fit_problem`` and ``required_dims``; defining it registers it.
Then regenerate the table (``python -m plangen.styles.table``) and import it here.
"""

from __future__ import annotations

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.styles.base import STYLE_CLASSES, STYLE_FACTS, PlangenStyle, build_parallel_styles, build_style
from plangen.styles.linear import ColwiseParallelOwnOutput, ColwiseParallelWithGather, RowwiseParallelOwnOutput
from plangen.styles.packed import PackedColwiseParallel, PackedRowwiseParallel
from plangen.styles.fused import (
    Conv1DColwiseParallel,
    Conv1DRowwiseParallel,
    FusedColwiseParallel,
    LocalHeadCounts,
    MultiQueryColwiseParallel,
)
from plangen.styles.replicated import (
    AllReduceParamGrads,
    LeaveUnsharded,
    ReplicatedWithGradAllReduce,
    RotaryEmbedParallel,
    SequenceParallelOwnParameters,
)
from plangen.styles.tied import (
    EmbeddingRowReadParallel,
    ScaledEmbeddingParallel,
    TiedEmbeddingParallel,
    TiedHeadParallel,
)
from plangen.styles.norms import GatheredNormParallel, ShardedNormParallel
from plangen.styles.kv_heads import KVHeadsColwiseParallel, PrepareAttentionInput
from plangen.styles.attention import (
    AttentionSinksParallel,
    ConvChannelsParallel,
    HeadTableParallel,
    PairedHeadsAttentionInput,
    PrepareAttentionInputOutput,
    RebuiltChildHeadCounts,
)
from plangen.styles.bucketed_attention import BucketedAttentionInputOutput
from plangen.styles.latent_attention import MlaAttentionParallel, MlaKvAProjParallel
from plangen.styles.experts import AllReduceOutputGrad, ExpertsParallel
from plangen.styles.flat_experts import FlatExpertsParallel
from plangen.styles.grouped_experts import (
    GroupedColwiseParallel,
    GroupedRowwiseParallel,
    RoutedBlockParallel,
    RoutedBlockSequenceParallel,
)
from plangen.styles.shared_experts import SharedExpertsParallel
from plangen.styles.moe_blocks import EveryTokenMoeParallel, MoeBlockParallel, PartialGradInput
from plangen.styles.shared_input import SharedInputGather
from plangen.styles.sparsity import ActivationSparsityParallel
from plangen.styles.mamba1 import Mamba1MixerParallel
from plangen.styles.mamba2 import GatedRMSNormParallel, GatheredGatedRMSNormParallel, Mamba2MixerParallel
from plangen.styles.linear_attention import GatedDeltaNetParallel
from plangen.styles.recurrent import MultiHeadNormParallel, RGLRUParallel
from plangen.styles.rwkv import RwkvChannelMixParallel, RwkvTimeMixParallel
from plangen.styles.hf_strings import (
    HF_STYLE_SPECS,
    HF_UNSUPPORTED_STYLES,
    HfStyleSpec,
    UnsupportedStyleError,
    known_hf_styles,
    resolve_hf_style,
    translate_parallel_style,
)

__all__ = [
    # the registry
    "STYLE_CLASSES",
    "STYLE_FACTS",
    "PlangenStyle",
    "build_parallel_styles",
    "build_style",
    # placements, for plan files
    "Partial",
    "Replicate",
    "Shard",
    # torch's styles
    "ColwiseParallel",
    "PrepareModuleInput",
    "PrepareModuleInputOutput",
    "PrepareModuleOutput",
    "RowwiseParallel",
    "SequenceParallel",
    # plangen's, by mechanism
    "ColwiseParallelOwnOutput",
    "ColwiseParallelWithGather",
    "RowwiseParallelOwnOutput",
    "PackedColwiseParallel",
    "PackedRowwiseParallel",
    "Conv1DColwiseParallel",
    "Conv1DRowwiseParallel",
    "FusedColwiseParallel",
    "LocalHeadCounts",
    "MultiQueryColwiseParallel",
    "AllReduceParamGrads",
    "LeaveUnsharded",
    "ReplicatedWithGradAllReduce",
    "RotaryEmbedParallel",
    "SequenceParallelOwnParameters",
    "EmbeddingRowReadParallel",
    "ScaledEmbeddingParallel",
    "TiedEmbeddingParallel",
    "TiedHeadParallel",
    "GatheredNormParallel",
    "ShardedNormParallel",
    "KVHeadsColwiseParallel",
    "PrepareAttentionInput",
    "AttentionSinksParallel",
    "ConvChannelsParallel",
    "HeadTableParallel",
    "PairedHeadsAttentionInput",
    "PrepareAttentionInputOutput",
    "RebuiltChildHeadCounts",
    "BucketedAttentionInputOutput",
    "MlaAttentionParallel",
    "MlaKvAProjParallel",
    "AllReduceOutputGrad",
    "ExpertsParallel",
    "FlatExpertsParallel",
    "SharedExpertsParallel",
    "GroupedColwiseParallel",
    "GroupedRowwiseParallel",
    "RoutedBlockParallel",
    "RoutedBlockSequenceParallel",
    "EveryTokenMoeParallel",
    "MoeBlockParallel",
    "PartialGradInput",
    "SharedInputGather",
    "ActivationSparsityParallel",
    "Mamba1MixerParallel",
    "Mamba2MixerParallel",
    "GatedRMSNormParallel",
    "GatheredGatedRMSNormParallel",
    "GatedDeltaNetParallel",
    "MultiHeadNormParallel",
    "RGLRUParallel",
    "RwkvChannelMixParallel",
    "RwkvTimeMixParallel",
    # transformers' strings
    "HF_STYLE_SPECS",
    "HF_UNSUPPORTED_STYLES",
    "HfStyleSpec",
    "UnsupportedStyleError",
    "known_hf_styles",
    "resolve_hf_style",
    "translate_parallel_style",
]

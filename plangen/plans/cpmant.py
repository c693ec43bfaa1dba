"""Hand-written plan for CpmAnt: attention and MLP one level down in each layer, a per-head position bias.

A ``CpmAntTransformerBlock`` holds two sub-layers, each a norm, a block and the residual add:
``self_att`` (``layernorm_before_attention``, ``self_attention``: ``project_q``/``project_k``/
``project_v``, ``attention_out``) and ``ffn`` (``layernorm_before_ffn``, ``ffn``: a gated
``w_in`` of ``w_0`` and ``w_1``, then ``w_out``). The attention is split by heads (q, k, v
column-parallel, ``attention_out`` row-parallel, ``num_heads`` made this rank's), the MLP by
features (``w_0``, ``w_1`` column-parallel, ``w_out`` row-parallel). Each norm's output becomes one
``Replicate`` DTensor (the sub-layer hands it to attention twice, as ``hidden_q`` and ``hidden_kv``),
so every block reduces its input gradient once.

The relative position bias (``[batch, heads, q, k]``) is computed once by ``cpmant.position_bias``
from one ``[buckets, heads]`` table and handed to every layer: the table is split by its head
columns (``HeadTableParallel``), so the bias each rank computes is its own heads', as its
attention adds it. The token embedding (with the prompt rows) is vocabulary-parallel, the segment
embedding (32 rows) whole; the head is vocabulary-parallel.

No sequence parallel: the model prepends its prompt tokens and adds the segment embedding inside
``CpmAntModel.forward``, then drops the prompt after the last norm, where no style lays the
residual stream out on sequence shards.

Why hand-written, not synthesized: the synthesizer reads blocks one level below the layer, with
their linears as children, one input, and per-head inputs that a head-count call makes; CpmAnt
nests each block in a sub-layer, its MLP's linears in ``w_in``, hands attention its input twice
and its bias comes from a table's lookup.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.registry import register_plan

LAYER = "cpmant.encoder.layers.*"
COLWISE = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
ROWWISE = dict(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)
ONE_DTENSOR = dict(output_layouts=Replicate(), desired_output_layouts=Replicate(), use_local_output=False)


@register_plan("CpmAntForCausalLM")
def plan_cpmant(model: nn.Module, sequence_parallel: bool) -> Plan:
    if sequence_parallel:
        raise ValueError(
            f"{type(model).__name__}: no sequence-parallel plan: its prompt tokens and segment embedding are joined"
            " to the token embeddings inside CpmAntModel.forward, outside any module a style can lay out;"
            " use sequence_parallel=False"
        )
    attn, ffn = f"{LAYER}.self_att", f"{LAYER}.ffn"
    reduced = "its output one Replicate DTensor, so the block reduces its input gradient once"
    entries = [
        PlanEntry(
            "cpmant.input_embedding",
            "RowwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),
            "embeddings",
            "vocab-parallel embedding (its prompt rows too); all-reduce",
        ),
        PlanEntry(
            "cpmant.position_bias",
            "HeadTableParallel",
            dict(parameter="relative_attention_bias"),
            "attention",
            "the [buckets, heads] table split by heads: each rank computes its own heads' bias, no communication",
        ),
        PlanEntry(
            f"{attn}.layernorm_before_attention",
            "PrepareModuleOutput",
            ONE_DTENSOR,
            "attention",
            f"norm before attention: {reduced} (attention reads it as hidden_q and hidden_kv)",
        ),
        PlanEntry(
            f"{attn}.self_attention",
            "LocalHeadCounts",
            dict(attributes=("num_heads",)),
            "attention",
            "views q, k, v and the scores by num_heads: made this rank's",
        ),
        *(
            PlanEntry(
                f"{attn}.self_attention.{p}", "ColwiseParallel", COLWISE, "attention", "column-parallel: own heads"
            )
            for p in ("project_q", "project_k", "project_v")
        ),
        PlanEntry(
            f"{attn}.self_attention.attention_out",
            "RowwiseParallel",
            ROWWISE,
            "attention",
            "row-parallel: one all-reduce",
        ),
        PlanEntry(
            f"{ffn}.layernorm_before_ffn", "PrepareModuleOutput", ONE_DTENSOR, "mlp", f"norm before the MLP: {reduced}"
        ),
        *(
            PlanEntry(
                f"{ffn}.ffn.w_in.{p}", "ColwiseParallel", COLWISE, "mlp", "column-parallel: the gated intermediate"
            )
            for p in ("w_0", "w_1")
        ),
        PlanEntry(f"{ffn}.ffn.w_out", "RowwiseParallel", ROWWISE, "mlp", "row-parallel: one all-reduce"),
        PlanEntry(
            "lm_head",
            "ColwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
            "output",
            "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
        ),
    ]
    replicated = (
        Replicated(
            "cpmant.segment_embedding", "segment embedding (one row per segment type), small: kept whole", "embeddings"
        ),
        Replicated(
            "cpmant.encoder.output_layernorm", "sees the full hidden state on every rank: nothing to shard", "norms"
        ),
    )
    return Plan(tuple(entries), "hand-written", replicated, False)

"""Tensor-parallel plan for CpmAntForCausalLM, made by `plangen init`: edit it freely.

Model:       cpmant (CpmAntForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for CpmAntForCausalLM
Regenerate:  plangen init cpmant -o generated/cpmant_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.cpmant_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/cpmant_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
HeadTableParallel, LocalHeadCounts). The logits leave as a DTensor sharded on the vocabulary: the
loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleOutput, RowwiseParallel

from plangen.styles import HeadTableParallel, LocalHeadCounts

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "cpmant"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [31744, 4096] → local [15872, 4096] at TP=2
    # vocab-parallel embedding (its prompt rows too); all-reduce
    "cpmant.input_embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),
    # Left replicated on purpose: segment embedding (one row per segment type), small: kept whole
    # "cpmant.segment_embedding": 1 × Embedding [32, 4096]

    # Attention
    # 1 × CpmAntSegmentPositionEmbedding [1536, 32] → local [1536, 16] at TP=2
    # the [buckets, heads] table split by heads: each rank computes its own heads' bias, no communication
    "cpmant.position_bias": HeadTableParallel(parameter="relative_attention_bias"),
    # 48 × CpmAntLayerNorm [4096]: norm before attention: its output one Replicate DTensor, so the block reduces its
    # input gradient once (attention reads it as hidden_q and hidden_kv)
    "cpmant.encoder.layers.*.self_att.layernorm_before_attention": PrepareModuleOutput(
        output_layouts=Replicate(),
        desired_output_layouts=Replicate(),
        use_local_output=False,
    ),
    # 48 × CpmAntAttention; views q, k, v and the scores by num_heads: made this rank's
    "cpmant.encoder.layers.*.self_att.self_attention": LocalHeadCounts(attributes=("num_heads",)),
    # 48 × Linear [4096, 4096] → local [2048, 4096] at TP=2; column-parallel: own heads
    "cpmant.encoder.layers.*.self_att.self_attention.project_q": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 48 × Linear [4096, 4096] → local [2048, 4096] at TP=2; column-parallel: own heads
    "cpmant.encoder.layers.*.self_att.self_attention.project_k": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 48 × Linear [4096, 4096] → local [2048, 4096] at TP=2; column-parallel: own heads
    "cpmant.encoder.layers.*.self_att.self_attention.project_v": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 48 × Linear [4096, 4096] → local [4096, 2048] at TP=2; row-parallel: one all-reduce
    "cpmant.encoder.layers.*.self_att.self_attention.attention_out": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # MLP
    # 48 × CpmAntLayerNorm [4096]: norm before the MLP: its output one Replicate DTensor, so the block reduces its input
    # gradient once
    "cpmant.encoder.layers.*.ffn.layernorm_before_ffn": PrepareModuleOutput(
        output_layouts=Replicate(),
        desired_output_layouts=Replicate(),
        use_local_output=False,
    ),
    # 48 × Linear [10240, 4096] → local [5120, 4096] at TP=2; column-parallel: the gated intermediate
    "cpmant.encoder.layers.*.ffn.ffn.w_in.w_0": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 48 × Linear [10240, 4096] → local [5120, 4096] at TP=2; column-parallel: the gated intermediate
    "cpmant.encoder.layers.*.ffn.ffn.w_in.w_1": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 48 × Linear [4096, 10240] → local [4096, 5120] at TP=2; row-parallel: one all-reduce
    "cpmant.encoder.layers.*.ffn.ffn.w_out": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "cpmant.encoder.output_layernorm": 1 × CpmAntLayerNorm [4096]

    # Output head
    # 1 × Linear [30720, 4096] → local [15360, 4096] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

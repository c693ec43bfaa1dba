"""Tensor-parallel plan for Qwen2_5_VLForConditionalGeneration, made by `plangen init`: edit it freely.

Model:       qwen2_5_vl (Qwen2_5_VLForConditionalGeneration), TP size 2, sequence parallel on
Seed:        the hand-written plan for Qwen2_5_VLForConditionalGeneration
Regenerate:  plangen init qwen2_5_vl -o generated/qwen2_5_vl_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.qwen2_5_vl_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/qwen2_5_vl_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
KVHeadsColwiseParallel, PrepareAttentionInput). The logits leave as a DTensor sharded on the
vocabulary: the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's
loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.styles import KVHeadsColwiseParallel, PrepareAttentionInput

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "qwen2_5_vl"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [152064, 8192] → local [76032, 8192] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual
    "model.language_model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),

    # Attention
    # 80 × Qwen2_5_VLAttention: one all-gather of the sequence per attention block; one gradient reduction per block in
    # backward
    "model.language_model.layers.*.self_attn": PrepareAttentionInput(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=False,
        head_attributes=(),
        shared_tables=(),
        padded_heads=False,
        batch_head_inputs=(),
    ),
    # 80 × Linear [8192, 8192] → local [4096, 8192] at TP=2; column-parallel: each rank computes its own heads
    "model.language_model.layers.*.self_attn.q_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 80 × Linear [1024, 8192] → local [512, 8192] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.language_model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 80 × Linear [1024, 8192] → local [512, 8192] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.language_model.layers.*.self_attn.v_proj": KVHeadsColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 80 × Linear [8192, 8192] → local [8192, 4096] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.language_model.layers.*.self_attn.o_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Shard(1),
        use_local_output=False,
    ),

    # MLP
    # 80 × Qwen2MLP: one all-gather of the sequence per MLP block; one gradient reduction per block in backward
    "model.language_model.layers.*.mlp": PrepareModuleInput(
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 80 × Linear [29568, 8192] → local [14784, 8192] at TP=2; column-parallel
    "model.language_model.layers.*.mlp.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 80 × Linear [29568, 8192] → local [14784, 8192] at TP=2; column-parallel
    "model.language_model.layers.*.mlp.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 80 × Linear [8192, 29568] → local [8192, 14784] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.language_model.layers.*.mlp.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Shard(1),
        use_local_output=False,
    ),

    # Norms
    # 80 × Qwen2_5_VLRMSNorm [8192], replicated at TP=2; norm on the local sequence shard
    "model.language_model.layers.*.input_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 80 × Qwen2_5_VLRMSNorm [8192], replicated at TP=2; norm on the local sequence shard
    "model.language_model.layers.*.post_attention_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × Qwen2_5_VLRMSNorm [8192], replicated at TP=2; norm on the local sequence shard
    "model.language_model.norm": SequenceParallel(sequence_dim=1, use_local_output=False),

    # Output head
    # 1 × Linear [152064, 8192] → local [76032, 8192] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
}

"""Tensor-parallel plan for Mistral3ForConditionalGeneration, made by `plangen init`: edit it freely.

Model:       mistral3 (Mistral3ForConditionalGeneration), TP size 2, sequence parallel off
Seed:        the hand-written plan for Mistral3ForConditionalGeneration
Regenerate:  plangen init mistral3 -o generated/mistral3_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.mistral3_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/mistral3_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
KVHeadsColwiseParallel, PrepareAttentionInput, TiedEmbeddingParallel, TiedHeadParallel).
model.language_model.embed_tokens and lm_head share one weight: TiedEmbeddingParallel and
TiedHeadParallel keep it one parameter, sharded once on the vocabulary by whichever is applied
first, so no re-tie is needed; keep the two together (one alone leaves two parameters, which plangen
verify reports). The logits leave as a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

from plangen.styles import KVHeadsColwiseParallel, PrepareAttentionInput, TiedEmbeddingParallel, TiedHeadParallel

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "mistral3"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [131072, 5120] → local [65536, 5120] at TP=2
    # vocab-parallel embedding; all-reduce; one weight with lm_head (tied), sharded once
    "model.language_model.embed_tokens": TiedEmbeddingParallel(
        input_layouts=Replicate(),
        output_layouts=Replicate(),
        use_local_output=True,
        local_lookup=False,
    ),

    # Attention
    # 40 × MistralAttention: no communication; one gradient reduction per block in backward
    "model.language_model.layers.*.self_attn": PrepareAttentionInput(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=False,
        head_attributes=(),
        shared_tables=(),
        padded_heads=False,
        batch_head_inputs=(),
    ),
    # 40 × Linear [4096, 5120] → local [2048, 5120] at TP=2; column-parallel: each rank computes its own heads
    "model.language_model.layers.*.self_attn.q_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 40 × Linear [1024, 5120] → local [512, 5120] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.language_model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 40 × Linear [1024, 5120] → local [512, 5120] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.language_model.layers.*.self_attn.v_proj": KVHeadsColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 40 × Linear [5120, 4096] → local [5120, 2048] at TP=2; row-parallel: one all-reduce
    "model.language_model.layers.*.self_attn.o_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # MLP
    # 40 × MistralMLP: no communication; one gradient reduction per block in backward
    "model.language_model.layers.*.mlp": PrepareModuleInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 40 × Linear [32768, 5120] → local [16384, 5120] at TP=2; column-parallel
    "model.language_model.layers.*.mlp.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 40 × Linear [32768, 5120] → local [16384, 5120] at TP=2; column-parallel
    "model.language_model.layers.*.mlp.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 40 × Linear [5120, 32768] → local [5120, 16384] at TP=2; row-parallel: one all-reduce
    "model.language_model.layers.*.mlp.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.language_model.layers.*.input_layernorm": 40 × MistralRMSNorm [5120]
    # "model.language_model.layers.*.post_attention_layernorm": 40 × MistralRMSNorm [5120]
    # "model.language_model.norm": 1 × MistralRMSNorm [5120]

    # Output head
    # 1 × Linear [131072, 5120] → local [65536, 5120] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy; one weight with
    # model.language_model.embed_tokens (tied), sharded once
    "lm_head": TiedHeadParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

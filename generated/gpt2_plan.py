"""Tensor-parallel plan for GPT2LMHeadModel, made by `plangen init`: edit it freely.

Model:       gpt2 (GPT2LMHeadModel), TP size 2, sequence parallel off
Seed:        the hand-written plan for GPT2LMHeadModel
Regenerate:  plangen init gpt2 -o generated/gpt2_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.gpt2_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/gpt2_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
Conv1DColwiseParallel, Conv1DRowwiseParallel, FusedColwiseParallel, LocalHeadCounts,
TiedEmbeddingParallel, TiedHeadParallel). transformer.wte and lm_head share one weight:
TiedEmbeddingParallel and TiedHeadParallel keep it one parameter, sharded once on the vocabulary by
whichever is applied first, so no re-tie is needed; keep the two together (one alone leaves two
parameters, which plangen verify reports). The logits leave as a DTensor sharded on the vocabulary:
the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.styles import (
    Conv1DColwiseParallel,
    Conv1DRowwiseParallel,
    FusedColwiseParallel,
    LocalHeadCounts,
    TiedEmbeddingParallel,
    TiedHeadParallel,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "gpt2"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [50257, 768] → local [25129, 768] at TP=2 (uneven split)
    # vocab-parallel embedding; all-reduce; one weight with lm_head (tied), sharded once
    "transformer.wte": TiedEmbeddingParallel(
        input_layouts=Replicate(),
        output_layouts=Replicate(),
        use_local_output=True,
        local_lookup=False,
    ),
    # Left replicated on purpose: learned position embedding, small: kept whole
    # "transformer.wpe": 1 × Embedding [1024, 768]

    # Attention
    # 12 × GPT2Attention; splits the fused c_attn by split_size: make it this rank's
    "transformer.h.*.attn": LocalHeadCounts(attributes=("num_heads", "split_size")),
    # 12 × Conv1D [768, 2304] → local [768, 1152] at TP=2
    # each rank holds its own heads' q, k, v; one input-gradient reduction per block
    "transformer.h.*.attn.c_attn": FusedColwiseParallel(part_sizes=(1, 1, 1), input_layouts=Replicate(), use_local_output=True),
    # 12 × Conv1D [768, 768] → local [384, 768] at TP=2; row-parallel: one all-reduce
    "transformer.h.*.attn.c_proj": Conv1DRowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # MLP
    # 12 × Conv1D [768, 3072] → local [768, 1536] at TP=2; column-parallel; one input-gradient reduction per block
    "transformer.h.*.mlp.c_fc": Conv1DColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 12 × Conv1D [3072, 768] → local [1536, 768] at TP=2; row-parallel: one all-reduce
    "transformer.h.*.mlp.c_proj": Conv1DRowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "transformer.h.*.ln_1": 12 × LayerNorm [768]
    # "transformer.h.*.ln_2": 12 × LayerNorm [768]
    # "transformer.ln_f": 1 × LayerNorm [768]

    # Output head
    # 1 × Linear [50257, 768] → local [25129, 768] at TP=2 (uneven split)
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy; one weight with transformer.wte
    # (tied), sharded once
    "lm_head": TiedHeadParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

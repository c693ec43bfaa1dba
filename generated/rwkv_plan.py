"""Tensor-parallel plan for RwkvForCausalLM, made by `plangen init`: edit it freely.

Model:       rwkv (RwkvForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for RwkvForCausalLM
Regenerate:  plangen init rwkv -o generated/rwkv_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.rwkv_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/rwkv_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
RwkvChannelMixParallel, RwkvTimeMixParallel). The logits leave as a DTensor sharded on the
vocabulary: the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's
loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles import RwkvChannelMixParallel, RwkvTimeMixParallel

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "rwkv"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [50277, 4096] → local [25139, 4096] at TP=2 (uneven split); vocab-parallel embedding; all-reduce
    "rwkv.embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 32 × RwkvSelfAttention
    # time mixing split by channels: key/value/receptance rows, time_decay/time_first with them; its input's gradient
    # summed once, the time_mix_* gradients by one small all-reduce
    "rwkv.blocks.*.attention": RwkvTimeMixParallel(),
    # 32 × Linear [4096, 4096] → local [4096, 2048] at TP=2; row-parallel: one all-reduce
    "rwkv.blocks.*.attention.output": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # MLP
    # 32 × RwkvFeedForward
    # channel mixing split by channels: key and receptance rows, value columns (its partial sum reduce-scattered onto
    # the receptance's channels), the gated product all-gathered
    "rwkv.blocks.*.feed_forward": RwkvChannelMixParallel(),

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "rwkv.blocks.*.pre_ln": 1 × LayerNorm [4096]
    # "rwkv.blocks.*.ln1": 32 × LayerNorm [4096]
    # "rwkv.blocks.*.ln2": 32 × LayerNorm [4096]
    # "rwkv.ln_out": 1 × LayerNorm [4096]

    # Output head
    # 1 × Linear [50277, 4096] → local [25139, 4096] at TP=2 (uneven split)
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

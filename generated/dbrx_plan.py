"""Tensor-parallel plan for DbrxForCausalLM, made by `plangen init`: edit it freely.

Model:       dbrx (DbrxForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for DbrxForCausalLM
Regenerate:  plangen init dbrx -o generated/dbrx_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.dbrx_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/dbrx_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
FlatExpertsParallel, LocalHeadCounts, MoeBlockParallel, MultiQueryColwiseParallel). The logits leave
as a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles import FlatExpertsParallel, LocalHeadCounts, MoeBlockParallel, MultiQueryColwiseParallel

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "dbrx"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [32000, 2048] → local [16000, 2048] at TP=2; vocab-parallel embedding; all-reduce
    "transformer.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 24 × DbrxAttention; slices the fused qkv by head counts: make them this rank's
    "transformer.blocks.*.norm_attn_norm.attn": LocalHeadCounts(attributes=("hidden_size", "num_key_value_groups")),
    # 24 × Linear [2304, 2048] → local [1152, 2048] at TP=2
    # each rank holds its own query heads and the one KV head whole (its rows gathered per forward); one input-gradient
    # reduction per block
    "transformer.blocks.*.norm_attn_norm.attn.Wqkv": MultiQueryColwiseParallel(
        part_sizes=(16, 1, 1),
        shared_parts=(1, 2),
        input_layouts=Replicate(),
    ),
    # 24 × Linear [2048, 2048] → local [2048, 1024] at TP=2; row-parallel: one all-reduce
    "transformer.blocks.*.norm_attn_norm.attn.out_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # MLP
    # 24 × DbrxFFN
    # one all-reduce: the experts leave partial sums, reduced once here; their input gradient reduced once too (the
    # router's counted once)
    "transformer.blocks.*.ffn": MoeBlockParallel(
        router="router",
        gates=(),
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_input=True,
        output_layouts=(Partial(reduce_op="sum"),),
        desired_output_layouts=(Replicate(),),
        use_local_output=True,
    ),
    # 24 × DbrxExperts [14336, 2048] → local [7168, 2048] at TP=2
    # each rank holds E/tp whole experts (a Shard(0) of each flat [E * ffn, H] weight) where the TP size divides E, else
    # its slice of every expert's ffn rows, and computes the routes to them; partial sum out; its input's gradient left
    # to the block's one reduction
    "transformer.blocks.*.ffn.experts": FlatExpertsParallel(output_layouts=Partial(reduce_op="sum"), sum_input_grad=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "transformer.blocks.*.ffn.router": 24 × DbrxRouter

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "transformer.blocks.*.norm_attn_norm.norm_1": 24 × LayerNorm [2048]
    # "transformer.blocks.*.norm_attn_norm.norm_2": 24 × LayerNorm [2048]
    # "transformer.norm_f": 1 × LayerNorm [2048]

    # Output head
    # 1 × Linear [32000, 2048] → local [16000, 2048] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

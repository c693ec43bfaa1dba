"""Tensor-parallel plan for JetMoeForCausalLM, made by `plangen init`: edit it freely.

Model:       jetmoe (JetMoeForCausalLM), TP size 2, sequence parallel on
Seed:        the hand-written plan for JetMoeForCausalLM
Regenerate:  plangen init jetmoe -o generated/jetmoe_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.jetmoe_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/jetmoe_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
FusedColwiseParallel, GroupedColwiseParallel, GroupedRowwiseParallel, LocalHeadCounts,
RoutedBlockSequenceParallel, TiedEmbeddingParallel, TiedHeadParallel). model.embed_tokens and
lm_head share one weight: TiedEmbeddingParallel and TiedHeadParallel keep it one parameter, sharded
once on the vocabulary by whichever is applied first, so no re-tie is needed; keep the two together
(one alone leaves two parameters, which plangen verify reports). The logits leave as a DTensor
sharded on the vocabulary: the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or
torch's loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from plangen.styles import (
    FusedColwiseParallel,
    GroupedColwiseParallel,
    GroupedRowwiseParallel,
    LocalHeadCounts,
    RoutedBlockSequenceParallel,
    TiedEmbeddingParallel,
    TiedHeadParallel,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "jetmoe"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [32000, 2048] → local [16000, 2048] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual; one weight with lm_head (tied),
    # sharded once
    "model.embed_tokens": TiedEmbeddingParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(1),
        use_local_output=False,
        local_lookup=False,
    ),

    # Attention
    # 12 × JetMoeAttention
    # sequence parallel: the sequence gathered in once, the experts' partial sums reduce-scattered out, the bias added
    # once on the shard (its attention weights and router logits pass through)
    "model.layers.*.self_attention": RoutedBlockSequenceParallel(
        input_kwarg="hidden_states",
        bias="experts.bias",
        router="experts.router",
        reads_gathered=("kv_proj",),
        sequence_dim=1,
    ),
    # 12 × Linear [4096, 2048] → local [2048, 2048] at TP=2
    # packed [k; v] split by heads: each rank its share of both, the heads its query experts read
    "model.layers.*.self_attention.kv_proj": FusedColwiseParallel(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True),
    # 12 × JetMoeMoA
    # the attention experts' query width (all their heads) made this rank's: map() sizes its output by it
    "model.layers.*.self_attention.experts": LocalHeadCounts(attributes=("hidden_size",)),
    # 12 × JetMoeParallelExperts [8, 2048, 2048] → local [8, 1024, 2048] at TP=2
    # each attention expert's query heads split over TP; its input's gradient left to the block's one reduction
    "model.layers.*.self_attention.experts.input_linear": GroupedColwiseParallel(part_sizes=(), sum_input_grad=False),
    # 12 × JetMoeParallelExperts [8, 2048, 2048] → local [8, 2048, 1024] at TP=2
    # each attention expert's output projection by its heads: its partial sums left to the block
    "model.layers.*.self_attention.experts.output_linear": GroupedRowwiseParallel(sum_output=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.self_attention.experts.router": 12 × JetMoeTopKGating

    # MLP
    # 12 × JetMoeMoE
    # sequence parallel: the sequence gathered in once, the experts' partial sums reduce-scattered out, the bias added
    # once on the shard
    "model.layers.*.mlp": RoutedBlockSequenceParallel(input_kwarg="", bias="bias", router="router", reads_gathered=(), sequence_dim=1),
    # 12 × JetMoeParallelExperts [8, 11264, 2048] → local [8, 5632, 2048] at TP=2
    # each expert's [gate; up] split over TP, each rank its share of both; its input's gradient left to the block's one
    # reduction
    "model.layers.*.mlp.input_linear": GroupedColwiseParallel(part_sizes=(1, 1), sum_input_grad=False),
    # 12 × JetMoeParallelExperts [8, 2048, 5632] → local [8, 2048, 2816] at TP=2
    # each expert's down projection by its intermediate: its partial sums left to the block
    "model.layers.*.mlp.output_linear": GroupedRowwiseParallel(sum_output=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.router": 12 × JetMoeTopKGating

    # Norms
    # 12 × JetMoeRMSNorm [2048], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.input_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 12 × JetMoeRMSNorm [2048], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.post_attention_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × JetMoeRMSNorm [2048], replicated at TP=2; norm on the local sequence shard
    "model.norm": SequenceParallel(sequence_dim=1, use_local_output=False),

    # Output head
    # 1 × Linear [32000, 2048] → local [16000, 2048] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy; one weight with
    # model.embed_tokens (tied), sharded once
    "lm_head": TiedHeadParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
}

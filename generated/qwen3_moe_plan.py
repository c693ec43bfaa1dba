"""Tensor-parallel plan for Qwen3MoeForCausalLM, made by `plangen init`: edit it freely.

Model:       qwen3_moe (Qwen3MoeForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for Qwen3MoeForCausalLM
Regenerate:  plangen init qwen3_moe -o generated/qwen3_moe_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.qwen3_moe_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/qwen3_moe_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for ExpertsParallel,
KVHeadsColwiseParallel, MoeBlockParallel, PrepareAttentionInput, ReplicatedWithGradAllReduce).
Per-head norms see only their rank's heads: their style sums their weight gradient over TP. The
logits leave as a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles import (
    ExpertsParallel,
    KVHeadsColwiseParallel,
    MoeBlockParallel,
    PrepareAttentionInput,
    ReplicatedWithGradAllReduce,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "qwen3_moe"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [151936, 2048] → local [75968, 2048] at TP=2; vocab-parallel embedding; all-reduce
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 24 × Qwen3MoeAttention: no communication; one gradient reduction per block in backward
    "model.layers.*.self_attn": PrepareAttentionInput(
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
    # 24 × Linear [2048, 2048] → local [1024, 2048] at TP=2; column-parallel: each rank computes its own heads
    "model.layers.*.self_attn.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 24 × Linear [256, 2048] → local [128, 2048] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 24 × Linear [256, 2048] → local [128, 2048] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.v_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 24 × Qwen3MoeRMSNorm [64], replicated at TP=2
    # per-head norm sees only local heads: its weight gradient is summed over TP
    "model.layers.*.self_attn.q_norm": ReplicatedWithGradAllReduce(sequence_dim=2, use_local_output=True),
    # 24 × Qwen3MoeRMSNorm [64], replicated at TP=2
    # per-head norm sees only local heads: its weight gradient is summed over TP
    "model.layers.*.self_attn.k_norm": ReplicatedWithGradAllReduce(sequence_dim=2, use_local_output=True),
    # 24 × Linear [2048, 2048] → local [2048, 1024] at TP=2; row-parallel: one all-reduce
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # MLP
    # 24 × Qwen3MoeSparseMoeBlock
    # one all-reduce of the summed branches: the experts leave partial sums, reduced once here; their input gradients
    # summed locally and reduced once (the router's counted once)
    "model.layers.*.mlp": MoeBlockParallel(
        router="gate",
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
    # 24 × Qwen3MoeExperts [128, 1536, 2048] → local [64, 1536, 2048] at TP=2
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the block's one reduction
    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.gate": 24 × Qwen3MoeTopKRouter [128, 2048]

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.layers.*.input_layernorm": 24 × Qwen3MoeRMSNorm [2048]
    # "model.layers.*.post_attention_layernorm": 24 × Qwen3MoeRMSNorm [2048]
    # "model.norm": 1 × Qwen3MoeRMSNorm [2048]

    # Output head
    # 1 × Linear [151936, 2048] → local [75968, 2048] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

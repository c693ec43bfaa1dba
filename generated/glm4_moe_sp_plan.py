"""Tensor-parallel plan for Glm4MoeForCausalLM, made by `plangen init`: edit it freely.

Model:       glm4_moe (Glm4MoeForCausalLM), TP size 2, sequence parallel on
Seed:        the hand-written plan for Glm4MoeForCausalLM
Regenerate:  plangen init glm4_moe -o generated/glm4_moe_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.glm4_moe_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/glm4_moe_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for ExpertsParallel,
KVHeadsColwiseParallel, MoeBlockParallel, PartialGradInput, PrepareAttentionInput). The logits leave
as a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

from plangen.styles import (
    ExpertsParallel,
    KVHeadsColwiseParallel,
    MoeBlockParallel,
    PartialGradInput,
    PrepareAttentionInput,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "glm4_moe"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [151552, 4096] → local [75776, 4096] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),

    # Attention
    # 46 × Glm4MoeAttention: one all-gather of the sequence per attention block; one gradient reduction per block in
    # backward
    "model.layers.*.self_attn": PrepareAttentionInput(
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
    # 46 × Linear [4032, 4096] → local [2016, 4096] at TP=2; column-parallel: each rank computes its own heads
    "model.layers.*.self_attn.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 46 × Linear [336, 4096] → local [168, 4096] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 46 × Linear [336, 4096] → local [168, 4096] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.v_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 46 × Linear [4096, 4032] → local [4096, 2016] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),

    # MLP
    # 1 × Glm4MoeMLP, 45 × Glm4MoeMoE
    # one all-gather of the sequence in, one reduce-scatter out: the experts, shared experts and dense projections leave
    # partial sums, reduced once here; their input gradients summed locally and reduced once (the router's counted once)
    "model.layers.*.mlp": MoeBlockParallel(
        router="gate",
        gates=(),
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_input=True,
        output_layouts=(Partial(reduce_op="sum"),),
        desired_output_layouts=(Shard(1),),
        use_local_output=False,
    ),
    # 45 × Glm4MoeExperts [128, 2816, 4096] → local [64, 2816, 4096] at TP=2
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the block's one reduction
    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # 45 × Glm4MoeMLP
    # shared experts: one Replicate DTensor input, so gate and up add their partial input gradients on it; its input's
    # gradient left to the block's one reduction
    "model.layers.*.mlp.shared_experts": PartialGradInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 45 × Linear [1408, 4096] → local [704, 4096] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 45 × Linear [1408, 4096] → local [704, 4096] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 45 × Linear [4096, 1408] → local [4096, 704] at TP=2
    # shared experts: row-parallel, partial sum out (reduced by the block)
    "model.layers.*.mlp.shared_experts.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # 1 × Linear [10944, 4096] → local [5472, 4096] at TP=2; dense MLP (layers without experts): column-parallel
    "model.layers.*.mlp.gate_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [10944, 4096] → local [5472, 4096] at TP=2; dense MLP (layers without experts): column-parallel
    "model.layers.*.mlp.up_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [4096, 10944] → local [4096, 5472] at TP=2
    # dense MLP (layers without experts): row-parallel, partial sum out (reduced by the block)
    "model.layers.*.mlp.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.gate": 45 × Glm4MoeTopkRouter [128, 4096]

    # Norms
    # 46 × Glm4MoeRMSNorm [4096], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.input_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 46 × Glm4MoeRMSNorm [4096], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.post_attention_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × Glm4MoeRMSNorm [4096], replicated at TP=2; norm on the local sequence shard
    "model.norm": SequenceParallel(sequence_dim=1, use_local_output=False),

    # Output head
    # 1 × Linear [151552, 4096] → local [75776, 4096] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
}

"""Tensor-parallel plan for DeepseekV2ForCausalLM, made by `plangen init`: edit it freely.

Model:       deepseek_v2 (DeepseekV2ForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for DeepseekV2ForCausalLM
Regenerate:  plangen init deepseek_v2 -o generated/deepseek_v2_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.deepseek_v2_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/deepseek_v2_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for ExpertsParallel,
MlaAttentionParallel, MoeBlockParallel, PartialGradInput). The logits leave as a DTensor sharded on
the vocabulary: the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's
loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles import ExpertsParallel, MlaAttentionParallel, MoeBlockParallel, PartialGradInput

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "deepseek_v2"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [102400, 4096] → local [51200, 4096] at TP=2; vocab-parallel embedding; all-reduce
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 32 × DeepseekV2Attention
    # no communication; a local input for the replicated down-projections; the shared rope key's gradient summed over TP
    # (its width read from the module)
    "model.layers.*.self_attn": MlaAttentionParallel(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=True,
        sharded_query_latent=False,
    ),
    # 32 × Linear [6144, 1536] → local [3072, 1536] at TP=2; column-parallel: each rank computes its own heads' queries
    "model.layers.*.self_attn.q_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 32 × Linear [8192, 512] → local [4096, 512] at TP=2
    # column-parallel: each rank computes its own heads' keys and values
    "model.layers.*.self_attn.kv_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 32 × Linear [4096, 4096] → local [4096, 2048] at TP=2; row-parallel: one all-reduce
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),
    # Left replicated on purpose: low-rank down-projection (or its norm), shared by every head: computed whole on every
    # rank
    # "model.layers.*.self_attn.q_a_proj": 32 × Linear [1536, 4096]
    # "model.layers.*.self_attn.q_a_layernorm": 32 × DeepseekV2RMSNorm [1536]
    # "model.layers.*.self_attn.kv_a_layernorm": 32 × DeepseekV2RMSNorm [512]
    # Left replicated on purpose: the KV latent and the shared rope key, computed whole on every rank; the rope key's
    # gradient is summed over TP by the attention's MlaAttentionParallel
    # "model.layers.*.self_attn.kv_a_proj_with_mqa": 32 × Linear [576, 4096]

    # MLP
    # 32 × DeepseekV2Moe
    # one all-reduce of the summed branches: the experts and shared experts leave partial sums, reduced once here; their
    # input gradients summed locally and reduced once (the router's counted once)
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
    # 32 × DeepseekV2Experts [64, 2814, 4096] → local [32, 2814, 4096] at TP=2
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the block's one reduction
    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # 32 × DeepseekV2MLP
    # shared experts: one Replicate DTensor input, so gate and up add their partial input gradients on it; its input's
    # gradient left to the block's one reduction
    "model.layers.*.mlp.shared_experts": PartialGradInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 32 × Linear [2814, 4096] → local [1407, 4096] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 32 × Linear [2814, 4096] → local [1407, 4096] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 32 × Linear [4096, 2814] → local [4096, 1407] at TP=2
    # shared experts: row-parallel, partial sum out (reduced by the block)
    "model.layers.*.mlp.shared_experts.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.gate": 32 × DeepseekV2TopkRouter [64, 4096]

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.layers.*.input_layernorm": 32 × DeepseekV2RMSNorm [4096]
    # "model.layers.*.post_attention_layernorm": 32 × DeepseekV2RMSNorm [4096]
    # "model.norm": 1 × DeepseekV2RMSNorm [4096]

    # Output head
    # 1 × Linear [102400, 4096] → local [51200, 4096] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

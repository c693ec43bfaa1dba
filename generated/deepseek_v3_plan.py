"""Tensor-parallel plan for DeepseekV3ForCausalLM, made by `plangen init`: edit it freely.

Model:       deepseek_v3 (DeepseekV3ForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for DeepseekV3ForCausalLM
Regenerate:  plangen init deepseek_v3 -o generated/deepseek_v3_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.deepseek_v3_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/deepseek_v3_plan.py`.

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
PLANGEN_MODEL = "deepseek_v3"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [129280, 7168] → local [64640, 7168] at TP=2; vocab-parallel embedding; all-reduce
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 61 × DeepseekV3Attention
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
    # 61 × Linear [24576, 1536] → local [12288, 1536] at TP=2
    # column-parallel: each rank computes its own heads' queries
    "model.layers.*.self_attn.q_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 61 × Linear [32768, 512] → local [16384, 512] at TP=2
    # column-parallel: each rank computes its own heads' keys and values
    "model.layers.*.self_attn.kv_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 61 × Linear [7168, 16384] → local [7168, 8192] at TP=2; row-parallel: one all-reduce
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),
    # Left replicated on purpose: low-rank down-projection (or its norm), shared by every head: computed whole on every
    # rank
    # "model.layers.*.self_attn.q_a_proj": 61 × Linear [1536, 7168]
    # "model.layers.*.self_attn.q_a_layernorm": 61 × DeepseekV3RMSNorm [1536]
    # "model.layers.*.self_attn.kv_a_layernorm": 61 × DeepseekV3RMSNorm [512]
    # Left replicated on purpose: the KV latent and the shared rope key, computed whole on every rank; the rope key's
    # gradient is summed over TP by the attention's MlaAttentionParallel
    # "model.layers.*.self_attn.kv_a_proj_with_mqa": 61 × Linear [576, 7168]

    # MLP
    # 3 × DeepseekV3MLP, 58 × DeepseekV3MoE
    # one all-reduce of the summed branches: the experts, shared experts and dense projections leave partial sums,
    # reduced once here; their input gradients summed locally and reduced once (the router's counted once)
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
    # 58 × DeepseekV3Experts [256, 4096, 7168] → local [128, 4096, 7168] at TP=2
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the block's one reduction
    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # 58 × DeepseekV3MLP
    # shared experts: one Replicate DTensor input, so gate and up add their partial input gradients on it; its input's
    # gradient left to the block's one reduction
    "model.layers.*.mlp.shared_experts": PartialGradInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 58 × Linear [2048, 7168] → local [1024, 7168] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 58 × Linear [2048, 7168] → local [1024, 7168] at TP=2; shared experts: column-parallel
    "model.layers.*.mlp.shared_experts.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 58 × Linear [7168, 2048] → local [7168, 1024] at TP=2
    # shared experts: row-parallel, partial sum out (reduced by the block)
    "model.layers.*.mlp.shared_experts.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # 3 × Linear [18432, 7168] → local [9216, 7168] at TP=2; dense MLP (layers without experts): column-parallel
    "model.layers.*.mlp.gate_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 3 × Linear [18432, 7168] → local [9216, 7168] at TP=2; dense MLP (layers without experts): column-parallel
    "model.layers.*.mlp.up_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 3 × Linear [7168, 18432] → local [7168, 9216] at TP=2
    # dense MLP (layers without experts): row-parallel, partial sum out (reduced by the block)
    "model.layers.*.mlp.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.gate": 58 × DeepseekV3TopkRouter [256, 7168]

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.layers.*.input_layernorm": 61 × DeepseekV3RMSNorm [7168]
    # "model.layers.*.post_attention_layernorm": 61 × DeepseekV3RMSNorm [7168]
    # "model.norm": 1 × DeepseekV3RMSNorm [7168]

    # Output head
    # 1 × Linear [129280, 7168] → local [64640, 7168] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

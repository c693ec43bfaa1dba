"""Tensor-parallel plan for LongcatFlashForCausalLM, made by `plangen init`: edit it freely.

Model:       longcat_flash (LongcatFlashForCausalLM), TP size 2, sequence parallel on
Seed:        the hand-written plan for LongcatFlashForCausalLM
Regenerate:  plangen init longcat_flash -o generated/longcat_flash_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.longcat_flash_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/longcat_flash_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for ExpertsParallel,
MlaAttentionParallel, MoeBlockParallel). The logits leave as a DTensor sharded on the vocabulary:
the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.styles import ExpertsParallel, MlaAttentionParallel, MoeBlockParallel

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "longcat_flash"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [131072, 6144] → local [65536, 6144] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),

    # Attention
    # 56 × LongcatFlashMLA
    # one all-gather of the sequence per attention block; a local input for the replicated down-projections; the shared
    # rope key's gradient summed over TP (its width read from the module)
    "model.layers.*.self_attn.*": MlaAttentionParallel(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=True,
        sharded_query_latent=False,
    ),
    # 56 × Linear [12288, 1536] → local [6144, 1536] at TP=2; column-parallel: each rank computes its own heads' queries
    "model.layers.*.self_attn.*.q_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 56 × Linear [16384, 512] → local [8192, 512] at TP=2
    # column-parallel: each rank computes its own heads' keys and values
    "model.layers.*.self_attn.*.kv_b_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 56 × Linear [6144, 8192] → local [6144, 4096] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.self_attn.*.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),
    # Left replicated on purpose: low-rank down-projection (or its norm), shared by every head: computed whole on every
    # rank
    # "model.layers.*.self_attn.*.q_a_proj": 56 × Linear [1536, 6144]
    # "model.layers.*.self_attn.*.q_a_layernorm": 56 × LongcatFlashRMSNorm [1536]
    # "model.layers.*.self_attn.*.kv_a_layernorm": 56 × LongcatFlashRMSNorm [512]
    # Left replicated on purpose: the KV latent and the shared rope key, computed whole on every rank; the rope key's
    # gradient is summed over TP by the attention's MlaAttentionParallel
    # "model.layers.*.self_attn.*.kv_a_proj_with_mqa": 56 × Linear [576, 6144]

    # MLP
    # 28 × LongcatFlashMoE
    # one all-gather of the sequence in, one reduce-scatter out: the experts leave partial sums, reduced once here;
    # their input gradients summed locally and reduced once (the router's counted once)
    "model.layers.*.mlp": MoeBlockParallel(
        router="router",
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
    # 28 × LongcatFlashExperts [768, 4096, 6144] → local [768, 2048, 6144] at TP=2: each expert's intermediate split
    # (beside 256 identity experts)
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the block's one reduction
    "model.layers.*.mlp.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # 56 × LongcatFlashMLP: dense MLPs: one all-gather of the sequence per MLP block; one gradient reduction per block
    # in backward
    "model.layers.*.mlps.*": PrepareModuleInput(
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 56 × Linear [12288, 6144] → local [6144, 6144] at TP=2; dense MLPs: column-parallel
    "model.layers.*.mlps.*.gate_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 56 × Linear [12288, 6144] → local [6144, 6144] at TP=2; dense MLPs: column-parallel
    "model.layers.*.mlps.*.up_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 56 × Linear [6144, 12288] → local [6144, 6144] at TP=2
    # dense MLPs: row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mlps.*.down_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mlp.router": 28 × LongcatFlashTopkRouter

    # Norms
    # 56 × LongcatFlashRMSNorm [6144], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.input_layernorm.*": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 56 × LongcatFlashRMSNorm [6144], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.post_attention_layernorm.*": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × LongcatFlashRMSNorm [6144], replicated at TP=2; norm on the local sequence shard
    "model.norm": SequenceParallel(sequence_dim=1, use_local_output=False),

    # Output head
    # 1 × Linear [131072, 6144] → local [65536, 6144] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
}

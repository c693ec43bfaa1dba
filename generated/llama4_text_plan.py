"""Tensor-parallel plan for Llama4ForCausalLM, made by `plangen init`: edit it freely.

Model:       llama4_text (Llama4ForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for Llama4ForCausalLM
Regenerate:  plangen init llama4_text -o generated/llama4_text_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.llama4_text_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/llama4_text_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
EveryTokenMoeParallel, KVHeadsColwiseParallel, PartialGradInput, PrepareAttentionInput,
RowwiseParallelOwnOutput). The logits leave as a DTensor sharded on the vocabulary: the loss must
take it (plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles import (
    EveryTokenMoeParallel,
    KVHeadsColwiseParallel,
    PartialGradInput,
    PrepareAttentionInput,
    RowwiseParallelOwnOutput,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "llama4_text"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [202048, 5120] → local [101024, 5120] at TP=2; vocab-parallel embedding; all-reduce
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 48 × Llama4TextAttention: no communication; one gradient reduction per block in backward
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
    # 48 × Linear [5120, 5120] → local [2560, 5120] at TP=2; column-parallel: each rank computes its own heads
    "model.layers.*.self_attn.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 48 × Linear [1024, 5120] → local [512, 5120] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 48 × Linear [1024, 5120] → local [512, 5120] at TP=2
    # column-parallel over KV heads; replicated where TP exceeds them
    "model.layers.*.self_attn.v_proj": KVHeadsColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 48 × Linear [5120, 5120] → local [5120, 2560] at TP=2; row-parallel: one all-reduce
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),

    # MLP
    # 48 × Llama4TextMoe
    # each rank holds E/tp whole experts and scores of them; one all-reduce of the summed branches (the router logits
    # pass through); the experts' and the shared expert's input gradients reduced once
    "model.layers.*.feed_forward": EveryTokenMoeParallel(
        input_grad_once=True,
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_input=True,
        output_layouts=(Partial(reduce_op="sum"), None),
        desired_output_layouts=(Replicate(), Replicate()),
        use_local_output=True,
    ),
    # 48 × Llama4TextMLP
    # shared expert: one Replicate DTensor input, gate and up add their partial input gradients on it (reduced once by
    # the block)
    "model.layers.*.feed_forward.shared_expert": PartialGradInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 48 × Linear [8192, 5120] → local [4096, 5120] at TP=2; shared expert: column-parallel
    "model.layers.*.feed_forward.shared_expert.gate_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 48 × Linear [8192, 5120] → local [4096, 5120] at TP=2; shared expert: column-parallel
    "model.layers.*.feed_forward.shared_expert.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 48 × Linear [5120, 8192] → local [5120, 4096] at TP=2
    # shared expert: row-parallel, partial sum out (reduced by the block); its output is a copy, which the block adds
    # the routed experts' sum into in place
    "model.layers.*.feed_forward.shared_expert.down_proj": RowwiseParallelOwnOutput(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # Left replicated on purpose: the router scores every expert for every token on every rank: routing stays exact (the
    # block keeps this rank's experts' scores)
    # "model.layers.*.feed_forward.router": 48 × Llama4Router [16, 5120]

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.layers.*.input_layernorm": 48 × Llama4TextRMSNorm [5120]
    # "model.layers.*.post_attention_layernorm": 48 × Llama4TextRMSNorm [5120]
    # "model.norm": 1 × Llama4TextRMSNorm [5120]

    # Output head
    # 1 × Linear [202048, 5120] → local [101024, 5120] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
}

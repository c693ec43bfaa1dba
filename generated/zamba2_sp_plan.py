"""Tensor-parallel plan for Zamba2ForCausalLM, made by `plangen init`: edit it freely.

Model:       zamba2 (Zamba2ForCausalLM), TP size 2, sequence parallel on
Seed:        the hand-written plan for Zamba2ForCausalLM
Regenerate:  plangen init zamba2 -o generated/zamba2_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.zamba2_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/zamba2_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
FusedColwiseParallel, GatedRMSNormParallel, Mamba2MixerParallel, TiedEmbeddingParallel,
TiedHeadParallel). Except: 26 parameters are held by several modules (as
model.layers.6.shared_transformer.self_attn.q_proj.weight and
model.layers.12.shared_transformer.self_attn.q_proj.weight): only a runtime that makes them one
again after parallelize_module (plangen's) trains each as one. model.embed_tokens and lm_head share
one weight: TiedEmbeddingParallel and TiedHeadParallel keep it one parameter, sharded once on the
vocabulary by whichever is applied first, so no re-tie is needed; keep the two together (one alone
leaves two parameters, which plangen verify reports). The logits leave as a DTensor sharded on the
vocabulary: the loss must take it (plangen.loss.vocab_parallel_cross_entropy, or torch's
loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.styles import (
    FusedColwiseParallel,
    GatedRMSNormParallel,
    Mamba2MixerParallel,
    TiedEmbeddingParallel,
    TiedHeadParallel,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "zamba2"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [32000, 2560] → local [16000, 2560] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual; one weight with lm_head (tied),
    # sharded once
    "model.embed_tokens": TiedEmbeddingParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(1),
        use_local_output=False,
        local_lookup=False,
    ),

    # Attention
    # 9 × Zamba2AttentionDecoderLayer: shared block reads its input beside the token embeddings: both sequences gathered
    # (two all-gathers), the block computed on whole plain tensors
    "model.layers.*.shared_transformer": PrepareModuleInput(
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts={"original_hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"original_hidden_states": Replicate()},
        use_local_output=True,
    ),
    # 9 × Linear [5120, 5120] → local [2560, 5120] at TP=2
    # column-parallel: own heads; reduces its own input gradient (one all-reduce)
    "model.layers.*.shared_transformer.self_attn.q_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 9 × Linear [5120, 5120] → local [2560, 5120] at TP=2
    # column-parallel: own heads; reduces its own input gradient (one all-reduce)
    "model.layers.*.shared_transformer.self_attn.k_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 9 × Linear [5120, 5120] → local [2560, 5120] at TP=2
    # column-parallel: own heads; reduces its own input gradient (one all-reduce)
    "model.layers.*.shared_transformer.self_attn.v_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 9 × Linear [2560, 5120] → local [2560, 2560] at TP=2; row-parallel: one all-reduce
    "model.layers.*.shared_transformer.self_attn.o_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # MLP
    # 9 × Linear [20480, 2560] → local [10240, 2560] at TP=2
    # each rank holds its own slice of gate and of up; reduces its own input gradient (one all-reduce)
    "model.layers.*.shared_transformer.feed_forward.gate_up_proj": FusedColwiseParallel(
        part_sizes=(1, 1),
        input_layouts=Replicate(),
        use_local_output=True,
    ),
    # 81 × Linear [20480, 128] → local [10240, 128] at TP=2
    # adapter's up-projection, laid out as gate_up_proj; reduces its own input gradient (one all-reduce)
    "model.layers.*.shared_transformer.feed_forward.gate_up_proj_adapter_list.*.1": FusedColwiseParallel(
        part_sizes=(1, 1),
        input_layouts=Replicate(),
        use_local_output=True,
    ),
    # 9 × Linear [2560, 10240] → local [2560, 5120] at TP=2; row-parallel: one all-reduce
    "model.layers.*.shared_transformer.feed_forward.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),
    # Left replicated on purpose: adapter's rank-wide down-projection: whole on every rank, its output gradient summed
    # by the up-projection
    # "model.layers.*.shared_transformer.feed_forward.gate_up_proj_adapter_list.*.0": 81 × Linear [128, 2560]

    # Norms
    # 45 × Zamba2RMSNorm [2560], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.input_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 9 × Zamba2RMSNorm [2560], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.mamba_decoder.input_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × Zamba2RMSNorm [2560], replicated at TP=2; norm on the local sequence shard
    "model.final_layernorm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # Left replicated on purpose: norm of the shared block's whole input: nothing to shard
    # "model.layers.*.shared_transformer.input_layernorm": 9 × Zamba2RMSNorm [5120]
    # "model.layers.*.shared_transformer.pre_ff_layernorm": 9 × Zamba2RMSNorm [2560]

    # Output head
    # 1 × Linear [32000, 2560] → local [16000, 2560] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy; one weight with
    # model.embed_tokens (tied), sharded once
    "lm_head": TiedHeadParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),

    # Other
    # 45 × Zamba2MambaMixer [8] → local [4] at TP=2
    # Mamba2 mixer split by heads: z, x, dt, A_log, D, dt_bias and x's conv channels with the heads, B and C by groups
    # (one group: its rows gathered whole per forward, gradient reduce-scattered); one all-gather of the sequence in,
    # its gradient reduce-scattered
    "model.layers.*.mamba": Mamba2MixerParallel(input_layouts=Shard(1)),
    # 45 × Zamba2RMSNormGated [5120] → local [2560] at TP=2
    # gated RMSNorm on this rank's heads; a group spread over ranks (n_groups 1) all-reduces its sum of squares (B·S
    # values each way)
    "model.layers.*.mamba.norm": GatedRMSNormParallel(),
    # 45 × Linear [2560, 5120] → local [2560, 2560] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mamba.out_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),
    # 9 × Zamba2MambaMixer [8] → local [4] at TP=2
    # Mamba2 mixer split by heads: z, x, dt, A_log, D, dt_bias and x's conv channels with the heads, B and C by groups
    # (one group: its rows gathered whole per forward, gradient reduce-scattered); one all-gather of the sequence in,
    # its gradient reduce-scattered
    "model.layers.*.mamba_decoder.mamba": Mamba2MixerParallel(input_layouts=Shard(1)),
    # 9 × Zamba2RMSNormGated [5120] → local [2560] at TP=2
    # gated RMSNorm on this rank's heads; a group spread over ranks (n_groups 1) all-reduces its sum of squares (B·S
    # values each way)
    "model.layers.*.mamba_decoder.mamba.norm": GatedRMSNormParallel(),
    # 9 × Linear [2560, 5120] → local [2560, 2560] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mamba_decoder.mamba.out_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Shard(1),
        use_local_output=False,
    ),
    # 9 × Linear [2560, 2560]: whole on every rank; keeps this rank's sequence shard of its output for the residual
    # stream
    "model.layers.*.linear": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False),
}

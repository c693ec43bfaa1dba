"""Tensor-parallel plan for Phi4MultimodalForCausalLM, made by `plangen init`: edit it freely.

Model:       phi4_multimodal (Phi4MultimodalForCausalLM), TP size 2, sequence parallel off
Seed:        the hand-written plan for Phi4MultimodalForCausalLM
Regenerate:  plangen init phi4_multimodal -o generated/phi4_multimodal_plan.py --tp-size 2 --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.phi4_multimodal_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/phi4_multimodal_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for
AllReduceParamGrads, FusedColwiseParallel, LocalHeadCounts, PrepareAttentionInputOutput). Per-head
norms see only their rank's heads: their style sums their weight gradient over TP. The logits leave
as a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

from plangen.styles import AllReduceParamGrads, FusedColwiseParallel, LocalHeadCounts, PrepareAttentionInputOutput

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "phi4_multimodal"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = False

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [200064, 3072] → local [100032, 3072] at TP=2; vocab-parallel embedding; all-reduce
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),

    # Attention
    # 32 × Phi4MultimodalAttention; slices the fused qkv by head counts: make them this rank's
    "model.layers.*.self_attn": LocalHeadCounts(
        attributes=("num_key_value_heads", "config.num_attention_heads", "config.num_key_value_heads"),
    ),
    # 32 × Linear [4608, 3072] → local [2304, 3072] at TP=2
    # each rank holds its own heads' q, k, v; one input-gradient reduction per block
    "model.layers.*.self_attn.qkv_proj": FusedColwiseParallel(part_sizes=(32, 8, 8), input_layouts=Replicate(), use_local_output=True),
    # 32 × Linear [3072, 3072] → local [3072, 1536] at TP=2; row-parallel: one all-reduce
    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),
    # 27 × Phi4MultimodalVisionAttention: the image encoder's attention (views by -1 heads): one input-gradient
    # reduction per block in backward
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.self_attn": PrepareModuleInput(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=False,
    ),
    # 27 × Linear [1152, 1152] → local [576, 1152] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.self_attn.q_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 27 × Linear [1152, 1152] → local [576, 1152] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.self_attn.k_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 27 × Linear [1152, 1152] → local [576, 1152] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.self_attn.v_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 27 × Linear [1152, 1152] → local [1152, 576] at TP=2; row-parallel: all-reduce
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.self_attn.out_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),
    # 24 × Phi4MultimodalAudioAttention: the conformer's attention (views by -1 heads): one input-gradient reduction per
    # block in backward; its all-heads mask (with the bias) sliced to its heads
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.self_attn": PrepareAttentionInputOutput(
        input_layouts=(Replicate(), None),
        desired_input_layouts=(Replicate(), None),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_input=False,
        output_layouts=Replicate(),
        desired_output_layouts=Replicate(),
        use_local_output=True,
        head_attributes=(),
        head_inputs=("attention_mask",),
    ),
    # 24 × Linear [1024, 1024] → local [512, 1024] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.self_attn.q_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 24 × Linear [1024, 1024] → local [512, 1024] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.self_attn.k_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 24 × Linear [1024, 1024] → local [512, 1024] at TP=2; column-parallel: this rank's heads
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.self_attn.v_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 24 × Linear [1024, 1024] → local [1024, 512] at TP=2; row-parallel: all-reduce
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.self_attn.o_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # MLP
    # 32 × Linear [16384, 3072] → local [8192, 3072] at TP=2
    # each rank holds its own slice of gate and of up; one input-gradient reduction per block
    "model.layers.*.mlp.gate_up_proj": FusedColwiseParallel(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True),
    # 32 × Linear [3072, 8192] → local [3072, 4096] at TP=2; row-parallel: one all-reduce
    "model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),
    # 27 × Phi4MultimodalVisionMLP: the image encoder's MLP: one input-gradient reduction per block in backward
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.mlp": PrepareModuleInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 27 × Linear [4304, 1152] → local [2152, 1152] at TP=2; column-parallel: this rank's slice
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.mlp.fc1": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 27 × Linear [1152, 4304] → local [1152, 2152] at TP=2; row-parallel: all-reduce
    "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*.mlp.fc2": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),
    # 24 × Linear [3072, 1024] → local [1536, 1024] at TP=2
    # each rank holds its own slice of up and of gate; one input-gradient reduction per block
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.feed_forward_in.gate_up_proj": FusedColwiseParallel(
        part_sizes=(1, 1),
        input_layouts=Replicate(),
        use_local_output=True,
    ),
    # 24 × Linear [1024, 1536] → local [1024, 768] at TP=2; row-parallel: all-reduce
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.feed_forward_in.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),
    # 24 × Linear [3072, 1024] → local [1536, 1024] at TP=2
    # each rank holds its own slice of up and of gate; one input-gradient reduction per block
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.feed_forward_out.gate_up_proj": FusedColwiseParallel(
        part_sizes=(1, 1),
        input_layouts=Replicate(),
        use_local_output=True,
    ),
    # 24 × Linear [1024, 1536] → local [1024, 768] at TP=2; row-parallel: all-reduce
    "model.embed_tokens_extend.audio_embed.encoder.encoders.*.feed_forward_out.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    ),

    # Norms
    # Left replicated on purpose: sees the full hidden state on every rank: nothing to shard
    # "model.layers.*.input_layernorm": 32 × Phi4MultimodalRMSNorm [3072]
    # "model.layers.*.post_attention_layernorm": 32 × Phi4MultimodalRMSNorm [3072]
    # "model.norm": 1 × Phi4MultimodalRMSNorm [3072]

    # Output head
    # 1 × Linear [200064, 3072] → local [100032, 3072] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),

    # Other
    # 1 × Embedding [2000, 16], replicated at TP=2
    # one bias per head, sliced to this rank's heads in each layer: its gradient summed over TP
    "model.embed_tokens_extend.audio_embed.encoder.relative_attention_bias_layer.bias_values": AllReduceParamGrads(),
    # Left replicated on purpose: the conformer's convolution module (GLU pointwise conv, depthwise conv, then two
    # channel-mixing pointwise convs with an activation between them): split by channels it would need a collective
    # between those two, a third per block
    # "model.embed_tokens_extend.audio_embed.encoder.encoders.*.conv": 24 × Phi4MultimodalAudioConvModule
    # Left replicated on purpose: outside the towers' attention and MLPs (patch and position embeddings, the conformer's
    # subsampling convs, norms, the image pooling head, the projections into the text): whole on every rank, run once
    # per input, not once per layer
    # "model.embed_tokens_extend": 1 × Phi4MultimodalFeatureEmbedding
}

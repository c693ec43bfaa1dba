"""Tensor-parallel plan for NemotronHForCausalLM, made by `plangen init`: edit it freely.

Model:       nemotron_h (NemotronHForCausalLM), TP size 2, sequence parallel on
Seed:        the hand-written plan for NemotronHForCausalLM
Regenerate:  plangen init nemotron_h -o generated/nemotron_h_sp_plan.py --tp-size 2 --sequence-parallel --force
Made with:   plangen 0.1.0, transformers 5.24.0, torch 2.13.0+cpu

Each entry maps a module pattern (torch's fnmatch rule, one name per dot) to a ParallelStyle with
every argument written out. Commented-out patterns are left replicated on purpose. Use it with

    parallelize_model(..., custom_parallel_plan="generated.nemotron_h_sp_plan.custom_parallel_plan")

and check it after editing with `plangen verify generated/nemotron_h_sp_plan.py`.

It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and
then FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does;
nothing from plangen's runtime, though plangen.styles must be importable there (for ExpertsParallel,
GatedRMSNormParallel, Mamba2MixerParallel, MoeBlockParallel, PartialGradInput). The logits leave as
a DTensor sharded on the vocabulary: the loss must take it
(plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel()).
"""

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from plangen.styles import (
    ExpertsParallel,
    GatedRMSNormParallel,
    Mamba2MixerParallel,
    MoeBlockParallel,
    PartialGradInput,
)

# Read by `plangen verify` (the model, TP size and sequence parallel this plan was made for).
PLANGEN_MODEL = "nemotron_h"
PLANGEN_TP_SIZE = 2
PLANGEN_SEQUENCE_PARALLEL = True

custom_parallel_plan: dict[str, ParallelStyle] = {
    # Embeddings
    # 1 × Embedding [131072, 4096] → local [65536, 4096] at TP=2
    # vocab-parallel embedding; reduce-scatter into the sequence-sharded residual
    "model.embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),

    # Attention
    # 1 × NemotronHAttention: one all-gather of the sequence per attention block
    "model.layers.2.mixer": PrepareModuleInput(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=False,
    ),
    # 1 × Linear [4096, 4096] → local [2048, 4096] at TP=2; column-parallel: own heads
    "model.layers.*.mixer.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [1024, 4096] → local [512, 4096] at TP=2; column-parallel: own heads
    "model.layers.*.mixer.k_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [1024, 4096] → local [512, 4096] at TP=2; column-parallel: own heads
    "model.layers.*.mixer.v_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [4096, 4096] → local [4096, 2048] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mixer.o_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),

    # MLP
    # 1 × NemotronHMoE
    # one all-gather of the sequence in, one reduce-scatter out: the experts and the shared expert leave partial sums,
    # reduced once here, and their input gradients
    "model.layers.1.mixer": MoeBlockParallel(
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
    # 1 × NemotronHExperts [8, 7688, 4096] → local [4, 7688, 4096] at TP=2
    # each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's intermediate, and
    # computes the routes to them; partial sum out; its input's gradient left to the mixer's one reduction
    "model.layers.*.mixer.experts": ExpertsParallel(output_layouts=Partial(reduce_op="sum"), use_local_output=True, sum_input_grad=False),
    # 1 × NemotronHMLP; shared expert: a Replicate DTensor input, its partial gradient left to the mixer's one reduction
    "model.layers.*.mixer.shared_experts": PartialGradInput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 1 × Linear [7688, 4096] → local [3844, 4096] at TP=2; shared expert: column-parallel
    "model.layers.*.mixer.shared_experts.up_proj": ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    ),
    # 1 × Linear [4096, 7688] → local [4096, 3844] at TP=2
    # shared expert: row-parallel, partial sum out (reduced by the mixer)
    "model.layers.*.mixer.shared_experts.down_proj": RowwiseParallel(
        input_layouts=Shard(-1),
        output_layouts=Partial(reduce_op="sum"),
        use_local_output=True,
    ),
    # 1 × NemotronHMLP: one all-gather of the sequence per MLP block
    "model.layers.3.mixer": PrepareModuleInput(
        input_layouts=(Shard(1),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    ),
    # 1 × Linear [21504, 4096] → local [10752, 4096] at TP=2; column-parallel
    "model.layers.*.mixer.up_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True),
    # 1 × Linear [4096, 21504] → local [4096, 10752] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mixer.down_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),
    # Left replicated on purpose: the router sees every token on every rank: routing stays exact
    # "model.layers.*.mixer.gate": 1 × NemotronHTopkRouter [8, 4096]

    # Norms
    # 4 × NemotronHRMSNorm [4096], replicated at TP=2; norm on the local sequence shard
    "model.layers.*.norm": SequenceParallel(sequence_dim=1, use_local_output=False),
    # 1 × NemotronHRMSNorm [4096], replicated at TP=2; norm on the local sequence shard
    "model.norm_f": SequenceParallel(sequence_dim=1, use_local_output=False),

    # Output head
    # 1 × Linear [131072, 4096] → local [65536, 4096] at TP=2
    # vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),

    # Other
    # 1 × NemotronHMamba2Mixer [128] → local [64] at TP=2
    # Mamba2 mixer split by heads: z, x, dt, A_log, D, dt_bias and x's conv channels with the heads, B and C by groups
    # (one group: its rows gathered whole per forward, gradient reduce-scattered); one all-gather of the sequence in,
    # its gradient reduce-scattered
    "model.layers.0.mixer": Mamba2MixerParallel(input_layouts=Shard(1)),
    # 1 × NemotronHRMSNormGated [8192] → local [4096] at TP=2
    # gated RMSNorm on this rank's heads; a group spread over ranks (n_groups 1) all-reduces its sum of squares (B·S
    # values each way)
    "model.layers.*.mixer.norm": GatedRMSNormParallel(),
    # 1 × Linear [4096, 8192] → local [4096, 4096] at TP=2
    # row-parallel: reduce-scatter back to the sequence-sharded residual
    "model.layers.*.mixer.out_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False),
}

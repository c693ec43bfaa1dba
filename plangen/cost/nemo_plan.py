"""A NeMo-RL-style plan, the baseline plangen's plans are compared with.

Source: NeMo RL's ``_parallelize_llama`` (``nemo_rl/models/dtensor/parallelize.py``, NVIDIA-NeMo/RL),
the plan NeMo RL applies to ``LlamaForCausalLM``; applied here to any Llama-like decoder
(``{prefix}.embed_tokens``, ``{prefix}.layers.*.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``lm_head``). Qwen3's per-head norms are left as that plan leaves them: replicated, their gradient
not summed over TP (a correctness bug that costs nothing in communication).

TP: the same entries as NeMo's ``base_model_tp_plan``. Every column-parallel projection turns its
(local) input into a ``Replicate`` DTensor on its own, so q, k, v, gate and up each reduce their
input gradient: five all-reduces per layer in backward, where plangen's plans have two.

SP: NeMo's ``base_model_sp_plan`` entries on top. The residual stream stays a local,
sequence-sharded tensor, so the model sees ``S / tp`` tokens: NeMo RL passes ``position_ids``, and
so does the measurement. NeMo writes ``ColwiseParallel()`` for q/k/v and gate/up and relies on
each projection to gather the sequence-sharded input it receives from the norm; DTensor then
gathers it once per projection in forward but picks its own redistributions in backward (more
all-gathers on this torch). The gather is written out here, ``input_layouts=Shard(1)``: one
all-gather per projection (five per layer) in forward, one reduce-scatter per projection in
backward: the plan as intended, and the cheaper of the two. plangen's plans gather once per block
(two per layer).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

from plangen.plans.dense import LLAMA_NORMS, text_prefix


def build_nemo_style_plan(model: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """NeMo RL's Llama plan (TP, or TP + SP) for ``model``'s decoder."""
    p = f"{text_prefix(model)}."
    layer = f"{p}layers.*"
    plan: dict[str, ParallelStyle] = {
        f"{p}embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        f"{layer}.self_attn.q_proj": ColwiseParallel(),
        f"{layer}.self_attn.k_proj": ColwiseParallel(),
        f"{layer}.self_attn.v_proj": ColwiseParallel(),
        f"{layer}.self_attn.o_proj": RowwiseParallel(),
        f"{layer}.mlp.up_proj": ColwiseParallel(),
        f"{layer}.mlp.gate_proj": ColwiseParallel(),
        f"{layer}.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    if not sequence_parallel:
        return plan
    seq = Shard(1)
    plan.update(
        {
            f"{p}embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            f"{p}norm": SequenceParallel(),
            **{f"{layer}.{norm}": SequenceParallel() for norm in LLAMA_NORMS},
            f"{layer}.self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            f"{layer}.mlp.down_proj": RowwiseParallel(output_layouts=seq),
            "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
            # Written out: each projection gathers the sequence for itself (see the module docstring).
            **{
                f"{layer}.self_attn.{proj}": ColwiseParallel(input_layouts=seq)
                for proj in ("q_proj", "k_proj", "v_proj")
            },
            **{f"{layer}.mlp.{proj}": ColwiseParallel(input_layouts=seq) for proj in ("gate_proj", "up_proj")},
        }
    )
    return plan

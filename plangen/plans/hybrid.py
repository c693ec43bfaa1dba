"""Hand-written plan for the hybrid NemotronH (Mamba2 + attention + MLP (+ MoE) blocks).

Each block holds one mixer (``layers.N.mixer``) of one kind. Patterns name the projections only
the MLP and attention mixers have (``up_proj``/``down_proj``, ``q_proj``...), so they never touch
a Mamba mixer, whose fused ``in_proj`` splits into gate, state and time-step slices that do not
shard column-wise: Mamba and MoE mixers stay replicated, with the reason recorded.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans import CHECKPOINT_FILTERS, register_plan


def checkpoint_nemotron_h_block(block: nn.Module) -> bool:
    """Recompute MLP and Mamba blocks in backward; attention blocks keep their activations."""
    return getattr(block, "block_type", None) in ("mlp", "linear_attention")


CHECKPOINT_FILTERS["NemotronHForCausalLM"] = checkpoint_nemotron_h_block


@register_plan("NemotronHForCausalLM")
def plan_nemotron_h(model: nn.Module, sequence_parallel: bool) -> Plan:
    if sequence_parallel:
        raise ValueError(
            "NemotronHForCausalLM: no sequence-parallel plan (Mamba mixers need the whole sequence on every rank)"
        )
    layer = "model.layers.*.mixer"
    colwise = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    rowwise = dict(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)
    kinds = set(model.config.layers_block_type)
    entries = [
        PlanEntry("model.embeddings", "RowwiseParallel",
                  dict(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),
                  "embeddings", "vocab-parallel embedding; all-reduce"),
    ]
    if "full_attention" in kinds:
        entries += [PlanEntry(f"{layer}.{p}", "ColwiseParallel", colwise, "attention", "column-parallel: own heads")
                    for p in ("q_proj", "k_proj", "v_proj")]
        entries.append(PlanEntry(f"{layer}.o_proj", "RowwiseParallel", rowwise, "attention", "row-parallel: one all-reduce"))
    if "mlp" in kinds:
        entries += [
            PlanEntry(f"{layer}.up_proj", "ColwiseParallel", colwise, "mlp", "column-parallel"),
            PlanEntry(f"{layer}.down_proj", "RowwiseParallel", rowwise, "mlp", "row-parallel: one all-reduce"),
        ]
    entries.append(PlanEntry("lm_head", "ColwiseParallel",
                             dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
                             "output", "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy"))
    replicated = []
    if "linear_attention" in kinds:
        replicated.append(Replicated(f"{layer}.in_proj", "Mamba2 fused in_proj (gate | x·B·C | dt) has no column split", "other"))
    if "moe" in kinds:
        replicated.append(Replicated(f"{layer}.experts", "MoE experts need an expert-parallel kernel: replicated", "mlp"))
    return Plan(tuple(entries), "hand-written", tuple(replicated), False)

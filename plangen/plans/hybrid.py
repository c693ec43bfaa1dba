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
from plangen.plans.registry import CHECKPOINT_FILTERS, register_plan


def checkpoint_nemotron_h_block(block: nn.Module) -> bool:
    """Recompute MLP and Mamba blocks in backward; attention blocks keep their activations."""
    return getattr(block, "block_type", None) in ("mlp", "linear_attention")


CHECKPOINT_FILTERS["NemotronHForCausalLM"] = checkpoint_nemotron_h_block


@register_plan("NemotronHForCausalLM")
def plan_nemotron_h(model: nn.Module, sequence_parallel: bool) -> Plan:
    sp = sequence_parallel
    seq = Shard(1)
    residual = seq if sp else Replicate()
    layer = "model.layers.*.mixer"
    colwise = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    rowwise = dict(input_layouts=Shard(-1), output_layouts=residual, use_local_output=not sp)
    row_why = "row-parallel: " + ("reduce-scatter back to the sequence-sharded residual" if sp else "one all-reduce")
    kinds = set(model.config.layers_block_type)
    entries = [
        PlanEntry("model.embeddings", "RowwiseParallel",
                  dict(input_layouts=Replicate(), output_layouts=residual, use_local_output=not sp),
                  "embeddings", "vocab-parallel embedding; " + ("reduce-scatter into the sequence-sharded residual" if sp else "all-reduce")),
    ]
    if sp:
        # Mixer kinds differ per block and so do their call conventions (attention takes
        # hidden_states= by keyword, the others positionally): one entry per block index.
        entries += [_sp_block_entry(i, kind) for i, kind in enumerate(model.config.layers_block_type)]
        entries += [
            PlanEntry(norm, "SequenceParallel", dict(sequence_dim=1, use_local_output=False), "norms",
                      "norm on the local sequence shard")
            for norm in ("model.layers.*.norm", "model.norm_f")
        ]
    if "full_attention" in kinds:
        entries += [PlanEntry(f"{layer}.{p}", "ColwiseParallel", colwise, "attention", "column-parallel: own heads")
                    for p in ("q_proj", "k_proj", "v_proj")]
        entries.append(PlanEntry(f"{layer}.o_proj", "RowwiseParallel", rowwise, "attention", row_why))
    if "mlp" in kinds:
        entries += [
            PlanEntry(f"{layer}.up_proj", "ColwiseParallel", colwise, "mlp", "column-parallel"),
            PlanEntry(f"{layer}.down_proj", "RowwiseParallel", rowwise, "mlp", row_why),
        ]
    entries.append(PlanEntry("lm_head", "ColwiseParallel",
                             dict(input_layouts=residual, output_layouts=Shard(-1), use_local_output=False),
                             "output", "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy"))
    replicated = []
    if "linear_attention" in kinds:
        replicated.append(Replicated(f"{layer}.in_proj", "Mamba2 fused in_proj (gate | x·B·C | dt) has no column split", "other"))
    if "moe" in kinds:
        replicated.append(Replicated(f"{layer}.experts", "MoE experts need an expert-parallel kernel: replicated", "mlp"))
    return Plan(tuple(entries), "hand-written", tuple(replicated), sp)


def _sp_block_entry(index: int, kind: str) -> PlanEntry:
    """How block ``index``'s mixer meets the sequence-sharded residual stream under SP."""
    mixer = f"model.layers.{index}.mixer"
    if kind == "full_attention":
        return PlanEntry(mixer, "PrepareModuleInput", dict(
            input_layouts=None, desired_input_layouts=None,
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=False,
        ), "attention", "one all-gather of the sequence per attention block")
    if kind == "mlp":
        return PlanEntry(mixer, "PrepareModuleInput", dict(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
            input_kwarg_layouts=None, desired_input_kwarg_layouts=None, use_local_output=False,
        ), "mlp", "one all-gather of the sequence per MLP block")
    # Mamba and MoE mixers stay replicated: they get the whole sequence and every rank computes
    # them; their output is cut back to this rank's sequence shard (no communication).
    return PlanEntry(mixer, "PrepareModuleInputOutput", dict(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None, desired_input_kwarg_layouts=None, use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=False,
    ), "other", f"replicated {kind} mixer: gathers the sequence, computes it whole, keeps this rank's shard")

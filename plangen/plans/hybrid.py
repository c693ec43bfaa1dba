"""Hand-written plan for the hybrid NemotronH (Mamba2 + attention + MLP (+ MoE) blocks).

Each block holds one mixer (``layers.N.mixer``) of one kind. Patterns name the projections only
the MLP and attention mixers have (``up_proj``/``down_proj``, ``q_proj``...), so they never touch
a Mamba mixer. Mamba2 mixers are split by heads (:mod:`plangen.styles.mamba2`: the mixer's own
style per block index lays out its fused ``in_proj``, ``conv1d`` and per-head parameters, the gated
norm is sharded with the heads, ``out_proj`` row-parallel). MoE mixers split their
experts over TP on the expert dimension (:class:`plangen.styles.experts.ExpertsParallel`), the shared
expert column/row-parallel, the router replicated, and the block reduces both branches once (as
:mod:`plangen.plans.moe` does), one entry per MoE block index (the mixers' kinds differ per block).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from plangen.styles.experts import EXPERTS_PARALLEL_WHY
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.families.mamba2 import mamba2_children_entries, mamba2_mixer_entry
from plangen.plans.registry import CHECKPOINT_FILTERS, register_plan
from plangen.stack.transformers_compat import layer_kind, layer_kinds


def checkpoint_nemotron_h_block(block: nn.Module) -> bool:
    """Recompute MLP and Mamba blocks in backward; attention blocks keep their activations."""
    return layer_kind(getattr(block, "block_type", "")) in ("mlp", "linear_attention")


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
    block_types = layer_kinds(model.config)  # the newer names ("mamba"/"attention" before 5.24)
    kinds = set(block_types)
    entries = [
        PlanEntry(
            "model.embeddings",
            "RowwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=residual, use_local_output=not sp),
            "embeddings",
            "vocab-parallel embedding; "
            + ("reduce-scatter into the sequence-sharded residual" if sp else "all-reduce"),
        ),
    ]
    moe = "moe" in kinds and _moe_splits(model)
    if moe:
        entries += _moe_entries(model, block_types, sp, colwise)
    if sp:
        # Mixer kinds differ per block and so do their call conventions (attention takes
        # hidden_states= by keyword, the others positionally): one entry per block index.
        entries += [
            _sp_block_entry(i, kind)
            for i, kind in enumerate(block_types)
            if not (moe and kind == "moe") and kind != "linear_attention"
        ]
        entries += [
            PlanEntry(
                norm,
                "SequenceParallel",
                dict(sequence_dim=1, use_local_output=False),
                "norms",
                "norm on the local sequence shard",
            )
            for norm in ("model.layers.*.norm", "model.norm_f")
        ]
    if "linear_attention" in kinds:
        # One entry per Mamba block (the mixers' kinds differ per block), before its children's.
        entries += [
            mamba2_mixer_entry(f"model.layers.{i}.mixer", sp)
            for i, kind in enumerate(block_types)
            if kind == "linear_attention"
        ]
        entries += mamba2_children_entries(layer, sp)
    if "full_attention" in kinds:
        entries += [
            PlanEntry(f"{layer}.{p}", "ColwiseParallel", colwise, "attention", "column-parallel: own heads")
            for p in ("q_proj", "k_proj", "v_proj")
        ]
        entries.append(PlanEntry(f"{layer}.o_proj", "RowwiseParallel", rowwise, "attention", row_why))
    if "mlp" in kinds:
        entries += [
            PlanEntry(f"{layer}.up_proj", "ColwiseParallel", colwise, "mlp", "column-parallel"),
            PlanEntry(f"{layer}.down_proj", "RowwiseParallel", rowwise, "mlp", row_why),
        ]
    entries.append(
        PlanEntry(
            "lm_head",
            "ColwiseParallel",
            dict(input_layouts=residual, output_layouts=Shard(-1), use_local_output=False),
            "output",
            "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
        )
    )
    replicated = []
    if moe:
        replicated.append(
            Replicated(f"{layer}.gate", "the router sees every token on every rank: routing stays exact", "mlp")
        )
    elif "moe" in kinds:
        replicated.append(Replicated(f"{layer}.experts", _whole_experts_reason(model), "mlp"))
    return Plan(tuple(entries), "hand-written", tuple(replicated), sp)


def _moe_splits(model: nn.Module) -> bool:
    """Whether the MoE mixers' experts split over TP: not behind latent projections (their
    ``fc2_latent_proj`` would map each rank's partial sum and add its bias once per rank)."""
    return getattr(model.config, "moe_latent_size", None) is None


def _whole_experts_reason(model: nn.Module) -> str:
    size = getattr(model.config, "moe_latent_size", None)
    return (
        f"experts behind latent projections (moe_latent_size={size}): a replicated fc2_latent_proj on a "
        "partial sum adds its bias once per rank; kept whole"
    )


def _moe_entries(model: nn.Module, block_types: list[str], sp: bool, colwise: dict) -> list[PlanEntry]:
    """A MoE mixer per MoE block: experts split on the expert dim, the shared expert's up/down
    column/row-parallel, both leaving partial sums that the mixer reduces once (all-reduce, or
    all-gather in and reduce-scatter out under SP), and their partial input gradients, summed
    locally, once (MoeBlockParallel: the router's counted once)."""
    entries = [
        PlanEntry(
            f"model.layers.{i}.mixer",
            "MoeBlockParallel",
            dict(
                router="gate",
                input_layouts=(Shard(1) if sp else Replicate(),),
                desired_input_layouts=(Replicate(),),
                input_kwarg_layouts=None,
                desired_input_kwarg_layouts=None,
                use_local_input=True,
                output_layouts=(Partial(),),
                desired_output_layouts=(Shard(1) if sp else Replicate(),),
                use_local_output=not sp,
            ),
            "mlp",
            (
                "one all-gather of the sequence in, one reduce-scatter out"
                if sp
                else "one all-reduce of the summed branches"
            )
            + ": the experts and the shared expert leave partial sums, reduced once here, and their input gradients",
        )
        for i, kind in enumerate(block_types)
        if kind == "moe"
    ]
    layer = "model.layers.*.mixer"
    return entries + [
        PlanEntry(
            f"{layer}.experts",
            "ExpertsParallel",
            dict(output_layouts=Partial(), sum_input_grad=False),
            "mlp",
            EXPERTS_PARALLEL_WHY + "; its input's gradient left to the mixer's one reduction",
        ),
        PlanEntry(
            f"{layer}.shared_experts",
            "PartialGradInput",
            dict(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Replicate(),),
                input_kwarg_layouts=None,
                desired_input_kwarg_layouts=None,
                use_local_output=False,
            ),
            "mlp",
            "shared expert: a Replicate DTensor input, its partial gradient left to the mixer's one reduction",
        ),
        PlanEntry(
            f"{layer}.shared_experts.up_proj", "ColwiseParallel", colwise, "mlp", "shared expert: column-parallel"
        ),
        PlanEntry(
            f"{layer}.shared_experts.down_proj",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=True),
            "mlp",
            "shared expert: row-parallel, partial sum out (reduced by the mixer)",
        ),
    ]


def _sp_block_entry(index: int, kind: str) -> PlanEntry:
    """How block ``index``'s mixer meets the sequence-sharded residual stream under SP."""
    mixer = f"model.layers.{index}.mixer"
    if kind == "full_attention":
        return PlanEntry(
            mixer,
            "PrepareModuleInput",
            dict(
                input_layouts=None,
                desired_input_layouts=None,
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=False,
            ),
            "attention",
            "one all-gather of the sequence per attention block",
        )
    if kind == "mlp":
        return PlanEntry(
            mixer,
            "PrepareModuleInput",
            dict(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                input_kwarg_layouts=None,
                desired_input_kwarg_layouts=None,
                use_local_output=False,
            ),
            "mlp",
            "one all-gather of the sequence per MLP block",
        )
    # MoE mixers kept whole stay replicated: they get the whole sequence and every rank computes
    # them; their output is cut back to this rank's sequence shard (no communication).
    return PlanEntry(
        mixer,
        "PrepareModuleInputOutput",
        dict(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            input_kwarg_layouts=None,
            desired_input_kwarg_layouts=None,
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=False,
        ),
        "other",
        f"replicated {kind} mixer: gathers the sequence, computes it whole, keeps this rank's shard",
    )

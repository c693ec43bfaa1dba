"""Hand-written plan for Zamba2: Mamba2 layers, and hybrid layers that add a shared transformer block.

A Zamba2 layer is a Mamba2 decoder layer (``layers.N.mamba``: norm, mixer) or a hybrid layer that
holds one too, one level down (``layers.N.mamba_decoder.mamba``), beside a transformer block
(``shared_transformer``: attention, then an MLP) whose weights several hybrid layers share
(``num_mem_blocks``; the runtime keeps them one parameter: :func:`plangen.runtime.tensor_parallel.apply_shared_retie`),
and a ``linear`` (hidden -> hidden) that maps the block's output into the Mamba layer's input.
Every Mamba2 mixer is split by heads as NemotronH's are (:mod:`plangen.plans.families.mamba2`).

The shared block reads ``cat([hidden_states, original_hidden_states], -1)``: the layer's input
beside the token embeddings, both residual-stream tensors (2 x hidden wide into its norm, q, k and
v). Under sequence parallel both arrive sequence-sharded, so the block gathers both (two all-gathers
of B·S·H) and computes on plain whole tensors. Its attention is split by heads (q, k, v
column-parallel, ``o_proj`` row-parallel), its MLP by features (the fused ``[gate; up]``
re-laid out so each rank holds its slice of both, as Phi-3's). The per-layer adapters (LoRA-like:
``Sequential(Linear(width, rank), Linear(rank, out))``, added to q, k, v and to gate|up) follow
their projection: the up-projection ``.1`` split like it, the rank-wide ``.0`` whole on every rank
(its output gradient is summed over TP by ``.1``'s column-parallel input). Each column-parallel
projection takes the plain block input and reduces its own input gradient (q, k, v, gate|up and
each adapter: the adapters' ``.0`` reads the same plain tensor, so no Replicate DTensor can be
handed to the block). The block's output is whole; ``linear`` stays whole, and under SP keeps this
rank's sequence shard of its output (no communication in forward, one all-gather of its gradient).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.families.mamba2 import mamba2_children_entries, mamba2_mixer_entry
from plangen.plans.registry import register_plan
from plangen.plans.layouts import SEQ
from plangen.stack.transformers_compat import layer_kinds

SHARED = "model.layers.*.shared_transformer"
MIXERS = ("model.layers.*.mamba", "model.layers.*.mamba_decoder.mamba")
RESIDUAL_NORMS = (
    "model.layers.*.input_layernorm",
    "model.layers.*.mamba_decoder.input_layernorm",
    "model.final_layernorm",
)
BLOCK_NORMS = (f"{SHARED}.input_layernorm", f"{SHARED}.pre_ff_layernorm")
COLWISE = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
ROWWISE = dict(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)


def _has_adapters(model: nn.Module, attribute: str) -> bool:
    return any(
        hasattr(m, attribute) and any(isinstance(a, nn.Sequential) for a in getattr(m, attribute))
        for m in model.modules()
    )


def _shared_block_entries(model: nn.Module, sp: bool) -> tuple[list[PlanEntry], list[Replicated]]:
    attn, mlp = f"{SHARED}.self_attn", f"{SHARED}.feed_forward"
    entries: list[PlanEntry] = []
    if sp:
        entries.append(
            PlanEntry(
                SHARED,
                "PrepareModuleInput",
                dict(
                    # The hybrid layer passes the embeddings by keyword (Zamba2HybridLayer.forward).
                    input_layouts=(SEQ,),
                    desired_input_layouts=(Replicate(),),
                    input_kwarg_layouts={"original_hidden_states": SEQ},
                    desired_input_kwarg_layouts={"original_hidden_states": Replicate()},
                    use_local_output=True,
                ),
                "attention",
                "shared block reads its input beside the token embeddings: both sequences gathered "
                "(two all-gathers), the block computed on whole plain tensors",
            )
        )
    reduced = "reduces its own input gradient (one all-reduce)"
    entries += [
        PlanEntry(f"{attn}.{p}", "ColwiseParallel", COLWISE, "attention", f"column-parallel: own heads; {reduced}")
        for p in ("q_proj", "k_proj", "v_proj")
    ]
    replicated = [
        Replicated(n, "norm of the shared block's whole input: nothing to shard", "norms") for n in BLOCK_NORMS
    ]
    if _has_adapters(model, "linear_q_adapter_list"):
        for p in ("q", "k", "v"):
            adapters = f"{attn}.linear_{p}_adapter_list.*"
            entries.append(
                PlanEntry(
                    f"{adapters}.1",
                    "ColwiseParallel",
                    COLWISE,
                    "attention",
                    f"adapter's up-projection, split by heads as {p}_proj; {reduced}",
                )
            )
            replicated.append(
                Replicated(
                    f"{adapters}.0",
                    "adapter's rank-wide down-projection: whole on every rank, "
                    "its output gradient summed by the up-projection",
                    "attention",
                )
            )
    entries.append(PlanEntry(f"{attn}.o_proj", "RowwiseParallel", ROWWISE, "attention", "row-parallel: one all-reduce"))
    fused = dict(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True)
    entries.append(
        PlanEntry(
            f"{mlp}.gate_up_proj",
            "FusedColwiseParallel",
            fused,
            "mlp",
            f"each rank holds its own slice of gate and of up; {reduced}",
        )
    )
    if _has_adapters(model, "gate_up_proj_adapter_list"):
        adapters = f"{mlp}.gate_up_proj_adapter_list.*"
        entries.append(
            PlanEntry(
                f"{adapters}.1",
                "FusedColwiseParallel",
                fused,
                "mlp",
                f"adapter's up-projection, laid out as gate_up_proj; {reduced}",
            )
        )
        replicated.append(
            Replicated(
                f"{adapters}.0",
                "adapter's rank-wide down-projection: whole on every rank, "
                "its output gradient summed by the up-projection",
                "mlp",
            )
        )
    entries.append(PlanEntry(f"{mlp}.down_proj", "RowwiseParallel", ROWWISE, "mlp", "row-parallel: one all-reduce"))
    return entries, replicated


@register_plan("Zamba2ForCausalLM")
def plan_zamba2(model: nn.Module, sequence_parallel: bool) -> Plan:
    sp = sequence_parallel
    residual = SEQ if sp else Replicate()
    entries = [
        PlanEntry(
            "model.embed_tokens",
            "RowwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=residual, use_local_output=not sp),
            "embeddings",
            "vocab-parallel embedding; "
            + ("reduce-scatter into the sequence-sharded residual" if sp else "all-reduce"),
        ),
    ]
    kinds = set(layer_kinds(model.config))  # "linear_attention" (Mamba2 layers; "mamba" before 5.24), "hybrid"
    hybrid = "hybrid" in kinds
    mixers = [m for m, kind in zip(MIXERS, ("linear_attention", "hybrid")) if kind in kinds]
    for mixer in mixers:
        entries += [mamba2_mixer_entry(mixer, sp), *mamba2_children_entries(mixer, sp)]
    replicated: list[Replicated] = []
    if hybrid:
        block, replicated = _shared_block_entries(model, sp)
        entries += block
    norms = [
        n for n, kind in zip(RESIDUAL_NORMS, ("linear_attention", "hybrid", None)) if kind is None or kind in kinds
    ]
    linear = "model.layers.*.linear"
    if sp:
        if hybrid:
            entries.append(
                PlanEntry(
                    linear,
                    "PrepareModuleOutput",
                    dict(
                        output_layouts=Replicate(),
                        desired_output_layouts=SEQ,
                        use_local_output=False,
                    ),
                    "other",
                    "whole on every rank; keeps this rank's sequence shard of its output for the residual stream",
                )
            )
        entries += [
            PlanEntry(
                n,
                "SequenceParallel",
                dict(sequence_dim=1, use_local_output=False),
                "norms",
                "norm on the local sequence shard",
            )
            for n in norms
        ]
    else:
        if hybrid:
            replicated.append(
                Replicated(
                    linear, "maps the shared block's whole output: hidden x hidden, whole on every rank", "other"
                )
            )
        replicated += [
            Replicated(n, "sees the full hidden state on every rank: nothing to shard", "norms") for n in norms
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
    return Plan(tuple(entries), "hand-written", tuple(replicated), sp)

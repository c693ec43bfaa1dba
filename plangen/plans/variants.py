"""Plan variants: ``optimized`` (the Megatron-style plans as written) and ``stable``.

``stable`` follows NeMo RL's TP-accuracy guide: row-parallel layers sum partial results across
ranks (an all-reduce or reduce-scatter) in an order that differs from one device's matmul, so the
outputs move with the TP size. The stable variant rewrites each row-parallel linear (a
``RowwiseParallel`` entry whose input is feature-sharded, ``Shard(-1)``: ``o_proj``,
``down_proj``) into a column-parallel one on a gathered input: its input is all-gathered
(``Shard(-1)`` -> ``Replicate``), each rank computes its slice of output features from the whole
input, and the output is all-gathered to ``Replicate``. The forward then has all-gathers only, no
cross-rank sums; the backward still sums (the input gradient of a column-parallel linear is a
partial sum, reduce-scattered). The weights stay sharded over TP (now by output rows).

The same rewrite covers GPT-2's ``Conv1D`` row-parallel projections (column-parallel ``Conv1D`` on
the gathered input). Two more sums have no gather-based twin that keeps the same shards:

* a norm over a whole column-parallel projection (OLMo-2's q/k norms, ``ShardedNormParallel``)
  sums its statistics over TP: ``GatheredNormParallel`` all-gathers the projection's slices instead
  and normalises the whole of it on every rank (its weight then whole over TP, a few KiB);
* a Mamba2 mixer's gated norm whose one group spans the ranks (``GatedRMSNormParallel``) sums its
  sum of squares over TP: ``GatheredGatedRMSNormParallel`` all-gathers the group's slices and
  normalises it whole instead (the weight stays sharded: each rank scales its own slice). The
  mixer's one B/C group is gathered (weights, an all-gather) and its input taken whole: no sum;
* the experts split over TP (``ExpertsParallel``, or by their block: Llama-4's
  ``EveryTokenMoeParallel``) sum each token's outputs over experts held by
  other ranks: the stable variant keeps the experts whole over TP (every rank computes every
  route, as one device does; FSDP2 still shards them over DP), so nothing is left to reduce at the
  block (its partial output becomes whole) and a gate that scaled a partial output no longer sums
  its gradient. This is the variant's price: the experts' memory per rank is TP times the
  optimized plan's (``plangen cost --compare stable`` shows it).

A Mamba1 mixer split by channels (``Mamba1MixerParallel``) sums ``x_proj``'s partial outputs over
TP inside the mixer: the stable variant keeps the mixer whole over TP (its ``out_proj`` entry
dropped too; every rank computes the mixer whole on the replicated input, as one device does), at
the same price in memory as the experts.

The vocab-parallel embedding keeps its all-reduce: each token's row lives on one rank, the others
add exact zeros, so that sum is exact in any order.

This module is the one place that says what ``stable`` changes; :func:`plangen.plans.choice.choose_plan`
applies it to any plan given as data (hand-written, synthesized, Hugging Face).
"""

from __future__ import annotations

from dataclasses import replace

from plangen.plan import Plan, PlanEntry, VariantError, check_variant

DEFAULT_VARIANT = "optimized"

# Styles whose forward sums partial results across TP ranks and that the stable variant cannot
# rewrite into a gather: the plan is refused rather than silently left with a sum. JetMoE's
# GroupedRowwiseParallel sums each expert's slices; keeping its experts whole would also need its
# attention's heads whole (kv_proj and the query experts split together): not built.
_SUMMING_STYLES = ("PackedRowwiseParallel", "GroupedRowwiseParallel")

# Row-parallel styles and the column-parallel style that computes the same projection by output
# features (an output the layer modifies in place stays a copy of its own).
_COLUMN_TWIN = {
    "RowwiseParallel": "ColwiseParallel",
    "Conv1DRowwiseParallel": "Conv1DColwiseParallel",
    "RowwiseParallelOwnOutput": "ColwiseParallelOwnOutput",
}

# Blocks that split their experts themselves (Llama-4's every-token experts): the stable variant
# drops the style and keeps the block's experts whole, as for ExpertsParallel.
_EXPERT_SPLITTING_BLOCKS = {"EveryTokenMoeParallel": "experts"}

_WHOLE_EXPERTS = (
    "stable variant: experts whole over TP (a sum over experts on other ranks is a cross-rank sum);"
    " FSDP2 still shards them over DP"
)
# Blocks whose style sums inside them and that the stable variant keeps whole, with every entry below them.
_WHOLE_BLOCKS = ("Mamba1MixerParallel", "RwkvTimeMixParallel", "RwkvChannelMixParallel")
_WHOLE_MIXER = (
    "stable variant: mixer whole over TP (its partial sums, a Mamba1 mixer's x_proj or an RWKV mixer's "
    "output or value, would be summed across ranks); FSDP2 still shards it over DP"
)
_WHOLE_GATE = "stable variant: the output it scales is whole on every rank, so its gradient is not summed"


def _feature_sharded_input(entry: PlanEntry) -> bool:
    from torch.distributed.tensor import Shard

    layouts = entry.kwargs.get("input_layouts")
    return isinstance(layouts, Shard) and layouts.dim == -1


def stable_entry(entry: PlanEntry) -> PlanEntry:
    """A row-parallel projection as a column-parallel one on its all-gathered input, output replicated."""
    from torch.distributed.tensor import Replicate, Shard

    return PlanEntry(
        entry.pattern,
        _COLUMN_TWIN[entry.style],
        {"input_layouts": Shard(-1), "output_layouts": Replicate(), "use_local_output": True},
        entry.group,
        "stable variant: column-parallel on the all-gathered input, output all-gathered: no cross-rank sum in forward",
    )


def _whole_block_output(entry: PlanEntry) -> PlanEntry:
    """A block that reduced its branches' partial sums, now that every branch returns a whole output."""
    from torch.distributed.tensor import Partial, Replicate

    outputs = tuple(Replicate() if isinstance(o, Partial) else o for o in entry.kwargs["output_layouts"])
    return replace(
        entry,
        kwargs={**entry.kwargs, "output_layouts": outputs},
        why="stable variant: every branch returns a whole output, so the block reduces nothing",
    )


def _leaves_partial(entry: PlanEntry) -> bool:
    from torch.distributed.tensor import Partial

    outputs = entry.kwargs.get("output_layouts")
    return entry.style == "PrepareModuleInputOutput" and any(isinstance(o, Partial) for o in outputs or ())


def build_stable_plan(plan: Plan) -> Plan:
    """``plan`` with every cross-rank sum of its forward replaced by all-gathers (pure)."""
    from plangen.plan import Replicated

    if plan.sequence_parallel:
        raise VariantError(
            "the stable variant has no sequence parallel: its residual stream stays replicated "
            "(sequence parallel reduce-scatters it, a cross-rank sum): use sequence_parallel=False"
        )
    entries, replicated = [], list(plan.replicated)
    whole = [e.pattern for e in plan.entries if e.style in _WHOLE_BLOCKS]
    replicated += [Replicated(pattern, _WHOLE_MIXER, "other") for pattern in whole]
    for entry in plan.entries:
        if any(entry.pattern == p or entry.pattern.startswith(p + ".") for p in whole):
            continue
        if entry.style in _SUMMING_STYLES:
            raise VariantError(
                f"no stable variant for {entry.pattern}: its style {entry.style} sums across TP ranks in forward"
            )
        if entry.style == "ExpertsParallel":
            replicated.append(Replicated(entry.pattern, _WHOLE_EXPERTS, entry.group))
            continue
        if entry.style in _EXPERT_SPLITTING_BLOCKS:
            experts = f"{entry.pattern}.{_EXPERT_SPLITTING_BLOCKS[entry.style]}"
            replicated.append(Replicated(experts, _WHOLE_EXPERTS, entry.group))
            continue
        if entry.style == "AllReduceOutputGrad":
            replicated.append(Replicated(entry.pattern, _WHOLE_GATE, entry.group))
            continue
        if entry.style in _COLUMN_TWIN and _feature_sharded_input(entry):
            entry = stable_entry(entry)
        elif entry.style == "ShardedNormParallel":
            entry = replace(
                entry,
                style="GatheredNormParallel",
                why="stable variant: the projection's slices all-gathered and normalised whole on every rank:"
                " no statistics summed across ranks",
            )
        elif entry.style == "GatedRMSNormParallel":
            entry = replace(
                entry,
                style="GatheredGatedRMSNormParallel",
                why="stable variant: a group spread over ranks all-gathered and normalised whole on every rank:"
                " no statistics summed across ranks",
            )
        elif entry.style == "MoeBlockParallel":  # its experts whole now: nothing partial to reduce once
            kwargs = {k: v for k, v in entry.kwargs.items() if k not in ("router", "gates")}
            entry = _whole_block_output(replace(entry, style="PrepareModuleInputOutput", kwargs=kwargs))
        elif entry.style == "PartialGradInput":  # its block reduces nothing now: the input reduces its own
            entry = replace(
                entry,
                style="PrepareModuleInput",
                why="stable variant: one Replicate DTensor input, so gate and up reduce their input gradient once",
            )
        elif _leaves_partial(entry):
            entry = _whole_block_output(entry)
        entries.append(entry)
    return replace(plan, entries=tuple(entries), replicated=tuple(replicated))


def build_plan_variant(plan: Plan, variant: str) -> Plan:
    """``plan`` as ``variant`` asks: as written (``optimized``) or :func:`build_stable_plan`."""
    return build_stable_plan(plan) if check_variant(variant) == "stable" else plan

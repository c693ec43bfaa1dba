"""Derive a Megatron-style plan from the module tree, for classes with no hand-written plan.

:func:`~plangen.plans.synthesis.analysis.analyze_model` walks a model (a meta-device build is enough) and
recognises, by structure and shapes (the block families, :mod:`plangen.plans.families`):

* the vocabulary embedding and the output head (tied or not): vocabulary-parallel;
* per decoder layer, attention blocks (q/k/v column-parallel, o row-parallel, per-head norms with
  their gradient summed over TP) and dense MLPs (up/gate column-parallel, down row-parallel), each
  entered through ``PrepareModuleInput`` so the block input is one ``Replicate`` DTensor whose
  gradient is reduced once per block, as in :mod:`plangen.plans.dense`;
* per-feature modules on the residual stream (norms): ``SequenceParallel`` under SP.

Beyond those, the families the recognizers know are sharded too (each recognized block writes its
own entries: :class:`plangen.plans.families.block.FamilyBlock`), each with the styles of its
mechanism (:mod:`plangen.styles`): norms over a whole q or k projection with its heads
(``ShardedNormParallel``: statistics summed over TP); packed q|k|v and gate|up projections re-laid
out by part (``FusedColwiseParallel``); multi-query attention by query heads; mixtures of experts
(experts over TP on the expert dim or inside each expert, shared experts, one reduction per block);
latent attention by heads; Mamba1 and Mamba2 mixers, gated delta nets and RG-LRUs by channels or
heads; towers outside the decoder, TP only. What stays replicated says why (``Replicated.why``): a
block the recognizers cannot read, or one whose call by its layer the forward reader cannot follow.
Replicated blocks are correct under plain TP (every rank computes them whole on the same input).
Under sequence parallelism a replicated block of a layer is handed the whole sequence and keeps its
shard of the output (``PrepareModuleInputOutput``: one all-gather each way); anything else on the
residual stream that cannot take a sequence shard makes SP unavailable for the class, with the reason.

How a layer calls each block (the hidden state as a keyword or positionally) is read from the
layer's forward source (:mod:`plangen.plans.source.forward`); when it cannot be read, the block's
column-parallel projections take their input layout themselves (correct, one more collective).

A synthesized plan is a candidate: the runtime uses it only for classes the numerical sweep
(``scripts/sweep_plans.py``, results in ``proven.json``) proved equal to the unsharded model.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.synthesis.analysis import Analysis, BlockPart, KeptPart, analyze_model
from plangen.plans.families.per_head_inputs import per_head_input_entry
from plangen.plans.synthesis.per_layer_inputs import per_layer_input_entries
from plangen.plans.families.core import LayerExpertsBlock
from plangen.plans.tied import tie_plan_entries
from plangen.plans.layouts import SEQ, hidden_state_layouts

__all__ = ["Analysis", "analyze_model", "build_plan_from_analysis", "build_synthesized_plan"]

Item = TypeVar("Item", PlanEntry, Replicated)


def _gathered_entry(part: KeptPart, group: str) -> PlanEntry:
    # One layout per output the layer unpacks; torch passes an output whose layout is None through
    # untouched and never reads its desired layout (documented as a placement: Replicate()).
    # Its own parameters among them become Replicate DTensors, for the layer to add to the sharded output.
    others = (part.call.outputs or 1) - 1
    own = (Replicate() if i in part.parameter_outputs else None for i in range(1, others + 1))
    return PlanEntry(
        part.path,
        "PrepareModuleInputOutput",
        dict(
            **hidden_state_layouts(part.call, True),
            use_local_input=True,
            output_layouts=(Replicate(), *own),
            desired_output_layouts=(SEQ, *(Replicate(),) * others),
            use_local_output=False,
        ),
        group,
        "replicated block under sequence parallel: all-gathers its input, computes whole on every rank, "
        "keeps this rank's sequence shard of its output"
        + (" (its other outputs pass through)" if others else "")
        + (" and hands out the parameters it returns as Replicate DTensors" if part.parameter_outputs else ""),
    )


def _block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    return part.block.entries(part, sp)  # each family's block writes its own entries


def _concrete_entries(analysis: Analysis, sp: bool) -> tuple[list[PlanEntry], list[Replicated]]:
    entries: list[PlanEntry] = []
    replicated = list(analysis.kept)
    if analysis.embedding is not None:
        reduced = "reduce-scatter into the sequence-sharded residual" if sp else "all-reduce"
        layouts = dict(input_layouts=Replicate(), output_layouts=SEQ if sp else Replicate(), use_local_output=not sp)
        why = f"vocab-parallel embedding; {reduced}"
        if analysis.embedding_scaled:
            entries.append(
                PlanEntry(
                    analysis.embedding,
                    "ScaledEmbeddingParallel",
                    layouts,
                    "embeddings",
                    f"{why}; its own scale applied to the partial lookup first",
                )
            )
        elif analysis.embedding_modified_in_place and not sp:  # under SP the output stays a DTensor
            entries.append(
                PlanEntry(
                    analysis.embedding,
                    "RowwiseParallelOwnOutput",
                    layouts,
                    "embeddings",
                    f"{why}; its output is a copy, which the model modifies in place",
                )
            )
        else:
            entries.append(PlanEntry(analysis.embedding, "RowwiseParallel", layouts, "embeddings", why))
    for reader, embedding in analysis.embedding_row_readers:
        entries.append(
            PlanEntry(
                reader,
                "EmbeddingRowReadParallel",
                dict(embedding=embedding),
                "embeddings",
                f"its forward reads a row of {embedding}.weight itself: read whole from the vocab-parallel "
                "weight (one all-reduce of the hidden size)",
            )
        )
    per_layer = analysis.per_layer_inputs
    for path, scaled in analysis.token_tables:
        # Whole output on every rank, as the model hands it on (reshaped per layer), unless under SP
        # the layers take it on their sequence shards (plans/per_layer_inputs.py).
        style = "ScaledEmbeddingParallel" if scaled else "RowwiseParallel"
        sharded = sp and per_layer is not None and path == per_layer.table
        why = "vocab-parallel table looked up by token outside the layers; " + (
            "reduce-scattered into the sequence shards the layers take"
            if sharded
            else "all-reduced to its whole output"
        )
        layouts = dict(
            input_layouts=Replicate(), output_layouts=SEQ if sharded else Replicate(), use_local_output=not sharded
        )
        entries.append(
            PlanEntry(
                path,
                style,
                layouts,
                "embeddings",
                f"{why}; its own scale applied to the partial lookup first" if scaled else why,
            )
        )
    if per_layer is not None:
        more, kept = per_layer_input_entries(per_layer, sp)
        entries += more
        replicated += kept
    if sp:
        entries += [
            PlanEntry(
                path,
                "PrepareModuleOutput",
                dict(output_layouts=Replicate(), desired_output_layouts=Replicate(), use_local_output=False),
                "embeddings",
                "position embedding, whole on every rank: a Replicate DTensor, so adding it to the "
                "sequence-sharded token embedding takes this rank's slice (no communication)",
            )
            for path in analysis.positions
        ]
        entries += [
            PlanEntry(
                path,
                "SequenceParallelOwnParameters",
                {},
                "other",
                "own per-feature parameters on the sequence-sharded residual: Replicate DTensors in its "
                "forward, their gradient summed over TP",
            )
            for path in analysis.residual_parameters
        ]
    for part in analysis.blocks:
        entries += _block_entries(part, sp)
    for part in analysis.tower_blocks:  # a tower's sequence is not the decoder's: TP only, under SP too
        entries += _block_entries(part, False)
    entries += [per_head_input_entry(layer, head_input) for layer, head_input in analysis.head_inputs]
    if sp:
        groups = {k.pattern: k.group for k in analysis.kept}
        on_shard = set(per_layer.layer_linears) if per_layer is not None else set()
        entries += [
            _gathered_entry(part, groups.get(part.path, "other"))
            for part in analysis.gathered
            if part.path not in on_shard
        ]
    # Under SP the norm before experts the layer calls itself takes the whole sequence (plans/layer_experts.py).
    whole = (
        {
            f"{p.path.rpartition('.')[0]}.{p.block.input_norm}"
            for p in analysis.blocks
            if isinstance(p.block, LayerExpertsBlock) and p.block.input_norm
        }
        if sp
        else set()
    )
    for norm in analysis.norms:
        if norm in whole:
            continue
        if sp:
            entries.append(
                PlanEntry(
                    norm,
                    "SequenceParallel",
                    dict(sequence_dim=1, use_local_output=False),
                    "norms",
                    "norm on the local sequence shard",
                )
            )
        else:
            replicated.append(Replicated(norm, "sees the full hidden state on every rank: nothing to shard", "norms"))
    if analysis.head is not None:
        entries.append(
            PlanEntry(
                analysis.head,
                "ColwiseParallel",
                dict(input_layouts=SEQ if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False),
                "output",
                "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
            )
        )
    return entries, replicated


def _generalize(
    items: list[Item],
    layers_path: str | None,
    layers: nn.ModuleList | None,
    key: Callable[[Item], Any],
    rename: Callable[[Item, str], Item],
) -> list[Item]:
    """One ``layers.*`` item where every layer holding that module gets the same item; the rest per layer.

    Layers of different kinds (Jamba's dense and MoE ``feed_forward``) keep per-layer patterns, so a
    pattern never reaches a module the plan did not derive it for.
    """
    if layers_path is None or layers is None:
        return items
    prefix = layers_path + "."
    by_generic: dict[str, list[Item]] = {}
    for item in items:
        if item.pattern.startswith(prefix):
            index, _, rest = item.pattern[len(prefix) :].partition(".")
            if index.isdigit():
                by_generic.setdefault(f"{prefix}*.{rest}" if rest else f"{prefix}*", []).append(item)
    out: list[Item] = []
    emitted: set[str] = set()
    for item in items:
        generic = next((g for g, group in by_generic.items() if any(i is item for i in group)), None)
        if generic is None:
            out.append(item)
            continue
        if generic in emitted:
            continue
        group = by_generic[generic]
        rest = generic[len(prefix) + 2 :]
        holders = [i for i, layer in enumerate(layers) if _has_submodule(layer, rest)]
        same = len({repr(key(i)) for i in group}) == 1 and len(group) == len(holders)
        if same:
            out.append(rename(group[0], generic))
            emitted.add(generic)
        else:
            out.append(item)
    return out


def _has_submodule(layer: nn.Module, rest: str) -> bool:
    if not rest:
        return True
    try:
        layer.get_submodule(rest)
    except AttributeError:
        return False
    return True


def build_plan_from_analysis(model: nn.Module, analysis: Analysis, sequence_parallel: bool) -> Plan:
    """The plan data for an analysis (see :func:`build_synthesized_plan`)."""
    entries, replicated = _concrete_entries(analysis, sequence_parallel)
    stacks = [analysis.layers_path] if analysis.layers_path else []
    for path in [*stacks, *analysis.tower_stacks, *analysis.block_stacks]:
        layers = model.get_submodule(path)
        entries = _generalize(
            entries,
            path,
            layers,
            key=lambda e: (e.style, sorted((k, repr(v)) for k, v in e.kwargs.items())),
            rename=lambda e, p: PlanEntry(p, e.style, e.kwargs, e.group, e.why),
        )
        replicated = _generalize(
            replicated,
            path,
            layers,
            key=lambda r: r.why,
            rename=lambda r, p: Replicated(p, r.why, r.group),
        )
    return Plan(tuple(entries), "synthesized", tuple(replicated), sequence_parallel)


def build_synthesized_plan(model: nn.Module, sequence_parallel: bool) -> Plan:
    """A Megatron-style plan derived from ``model``'s module tree (source ``"synthesized"``).

    Raises a one-line ``ValueError`` when nothing in the decoder layers can be sharded safely, or
    when ``sequence_parallel`` is asked for and a module on the residual stream cannot take a
    sequence shard.
    """
    analysis = analyze_model(model)
    if analysis.problem is not None:
        raise ValueError(f"{analysis.class_name}: no synthesized plan: {analysis.problem}")
    if sequence_parallel and analysis.sp_problems:
        raise ValueError(f"{analysis.class_name}: no sequence-parallel synthesized plan: {analysis.sp_problems[0]}")
    # A tied embedding and head: the pair of tied styles, one parameter under any runtime.
    return tie_plan_entries(model, build_plan_from_analysis(model, analysis, sequence_parallel))

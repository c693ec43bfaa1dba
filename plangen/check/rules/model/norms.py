"""Level-2 rule PG213: a norm over a whole q/k projection (OLMo-2's, OLMoE's ``q_norm``/``k_norm``)
is sharded with that projection's heads.

As in :mod:`plangen.check.rules.model.shapes`, the rule is a class carrying its code's story beside its
``check``.
"""

from __future__ import annotations

from typing import Iterator

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel

from plangen.check.model_plan import ModelFinding, ModelPlan, ModelRule, parent_path
from plangen.check.rule import TP_IMPORT
from plangen.check.style_needs import suggest_key
from plangen.styles.base import leaves_local_shard
from plangen.model.module_tree import generalize
from plangen.styles import MultiHeadNormParallel, ShardedNormParallel

# Styles of a norm that each TP rank applies to its slice of a column-parallel projection: over the
# whole projection (statistics summed over TP), or each head on its own (xLSTM's multi-head norm).
_SLICE_NORM_STYLES = (ShardedNormParallel, MultiHeadNormParallel)


def _local_column_parallel(plan: ModelPlan, path: str) -> bool:
    style, module = plan.style_of(path), plan.modules.get(path)
    return isinstance(module, nn.Linear) and isinstance(style, ColwiseParallel) and leaves_local_shard(style)


def _whole_projection_norms(plan: ModelPlan, block: str) -> Iterator[tuple[str, nn.Module, str | None]]:
    """(path, norm, its projection) for the norms in ``block`` with one weight value per output feature
    of a projection beside them: the projection of the same prefix (``q_norm``: ``q_proj``) if one is
    as wide, else the first as wide (None: no projection as wide)."""
    children = dict(plan.model.get_submodule(block).named_children())
    widths = [m.out_features for m in children.values() if isinstance(m, nn.Linear)]
    for child, norm in children.items():
        weight = getattr(norm, "weight", None)
        if "norm" not in type(norm).__name__.lower() or not isinstance(weight, nn.Parameter) or weight.dim() != 1:
            continue
        if _one_head(plan, weight.numel(), widths):
            continue  # a per-head norm (PG207's), even where one KV head makes k_proj as wide as it
        wide = [n for n, m in children.items() if isinstance(m, nn.Linear) and m.out_features == weight.numel()]
        prefix = child.partition("_")[0] + "_"
        mine = [n for n in wide if n.startswith(prefix)] or wide
        yield f"{block}.{child}", norm, f"{block}.{mine[0]}" if mine else None


def _one_head(plan: ModelPlan, width: int, projection_widths: list[int]) -> bool:
    """Some projection beside the norm gives several heads of ``width`` (as many as the config has)."""
    from plangen.model.heads import head_counts

    counts = head_counts(plan.config) if plan.config is not None else None
    return counts is not None and any(w % width == 0 and 1 < w // width in counts for w in projection_widths)


class ProjectionNormsRule(ModelRule):
    code = "PG213"
    title = "norm over a whole projection not sharded with it"
    explanation = (
        "A norm over the whole output of a q or k projection, applied before the heads are split"
        " (OLMo-2's, OLMoE's `q_norm`, `k_norm` of num_heads x head_dim), needs every head's features:"
        " under a column-parallel projection each TP rank holds only its heads, so the norm must be"
        " `ShardedNormParallel` (from plangen.styles: weight sharded with the heads, statistics summed"
        " over TP). Left replicated it normalises a slice with a weight of the wrong size; a per-head"
        " style (`ReplicatedWithGradAllReduce`, `AllReduceParamGrads`) normalises each rank's slice"
        " alone. Conversely `ShardedNormParallel` needs its projection column-parallel."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\nfrom plangen.styles import ReplicatedWithGradAllReduce\n\n"
        'PLANGEN_MODEL = "olmo2"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.q_norm": ReplicatedWithGradAllReduce(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel, RowwiseParallel\n\nfrom plangen.styles import ShardedNormParallel\n\n"
        'PLANGEN_MODEL = "olmo2"\ncustom_parallel_plan = {\n'
        '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.q_norm": ShardedNormParallel(),\n'
        '    "model.layers.*.self_attn.k_norm": ShardedNormParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}'
    )

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        blocks = dict.fromkeys(parent_path(p) for p in plan.covering if _local_column_parallel(plan, p))
        blocks.update(
            dict.fromkeys(
                parent_path(p) for p, k in plan.covering.items() if isinstance(plan.styles[k], ShardedNormParallel)
            )
        )
        reported: set[str] = set()
        for block in blocks:
            for path, norm, projection in _whole_projection_norms(plan, block):
                style, generic = plan.style_of(path), generalize(path)
                sharded = projection is not None and _local_column_parallel(plan, projection)
                if generic in reported or sharded == isinstance(style, _SLICE_NORM_STYLES):
                    continue
                reported.add(generic)
                what = f"`{generic}` ({type(norm).__name__} [{norm.weight.numel()}])"
                fix = suggest_key(generic, "ShardedNormParallel()")
                if not sharded:
                    yield self.finding(
                        f"`ShardedNormParallel` on {what} expects this rank's slice of a column-parallel projection"
                        " as wide as the norm, and none beside it is one: it would see the whole projection with"
                        " a slice of the weight",
                        plan.covering[path],
                    )
                elif style is None:
                    yield self.finding(
                        f"{what} normalizes the whole output of column-parallel `{generalize(projection)}`, of which"
                        f" each TP rank holds only its heads; left replicated it would normalise a slice: add {fix}"
                        " (from plangen.styles)",
                        plan.covering[projection],
                    )
                else:
                    yield self.finding(
                        f"{what} normalizes the whole output of column-parallel `{generalize(projection)}`, not"
                        f" each head: `{type(style).__name__}` would normalise each rank's heads alone; use {fix}"
                        " (from plangen.styles)",
                        plan.covering[path],
                    )

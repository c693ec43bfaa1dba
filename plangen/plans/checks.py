"""The runtime's checks of a plan against a model, and its tied-embedding resolution.

Pure and local: no collectives, no transformers import, nothing applied. :mod:`plangen.parallelize`
runs them before it shards anything (every rank fails the same way, before any rank communicates),
and ``plangen verify`` (:mod:`plangen.check.rules.model.shapes`) runs the same functions against a meta
model, so the two cannot disagree. The names stay importable from :mod:`plangen.parallelize`.
"""

from __future__ import annotations

import logging
from typing import Mapping

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.model.heads import tp_size_problem
from plangen.model.module_tree import (
    find_matching_modules,
    find_unmatched_keys,
    key_matches,
    tied_embeddings,
)

logger = logging.getLogger("plangen")


class PlanError(ValueError):
    """The plan cannot be applied to this model at this TP size."""


def check_heads_divisible(
    model: nn.Module, tp_size: int, *, replicate_kv: bool = False, padded_heads: bool = False
) -> None:
    if not hasattr(model, "config"):
        return
    problem = tp_size_problem(
        model.config, tp_size, type(model).__name__, replicate_kv=replicate_kv, padded_heads=padded_heads
    )
    if problem is not None:
        raise PlanError(problem)


def shards_attention(model: nn.Module, styles: Mapping[str, ParallelStyle]) -> bool:
    for pattern, style in styles.items():
        if isinstance(style, (ColwiseParallel, RowwiseParallel)):
            if any(("attn" in n or "attention" in n) for n in find_matching_modules(model, pattern)):
                return True
    return False


def replicates_kv_heads(model: nn.Module, styles: Mapping[str, ParallelStyle]) -> bool:
    """The plan replicates KV heads where the TP size exceeds them (:mod:`plangen.styles.kv_heads`): its
    attention blocks are ``PrepareAttentionInput`` and every k/v projection in them (the ``nn.Linear``
    children of ``kv_heads * head_dim`` outputs) is ``KVHeadsColwiseParallel``. A plain
    ``ColwiseParallel`` on one would split a KV head between ranks: then the TP size must divide them.
    A packed ``[q; k; v]`` of one KV head under ``MultiQueryColwiseParallel`` (DBRX's ``Wqkv``)
    computes that head whole on every rank: replicated too."""
    from plangen.styles.fused import MultiQueryColwiseParallel
    from plangen.styles.kv_heads import KVHeadsColwiseParallel, PrepareAttentionInput, kv_projections
    from plangen.model.module_facts import attention_head_counts

    if any(isinstance(s, MultiQueryColwiseParallel) and find_matching_modules(model, p) for p, s in styles.items()):
        return True

    blocks = [
        name
        for pattern, style in styles.items()
        if isinstance(style, PrepareAttentionInput)
        for name in find_matching_modules(model, pattern)
    ]
    for block in blocks:
        attention = model.get_submodule(block)
        counts = attention_head_counts(attention)
        if counts is None:
            return False
        heads, kv_heads, head_dim = counts
        if kv_heads == heads:
            continue  # one KV head per query head: any TP size that splits these splits those
        for child, _ in kv_projections(attention, kv_heads, head_dim):
            if not isinstance(covering_style(model, styles, f"{block}.{child}"), KVHeadsColwiseParallel):
                return False
    return bool(blocks)


def pads_heads(model: nn.Module, styles: Mapping[str, ParallelStyle]) -> bool:
    """The plan pads the query heads of its attention blocks to a multiple of the TP size
    (``PrepareAttentionInput(padded_heads=True)`` on a module of the model: :mod:`plangen.styles.padded_heads`)."""
    from plangen.styles.kv_heads import PrepareAttentionInput

    return any(
        isinstance(s, PrepareAttentionInput) and s.padded_heads and find_matching_modules(model, p)
        for p, s in styles.items()
    )


def plan_heads_problem(model: nn.Module, styles: Mapping[str, ParallelStyle], tp_size: int) -> str | None:
    """Why ``tp_size`` cannot split ``model``'s heads under this plan's attention layout (KV heads
    replicated, query heads padded: read off the plan), or None when it can, or when the plan keeps the
    attention whole (any TP size: 5.25.0's Falcon, whose 71 heads its synthesized plan leaves whole,
    was refused every TP size above 1 by ``plangen init``)."""
    if not hasattr(model, "config") or not shards_attention(model, styles):
        return None
    return tp_size_problem(
        model.config,
        tp_size,
        type(model).__name__,
        replicate_kv=replicates_kv_heads(model, styles),
        padded_heads=pads_heads(model, styles),
    )


def check_plan_fits(model: nn.Module, styles: Mapping[str, ParallelStyle], tp_size: int) -> None:
    unmatched = find_unmatched_keys(model, styles)
    if unmatched:
        raise PlanError(
            f"plan key(s) match no module of {type(model).__name__}: {', '.join(unmatched)} "
            "(torch would only warn and leave those modules unsharded)"
        )
    if shards_attention(model, styles) and (problem := plan_heads_problem(model, styles, tp_size)) is not None:
        raise PlanError(problem)


def check_packed_without_fsdp(model: nn.Module, styles: Mapping[str, ParallelStyle], dp_size: int) -> None:
    """Packed (strided) shards compute right under FSDP2 but gather back permuted: checkpoints and
    ``full_tensor()`` would be wrong, silently. Refuse until FSDP2 lays them out faithfully."""
    from plangen.styles import PackedColwiseParallel, PackedRowwiseParallel

    if dp_size <= 1:
        return
    packed = [p for p, s in styles.items() if isinstance(s, (PackedColwiseParallel, PackedRowwiseParallel))]
    if packed:
        raise PlanError(
            f"packed (fused) projections {', '.join(packed)} cannot be sharded by FSDP2 as well (DP size {dp_size}): "
            "their state dict would come back permuted; use DP size 1 or leave them replicated"
        )


def covering_style(model: nn.Module, styles: Mapping[str, ParallelStyle], path: str) -> ParallelStyle | None:
    found = [s for p, s in styles.items() if key_matches(p, path)]
    return found[-1] if found else None


def resolve_tied_styles(model: nn.Module, styles: Mapping[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """Give both ends of a tied embedding a vocabulary sharding, so the tie survives TP.

    A plan that shards only one end (Hugging Face's plans shard ``lm_head`` alone) would leave one
    weight a DTensor and the other a plain tensor: one parameter cannot be both.
    """
    tied = tied_embeddings(model)
    styles = dict(styles)
    if tied is None:
        return styles
    emb_path, head_path = tied
    emb_style, head_style = covering_style(model, styles, emb_path), covering_style(model, styles, head_path)
    if head_style is not None and emb_style is None:
        logger.info("plangen: %s is tied to %s: sharding it on the vocabulary too", emb_path, head_path)
        styles[emb_path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    elif emb_style is not None and head_style is None:
        logger.info("plangen: %s is tied to %s: sharding it on the vocabulary too", head_path, emb_path)
        styles[head_path] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    return styles

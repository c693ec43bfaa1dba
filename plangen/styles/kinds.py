"""What kind of module a style splits, and the layout it gives the module's weight.

Each kind is recognised by the module of the styles that split it (packed experts by
:mod:`plangen.styles.experts`, DBRX's flat experts by :mod:`plangen.styles.flat_experts`, ...), so
this sits above them all; the kinds themselves are words of :mod:`plangen.plan.style_facts`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.model.module_facts import is_conv1d
from plangen.plan.style_facts import (
    CONV1D,
    EMBEDDING,
    EXPERTS,
    FLAT_EXPERTS,
    HEADS,
    LINEAR,
    NORM,
    SHARED_EXPERTS,
    SHORT_CONV,
)
from plangen.styles.attention import head_parameters, short_conv_only
from plangen.styles.base import facts_of
from plangen.styles.experts import expert_count
from plangen.styles.flat_experts import flat_expert_shape
from plangen.styles.shared_experts import packed_shared_shape


def module_kind(module: nn.Module, by_heads: bool = False) -> str | None:
    """The kind of module a style splits (:data:`LINEAR`, :data:`EMBEDDING`, :data:`CONV1D`,
    :data:`EXPERTS`, :data:`FLAT_EXPERTS`, :data:`NORM`, ...), None for any other. ``by_heads``: the
    style splits a block's own per-head parameters (gpt-oss attention's sinks), so such a block is of
    kind :data:`HEADS`."""
    if isinstance(module, nn.Embedding):
        return EMBEDDING
    if isinstance(module, nn.Linear):
        return LINEAR
    if is_conv1d(module):
        return CONV1D
    if expert_count(module):
        return EXPERTS
    if flat_expert_shape(module):
        return FLAT_EXPERTS
    if packed_shared_shape(module):
        return SHARED_EXPERTS
    if short_conv_only(module) is not None:
        return SHORT_CONV
    if by_heads and head_parameters(module):
        return HEADS
    own = [p for _, p in module.named_parameters(recurse=False)]
    if own and all(p.dim() == 1 for p in own) and not any(True for c in module.children() for _ in c.parameters()):
        return NORM
    return None


def weight_layout(style: ParallelStyle | None, module: nn.Module) -> str | None:
    """The layout a style gives ``module.weight`` ("plain" for an ordinary tensor); None if unknown."""
    if style is None:
        return "plain"
    facts = facts_of(style)
    if facts is None:
        return None
    kind = module_kind(module)
    return facts.weight_layout(kind if kind in (EMBEDDING, NORM, CONV1D) else LINEAR)

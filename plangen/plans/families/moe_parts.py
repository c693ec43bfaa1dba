"""The parts of a mixture-of-experts block beside its packed experts that the MoE recognizer
(:func:`plangen.plans.families.core.recognize_moe`) tells apart by shape: routers, and shared experts
packed as 3-D weights (Inkling's).

A router scores every expert for every token: an ``[experts, width]`` weight. Inkling's
``InklingTopkRouter`` scores its shared experts too (``[routed + shared, hidden]``: the shared
experts' columns become per-token scales of their outputs), beside a learned ``global_scale``; it
stays whole on every rank like any router, its gradient exact because every branch that reads its
outputs sums their gradient over TP (:class:`plangen.styles.experts.ExpertsParallel`,
:class:`plangen.styles.shared_experts.SharedExpertsParallel`), and summed over DP by FSDP2 only.
"""

from __future__ import annotations

import inspect

from torch import nn

from plangen.styles.shared_experts import packed_shared_shape

_ROUTING_ARGUMENTS = ({"top_k_index", "router_indices"}, {"top_k_weights", "routing_weights"})


def takes_routing(experts: nn.Module) -> bool:
    """The experts' forward takes (hidden_states, top-k expert ids, top-k weights), as ExpertsParallel expects."""
    try:
        names = [n for n in inspect.signature(type(experts).forward).parameters if n != "self"]
    except (TypeError, ValueError):
        return False
    return len(names) >= 3 and all(names[i + 1] in allowed for i, allowed in enumerate(_ROUTING_ARGUMENTS))


def packed_shared_children(block: nn.Module, hidden: int) -> tuple[str, ...]:
    """The block's children that are shared experts packed as 3-D weights over the hidden size."""
    return tuple(
        name
        for name, child in block.named_children()
        if (shape := packed_shared_shape(child)) is not None and shape[2] == hidden
    )


def router_rows(block: nn.Module, experts: int, shared: tuple[str, ...]) -> set[int]:
    """How many rows a router's weight may have: one per routed expert, or one more per packed
    shared expert where the router scores those too (Inkling)."""
    rows = {experts}
    for name in shared:
        shape = packed_shared_shape(getattr(block, name))
        if shape is not None:
            rows.add(experts + shape[0])
    return rows


def is_router(child: nn.Module, rows: set[int], widths: set[int]) -> bool:
    """An ``[experts (+ shared), width]`` weight reading the hidden state (perhaps a score bias beside
    it), or a router MLP: the hidden state projected down, then scored (Zaya's ``ZayaRouter``: an
    ``[experts + 1, router width]`` scoring weight, the extra class a skip expert with no compute)."""
    weights = [p.shape for p in child.parameters() if p.dim() == 2]
    if any(rows_ in rows and width in widths for rows_, width in weights):
        return True
    inner = _widths_read_from(weights, widths)
    scores = rows | {r + 1 for r in rows}
    return any(rows_ in scores and width in inner for rows_, width in weights)


def _widths_read_from(weights: list, widths: set[int]) -> set[int]:
    """Every width a chain of ``[out, in]`` weights reaches from the hidden state."""
    reached: set[int] = set()
    frontier = set(widths)
    while frontier:
        frontier = {out for out, width in weights if width in frontier} - reached
        reached |= frontier
    return reached


__all__ = ["is_router", "packed_shared_children", "router_rows", "takes_routing"]

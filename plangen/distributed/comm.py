"""Counting collectives: torch's ``CommDebugMode``, made robust for every Hugging Face model.

``CommDebugMode`` also attributes each collective to the module that issued it; that module
tracker fails on some models (Gemma3's forward leaves its parent stack empty). The counts do not
depend on it, so :class:`CollectiveCounter` keeps ``CommDebugMode``'s counting and replaces the
tracker with a flat one that attributes everything to ``Global``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

from plangen.stack.torch_compat import comm_tables, op_packet

NATIVE_TO_PY_MAPPING, c10d_collective_ops = comm_tables()


class _FlatTracker:
    name = "Global"
    is_bw = False
    activation_checkpointing = False
    module_parents_dict = {"Global": set()}
    module_helper_dict: dict = {}
    parent_dict: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        return None


class CollectiveCounter(CommDebugMode):
    """``with CollectiveCounter() as c: ...`` then ``c.counts()``: ``{"all_reduce": 5, ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.advanced_module_tracker = _FlatTracker()
        # (collective name, bytes of its result) in issue order, for size checks and cost models.
        self.records: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        packet = op_packet(func)
        if packet in self.comm_registry or packet in c10d_collective_ops:
            packet = NATIVE_TO_PY_MAPPING.get(packet, packet)
            # A functional collective returns its tensor, a c10d one (its tensors, its work).
            result = out[0] if isinstance(out, (tuple, list)) else out
            self.records.append((_short_name(packet), tensor_bytes(result)))
        return out

    def counts(self) -> dict[str, int]:
        """Collective counts by short name (``all_reduce``, ``all_gather_into_tensor``, ...)."""
        out: Counter[str] = Counter()
        for op, n in self.get_comm_counts().items():
            out[_short_name(op)] += n
        return dict(out)


# c10d collectives by the functional collective they are (plangen's MoE styles sum gradients with
# c10d's all-reduce, the vocabulary-parallel loss too; DTensor issues functional ones).
C10D_AS_FUNCTIONAL = {
    "allreduce_": "all_reduce",
    "_allgather_base_": "all_gather_into_tensor",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
}


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def merge_c10d_counts(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` with each c10d collective counted under its functional name: one all-reduce is
    one all-reduce, whichever API issued it."""
    out: Counter[str] = Counter()
    for op, n in counts.items():
        out[C10D_AS_FUNCTIONAL.get(op, op)] += n
    return dict(out)


def _short_name(op) -> str:
    return getattr(op, "__name__", str(op)).split(".")[0]

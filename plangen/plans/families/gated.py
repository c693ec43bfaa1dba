"""Attention with an output gate per head: how the gate's rows are laid out, read from the forward.

Two layouts, both sharded with the heads so that each rank keeps its own heads' gates:

* a query projection twice as wide as the query heads (Qwen3.5's and Qwen3-Next's ``q_proj``,
  ``hidden -> 2 x heads x head_dim``). Its forward says where the gate rows sit: viewed per head
  as ``[..., heads, 2 x head_dim]`` and chunked inside a head (query, then gate, head by head) a
  plain ``Shard(0)`` gives each rank whole heads with their gates; chunked straight away
  (``[all queries; all gates]``) it is a packed projection, re-laid out per rank
  (``FusedColwiseParallel`` with parts ``(1, 1)``);
* a projection of one value per head (LFM3's ``g_proj``, ``hidden -> heads``), which scales each
  head's output: column-parallel, its rows are this rank's heads.

The numerical sweep proves each class's plan; this module only says which projections are gates.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from plangen.plans.families.dims import ModelDims


@dataclass(frozen=True)
class OutputGates:
    """The gate-carrying input projections of an attention block (by name)."""

    query_gates: tuple[str, ...] = ()  # query and gate interleaved per head: plain column-parallel
    fused: tuple[tuple[str, tuple[int, ...]], ...] = ()  # [queries; gates]: re-laid out per rank
    head_gates: tuple[str, ...] = ()  # one value per head

    @property
    def names(self) -> set[str]:
        return {*self.query_gates, *(n for n, _ in self.fused), *self.head_gates}


def read_output_gates(block: nn.Module, reading: dict[str, nn.Linear], dims: ModelDims) -> OutputGates | None:
    """Which of ``reading`` (the projections of the block's input) carry an output gate; None when
    a projection twice as wide as the query heads is not split by its forward as query and gate
    per head (Inkling's ``r_proj`` of ``2 x head_dim`` relative features per head only has the
    width). Projections of another width are left to the caller."""
    from plangen.plans.source.packed import PackedSplit, read_packed_split

    n, d, k = dims.heads, dims.head_dim, dims.kv_heads or dims.heads
    assert n and d
    query_gates: list[str] = []
    fused: list[tuple[str, tuple[int, ...]]] = []
    head_gates: list[str] = []
    for name, linear in reading.items():
        if linear.out_features in (n * d, k * d):
            continue
        if linear.out_features == n and d > 1:
            head_gates.append(name)
            continue
        if linear.out_features != 2 * n * d:
            continue
        split = read_packed_split(block, name, linear.out_features, {n, k}, d)
        if not isinstance(split, PackedSplit) or split.head_attributes:
            return None
        if split.kind == "groups" and split.groups == n:
            query_gates.append(name)
        elif split.kind == "parts" and split.parts == (n * d, n * d):
            fused.append((name, (1, 1)))
        else:
            return None
    return OutputGates(tuple(query_gates), tuple(fused), tuple(head_gates))

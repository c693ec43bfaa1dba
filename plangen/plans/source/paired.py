"""Read from an attention block's forward source whether it pairs its heads (differential attention).

DiffLlama's attention computes ``attn_output1, attn_output2 = torch.chunk(attn_output, 2, dim=2)``:
head ``i`` is combined with head ``i + H/2`` (``out1 - lambda * out2``), and its values likewise are
``torch.chunk(value_states, 2, dim=1)``. Its own parameters (``lambda_q1`` ... one value per feature
of a head) are read only inside sums, ``exp(sum(lambda_q1 * lambda_k1, dim=-1))``: one scalar that
every head shares. Such a block shards by whole pairs (:class:`plangen.styles.attention.PairedHeadsAttentionInput`)
with its own parameters replicated. What the reading cannot prove (which axis the chunk is), the sweep's
numerical check proves per class.
"""

from __future__ import annotations

import ast
from functools import lru_cache

from plangen.plans.source.forward import forward_tree


def _is_halving_chunk(node: ast.AST) -> bool:
    """``torch.chunk(x, 2, dim=d)`` or ``x.chunk(2, dim=d)`` with ``d`` not the last (feature) axis."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "chunk"):
        return False
    args = list(node.args)
    if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
        args = args[1:]  # torch.chunk(tensor, chunks, dim)
    dims = [k.value for k in node.keywords if k.arg == "dim"] or args[1:2]
    if not args or not (isinstance(args[0], ast.Constant) and args[0].value == 2) or not dims:
        return False
    dim = dims[0]
    last = isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and getattr(dim.operand, "value", None) == 1
    return isinstance(dim, ast.Constant) and isinstance(dim.value, int) and dim.value > 0 and not last


def _is_sum(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sum"


def _parameter_reads(tree: ast.AST, names: frozenset[str], inside_sum: bool = False) -> list[tuple[str, bool]]:
    """Every ``self.<name>`` read of ``names``, with whether it sits inside a ``sum(...)`` call."""
    found: list[tuple[str, bool]] = []
    if (
        isinstance(tree, ast.Attribute)
        and isinstance(tree.value, ast.Name)
        and tree.value.id == "self"
        and tree.attr in names
    ):
        return [(tree.attr, inside_sum)]
    for child in ast.iter_child_nodes(tree):
        found += _parameter_reads(child, names, inside_sum or _is_sum(tree))
    return found


@lru_cache(maxsize=None)
def read_paired_heads(block_cls: type, own: frozenset[str]) -> bool:
    """True when ``block_cls``'s forward halves tensors along a head axis (at least twice: the
    attention output and the values) and reads each of its ``own`` parameters, and only, inside sums."""
    tree = forward_tree(block_cls)
    if tree is None or not own:
        return False
    halvings = sum(1 for node in ast.walk(tree) if _is_halving_chunk(node))
    reads = _parameter_reads(tree, own)
    return halvings >= 2 and {name for name, _ in reads} == set(own) and all(summed for _, summed in reads)

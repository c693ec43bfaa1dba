"""Whether an attention ``forward`` that shapes its heads' output by its input's own width
(TrOCR's ``bsz, tgt_len, embed_dim = hidden_states.size()`` ... ``reshape(bsz, tgt_len, embed_dim)``)
can be handed its input as this rank's slice of the hidden dimension: then the width it unpacks is
this rank's heads' width, and its column-parallel projections all-gather the slice back.

That is only safe when the input is read for nothing else: its size (unpacked once), and as the one
argument of the projections that read it (directly, or through ``x = other if cond else input``);
and the unpacked width only as a ``view``/``reshape`` size (reads inside an ``assert``, which only
passes or raises, aside). Read, never run; anything not followed
answers False.
"""

from __future__ import annotations

import ast
from functools import lru_cache

from plangen.plans.source.forward import first_parameter, forward_tree, self_call_name


def _is_size_of(node: ast.AST, name: str) -> bool:
    """``name.size()`` or ``name.shape``."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        node = node.func
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("size", "shape")
        and isinstance(node.value, ast.Name)
        and node.value.id == name
    )


@lru_cache(maxsize=None)
def read_input_only_sized_and_projected(block_cls: type, projections: frozenset[str]) -> bool:
    """True when ``block_cls.forward``'s first argument is only unpacked by size and passed alone to
    ``projections`` (see the module docstring), and the width it unpacks is only a reshape size."""
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return False
    names = {first}
    widths: set[str] = set()
    allowed: set[int] = set()  # ids of Name loads accounted for
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Tuple)
                and target.elts
                and isinstance(target.elts[-1], ast.Name)
                and _is_size_of(value, first)
            ):
                widths.add(target.elts[-1].id)
                allowed.update(id(n) for n in ast.walk(value) if isinstance(n, ast.Name))
            elif (
                isinstance(target, ast.Name)
                and isinstance(value, ast.IfExp)
                and isinstance(value.orelse, ast.Name)
                and value.orelse.id == first
            ):
                names.add(target.id)  # current_states = key_value_states if is_cross_attention else hidden_states
                allowed.add(id(value.orelse))
    if not widths:
        return False
    # An assert only passes or raises (ProphetNet checks the input's size against the unpacked one).
    allowed.update(id(n) for node in ast.walk(tree) if isinstance(node, ast.Assert) for n in ast.walk(node))
    for node in ast.walk(tree):
        call = self_call_name(node)
        if (
            call in projections
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in names
        ):  # type: ignore[attr-defined]
            allowed.add(id(node.args[0]))  # type: ignore[attr-defined]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("view", "reshape")
        ):
            allowed.update(id(n) for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name) and n.id in widths)
    loads = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Load)
        and (n.id == first or n.id in widths or (n.id in names and n.id != first))
    ]
    # An alias is also read by the IfExp's other branch only through its own name: only its loads count.
    return all(id(n) in allowed for n in loads)

"""Walking the autograd graph up from a tensor to the nearest nodes level 2 tagged (:mod:`plangen.check.flow`'s
layouts, :mod:`plangen.check.blame`'s planned outputs)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, TypeVar

T = TypeVar("T")


def nearest_tags(roots: Iterable[Any], tags: Mapping[int, T]) -> list[T]:
    """The tags (keyed by ``id`` of a kept-alive autograd node) nearest above ``roots`` (autograd
    nodes), in the order first found: the walk stops at a tagged node.

    Every node visited stays referenced until the walk ends: ``next_functions`` may make a node's
    Python object afresh and free it after its turn (torch 2.11 does), and a later node's object
    could then reuse its ``id`` and be skipped as seen: level 2 missed ``o_proj``'s reading of
    ``q_proj`` there (PG214 never concluded, a broken Qwen3 edit was called clean) and blamed the
    wrong entry."""
    found: dict[int, T] = {}
    seen: set[int] = set()
    visited: list[Any] = []
    stack = [node for node in roots if node is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        visited.append(node)
        tag = tags.get(id(node))
        if tag is not None:
            found.setdefault(id(tag), tag)
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(found.values())

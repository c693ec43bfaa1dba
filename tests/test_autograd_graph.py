"""plangen.check.autograd_graph: the walk level 2 takes up the autograd graph (PG214's layouts, the fake
run's blame), on a graph whose nodes' Python objects come and go as torch 2.11's do."""

from __future__ import annotations

import weakref

from plangen.check.autograd_graph import nearest_tags


class _Node:
    """An autograd node as C++ holds it."""

    def __init__(self, name: str, parents: list["_Node"]) -> None:
        self.name, self.parents = name, parents
        self.wrapper: weakref.ref | None = None


class _PyNode:
    """Its Python object, made afresh on each ``next_functions`` unless one is alive (torch 2.11): freed
    after its turn in a walk, and its id then free for the next one made."""

    def __init__(self, node: _Node) -> None:
        self.node = node

    @staticmethod
    def of(node: _Node) -> "_PyNode":
        alive = node.wrapper() if node.wrapper is not None else None
        if alive is None:
            alive = _PyNode(node)
            node.wrapper = weakref.ref(alive)
        return alive

    @property
    def next_functions(self):
        return tuple((_PyNode.of(parent), 0) for parent in self.node.parents)


def test_every_tag_above_is_found_though_node_objects_are_made_afresh():
    # q, k and v each tagged (their objects kept alive, as the tracer keeps them), long chains of
    # untagged nodes between them and the reader: the chains' objects are freed as the walk goes on.
    tagged = {}
    keep = []
    tops = []
    for name in ("q", "k", "v"):
        top = _Node(name, [])
        wrapper = _PyNode.of(top)
        keep.append(wrapper)
        tagged[id(wrapper)] = name
        node = top
        for step in range(50):
            node = _Node(f"{name}{step}", [node])
        tops.append(node)
    reader = _PyNode.of(_Node("attention", tops))
    assert nearest_tags([reader], tagged) == ["v", "k", "q"]  # depth-first, the last parent first

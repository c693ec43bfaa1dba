"""What a block's ``forward`` shapes its tensors by (``self.num_heads`` in OPT's
``view(bsz, -1, self.num_heads, self.head_dim)``, which must become this rank's count), read from
the source as :mod:`plangen.plans.source.forward` reads the rest, and from the block's own helper
methods that ``forward`` calls (Whisper-style ``self._shape(tensor, seq_len, bsz)``, whose view by
``self.num_heads`` a reader of ``forward`` alone would miss: a silently wrong plan).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from functools import lru_cache

from plangen.plans.source.forward import first_parameter, forward_tree

__all__ = ["ShapeSizes", "read_shape_sizes"]


def _helper_trees(cls: type, tree: ast.AST) -> list[ast.AST]:
    """The parsed sources of ``cls``'s own methods that ``forward`` calls as ``self.name(...)``."""
    names = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    }
    trees = []
    for name in sorted(names):
        method = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(method) or name == "forward":
            continue  # a submodule, a property, a builtin: not a helper whose source we read
        try:
            trees.append(ast.parse(textwrap.dedent(inspect.getsource(method))))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
    return trees


@dataclass(frozen=True)
class ShapeSizes:
    """The sizes a forward gives ``.view``/``.reshape``: ``self`` attributes (``self.num_heads``),
    those ever given as the last size (a per-head width), and whether a size is the block input's
    own width (``bsz, tgt_len, embed_dim = hidden_states.size()``)."""

    attributes: frozenset[str]
    last: frozenset[str]
    input_width: bool


@lru_cache(maxsize=None)
def read_shape_sizes(block_cls: type) -> ShapeSizes | None:
    """What ``block_cls.forward`` shapes its tensors by; None when its source cannot be read."""
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return None
    tuples: dict[str, list[ast.expr]] = {}
    widths: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Tuple):
            tuples[target.id] = list(value.elts)
        # a, b, width = x.size() / x.shape: the last name is the input's width
        source = value.func if isinstance(value, ast.Call) and not value.args else value
        if (
            isinstance(target, ast.Tuple)
            and target.elts
            and isinstance(target.elts[-1], ast.Name)
            and isinstance(source, ast.Attribute)
            and source.attr == ("size" if source is not value else "shape")
            and isinstance(source.value, ast.Name)
            and source.value.id == first
        ):
            widths.add(target.elts[-1].id)
    attributes: set[str] = set()
    last: set[str] = set()
    input_width = False
    for node in (n for t in (tree, *_helper_trees(block_cls, tree)) for n in ast.walk(t)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("view", "reshape")
        ):
            continue
        sizes: list[ast.expr] = []
        for arg in node.args:
            named = arg.value if isinstance(arg, ast.Starred) else arg
            if isinstance(named, ast.Name) and named.id in tuples:  # view(*shape), view(shape)
                sizes += tuples[named.id]
            elif isinstance(arg, ast.Tuple):
                sizes += list(arg.elts)
            else:
                sizes.append(arg)
        for index, size in enumerate(sizes):
            for part in ast.walk(size):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                    attributes.add(part.attr)
                    if index == len(sizes) - 1 and part is size:
                        last.add(part.attr)
                elif isinstance(part, ast.Name) and part.id in widths:
                    input_width = True
    return ShapeSizes(frozenset(attributes), frozenset(last), input_width)

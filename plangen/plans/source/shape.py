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

from plangen.plans.source.forward import first_parameter, forward_tree, self_calls

__all__ = ["ShapeSizes", "read_shape_sizes"]


def _helper_trees(cls: type) -> list[tuple[ast.AST, dict[str, list[ast.expr]]]]:
    """The parsed sources of ``cls``'s own methods that ``forward`` calls as ``self.name(...)``, each
    with what ``forward`` passes its parameters (by position or keyword, every call's): GPT-J's
    ``self._split_heads(query, self.num_attention_heads, self.head_dim)`` (transformers 5.5-5.8)
    views by its parameter ``num_attention_heads``, which is ``self.num_attention_heads``."""
    trees = []
    for name, calls in sorted(self_calls(cls).items()):
        method = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(method) or name == "forward":
            continue  # a submodule, a property, a builtin: not a helper whose source we read
        try:
            helper = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        trees.append((helper, _passed(helper, [call for call, _ in calls])))
    return trees


def _passed(helper: ast.AST, calls: list[ast.Call]) -> dict[str, list[ast.expr]]:
    """Each of ``helper``'s parameters (``self`` left out) and the expressions ``calls`` pass it."""
    function = helper.body[0] if isinstance(helper, ast.Module) and helper.body else None
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    parameters = [a.arg for a in (*function.args.posonlyargs, *function.args.args)][1:]
    passed: dict[str, list[ast.expr]] = {}
    for call in calls:
        for parameter, arg in zip(parameters, call.args):
            if not isinstance(arg, ast.Starred):
                passed.setdefault(parameter, []).append(arg)
        for keyword in call.keywords:
            if keyword.arg is not None:
                passed.setdefault(keyword.arg, []).append(keyword.value)
    return passed


def _shape_tuples(tree: ast.AST) -> dict[str, list[ast.expr]]:
    """Names assigned a shape in ``tree``: ``shape = (b, s, self.num_heads, -1)``, or the sizes added
    to another shape's (``new_shape = x.size()[:-1] + (heads, width)``: its last sizes)."""
    tuples: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and isinstance(value.right, ast.Tuple):
            value = value.right
        if isinstance(value, ast.Tuple):
            tuples[node.targets[0].id] = list(value.elts)
    return tuples


def _view_sizes(call: ast.Call, tuples: dict[str, list[ast.expr]]) -> list[ast.expr]:
    """The sizes ``call`` (a ``view``/``reshape``) gives, a shape held in a name read through ``tuples``."""
    sizes: list[ast.expr] = []
    for arg in call.args:
        named = arg.value if isinstance(arg, ast.Starred) else arg
        if isinstance(named, ast.Name) and named.id in tuples:  # view(*shape), view(shape)
            sizes += tuples[named.id]
        elif isinstance(arg, ast.Tuple):
            sizes += list(arg.elts)
        else:
            sizes.append(arg)
    return sizes


def _is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _self_attributes(node: ast.AST) -> set[str]:
    """The ``self.X`` names read in ``node``."""
    return {part.attr for part in ast.walk(node) if _is_self_attribute(part)}  # type: ignore[attr-defined]


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
    widths: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
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
    for body, passed in ((tree, {}), *_helper_trees(block_cls)):
        tuples = _shape_tuples(body)
        for node in ast.walk(body):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("view", "reshape"):
                continue
            sizes = _view_sizes(node, tuples)
            for index, size in enumerate(sizes):
                # A helper's parameter stands for what forward passes it.
                bound = passed.get(size.id, [size]) if isinstance(size, ast.Name) else [size]
                for whole in bound:
                    attributes |= _self_attributes(whole)
                    if index == len(sizes) - 1 and _is_self_attribute(whole):
                        last.add(whole.attr)  # type: ignore[attr-defined] - the last size is self.X itself
                    for part in ast.walk(whole):
                        if isinstance(part, ast.Name) and part.id in widths:
                            input_width = True
                        elif isinstance(part, ast.Name) and part.id in passed and part is not whole:
                            for expression in passed[part.id]:  # heads * width, each passed in
                                attributes |= _self_attributes(expression)
    return ShapeSizes(frozenset(attributes), frozenset(last), input_width)

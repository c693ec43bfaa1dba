"""How an attention block splits its one packed q|k|v projection, read from its forward source.

A packed projection's shape says only that it is as wide as q, k and v together; how its rows are
laid out is in the forward, in one of two ways (both read here with ``ast`` and the module's own
integer attributes, never by running it):

* **groups**: the output is viewed as ``[..., groups, parts of one group]`` (GPT-NeoX's
  ``view(*shape, -1, 3 * head_size)``, Persimmon's and Bloom's ``view(b, s, heads, 3, head_dim)``,
  CodeGen's ``mp_num`` blocks, Falcon's KV groups) and then split *inside* a group. Each group is a
  contiguous run of rows, so a plain ``Shard(0)`` gives each rank whole groups: its own heads' q,
  k and v, with no re-layout;
* **parts**: the output is chunked or split along its features straight away (MPT's
  ``chunk(3, dim=2)``, GPT-BigCode's ``split((embed, kv, kv), dim=3)``): ``[q; k; v]`` one after
  another, which :class:`plangen.styles.fused.FusedColwiseParallel` re-lays out per rank.

Either way the forward may also use head counts of its own (``self.num_heads`` in a ``view``):
those attributes are reported so the plan makes them this rank's (``LocalHeadCounts``). Anything
the reader cannot follow answers None; the numerical sweep proves what it does answer.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from torch import nn

# Tensor methods that keep the packed rows where they are (elementwise, copies, casts).
_KEEPS_LAYOUT = {"clamp", "clamp_", "contiguous", "to", "float", "half", "bfloat16", "clone", "type_as"}
# Uses that only read metadata: not a consumer of the values.
_METADATA = {"size", "shape", "dim", "ndim", "dtype", "device"}
# Calls whose arguments are shapes or split sizes: head counts read there must become this rank's.
_SHAPING = {"view", "reshape", "split", "chunk", "expand", "unflatten", "repeat", "narrow", "flatten"}


@dataclass(frozen=True)
class PackedSplit:
    """How the forward splits a packed projection's output.

    ``kind`` is ``"groups"`` (``groups`` contiguous groups, each split inside) or ``"parts"``
    (``parts``: the features of each part, one after another). ``head_attributes`` are the
    module's integer attributes equal to a head count that the forward uses in shapes.
    """

    kind: str
    groups: int = 0
    parts: tuple[int, ...] = ()
    head_attributes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    """The forward splits the packed output in a way that does not follow the heads, and why."""

    why: str


@lru_cache(maxsize=None)
def function_node(cls: type, name: str) -> ast.FunctionDef | None:
    function = getattr(cls, name, None)
    if function is None or not callable(function):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


class SourceReader:
    """One function of the block, with its module: evaluates constant expressions, follows names."""

    def __init__(self, module: nn.Module, tree: ast.FunctionDef) -> None:
        self.module = module
        self.tree = tree
        self.parents = _parents(tree)
        self.assigned: dict[str, list[ast.Assign]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned.setdefault(node.targets[0].id, []).append(node)

    # --- values -------------------------------------------------------------------------------

    def attribute(self, node: ast.AST) -> Any:
        """``self.X`` (or ``self.config.X``) of the module, else a KeyError."""
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr in self.module._modules or node.attr in self.module._parameters:
                    raise KeyError(node.attr)
                return getattr(self.module, node.attr)
            inner = self.attribute(node.value)
            return getattr(inner, node.attr)
        raise KeyError(ast.dump(node))

    def value(self, node: ast.AST) -> Any:
        """The constant value of an expression of literals, module attributes and names bound once."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Name):
            sources = self.assigned.get(node.id, [])
            if len(sources) != 1:
                raise KeyError(node.id)
            return self.value(sources[0].value)
        if isinstance(node, ast.UnaryOp):
            operand = self.value(node.operand)
            ops = {ast.USub: lambda v: -v, ast.Not: lambda v: not v, ast.UAdd: lambda v: v}
            return ops[type(node.op)](operand)
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            ops = {
                ast.Add: lambda a, b: a + b,
                ast.Sub: lambda a, b: a - b,
                ast.Mult: lambda a, b: a * b,
                ast.FloorDiv: lambda a, b: a // b,
            }
            if type(node.op) not in ops:
                raise KeyError("operator")
            return ops[type(node.op)](left, right)
        if isinstance(node, (ast.Tuple, ast.List)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            values = [self.value(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            same = self.value(node.left) is self.value(node.comparators[0])
            return same if isinstance(node.ops[0], ast.Is) else not same
        raise KeyError(ast.dump(node)[:40])

    def int_value(self, node: ast.AST) -> int | None:
        try:
            value = self.value(node)
        except Exception:  # noqa: BLE001 - anything not constant is "unknown"
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def live(self, node: ast.AST) -> bool:
        """False when ``node`` sits in a branch its ``if`` provably does not take for this module."""
        child = node
        parent = self.parents.get(id(child))
        while parent is not None:
            if isinstance(parent, ast.If) and child is not parent.test:
                try:
                    taken = bool(self.value(parent.test))
                except Exception:  # noqa: BLE001
                    taken = None
                if taken is not None and (child in parent.body) != taken:
                    return False
            if isinstance(parent, ast.IfExp) and child is not parent.test:
                try:
                    taken = bool(self.value(parent.test))
                except Exception:  # noqa: BLE001
                    taken = None
                if taken is not None and (child is parent.body) != taken:
                    return False
            child, parent = parent, self.parents.get(id(parent))
        return True

    # --- data flow ----------------------------------------------------------------------------

    def next_use(self, name: str, after: ast.AST | None) -> ast.Name | None:
        """The first live load of ``name`` after statement ``after`` (None: anywhere) that reads its values."""
        start = (0, 0) if after is None else (after.end_lineno or after.lineno, after.end_col_offset or 0)
        uses = sorted(
            (
                n
                for n in ast.walk(self.tree)
                if isinstance(n, ast.Name)
                and n.id == name
                and isinstance(n.ctx, ast.Load)
                and (n.lineno, n.col_offset) > start
            ),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for use in uses:
            parent = self.parents.get(id(use))
            if isinstance(parent, ast.Attribute) and parent.attr in _METADATA:
                continue
            if self.live(use):
                return use
        return None

    def first_use_of_parameter(self, index: int) -> ast.Name | None:
        params = [a.arg for a in self.tree.args.args][1:]
        if index >= len(params):
            return None
        return self.next_use(params[index], None)

    def expand_shape(self, args: list[ast.expr]) -> list[ast.expr | None]:
        """A view's shape as elements; None for leading elements of unknown count (``*input_shape``)."""
        out: list[ast.expr | None] = []
        for arg in args:
            node = arg.value if isinstance(arg, ast.Starred) else arg
            if (
                isinstance(node, ast.Name)
                and len(self.assigned.get(node.id, [])) == 1
                and (isinstance(arg, ast.Starred) or len(args) == 1)
            ):
                node = self.assigned[node.id][0].value
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Tuple):
                out.append(None)
                out.extend(node.right.elts)
            elif isinstance(node, ast.Tuple) and (isinstance(arg, ast.Starred) or len(args) == 1):
                out.extend(self.expand_shape(list(node.elts)))
            elif isinstance(arg, ast.Starred):
                out.append(None)
            else:
                out.append(node)
        return out

    def head_attributes(self, node: ast.AST, counts: set[int], widths: set[str]) -> set[str]:
        """``self.X`` head counts inside ``node`` (following names bound once), except ``widths``."""
        found: set[str] = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and len(self.assigned.get(sub.id, [])) == 1 and sub is not node:
                found |= self.head_attributes(self.assigned[sub.id][0].value, counts, widths)
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr not in widths
            ):
                value = getattr(self.module, sub.attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value in counts:
                    found.add(sub.attr)
        return found


def _attributes_in(reader: SourceReader, node: ast.AST) -> set[str]:
    """Every ``self.X`` inside ``node``, following names bound once."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and len(reader.assigned.get(sub.id, [])) == 1 and sub is not node:
            found |= _attributes_in(reader, reader.assigned[sub.id][0].value)
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            found.add(sub.attr)
    return found


def _ratios(reader: SourceReader, nodes: list[ast.expr], counts: set[int]) -> set[str]:
    """Head counts read only as a ratio of two (Falcon's ``num_heads // num_kv_heads`` query heads per
    group): the ratio stays when both become this rank's, so they are head counts, not widths."""
    found: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.FloorDiv):
                pair = [reader.head_attributes(side, counts, set()) for side in (sub.left, sub.right)]
                if all(
                    len(p) == 1 and _attributes_in(reader, side) == p for p, side in zip(pair, (sub.left, sub.right))
                ):
                    found |= pair[0] | pair[1]
    return found


@dataclass
class _Op:
    """The first operation on the packed values: a method call on them, or a subscript."""

    reader: SourceReader
    method: str  # "view", "chunk", ..., or "subscript"
    node: ast.AST  # the Call, or the Subscript
    moved: bool = False  # a transpose/permute came before it
    rank_added: int = 0  # unsqueezes before it


def _follow(reader: SourceReader, node: ast.AST, cls: type, moved: bool = False, added: int = 0) -> _Op | None:
    """Follow the values of ``node`` (an expression) to the first operation that lays them out."""
    for _ in range(50):
        parent = reader.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            call = reader.parents.get(id(parent))
            if not (isinstance(call, ast.Call) and call.func is parent):
                return None
            if parent.attr in _KEEPS_LAYOUT:
                node = call
                continue
            if parent.attr in ("transpose", "permute"):
                node, moved = call, True
                continue
            if parent.attr == "unsqueeze":
                node, added = call, added + 1
                continue
            return _Op(reader, parent.attr, call, moved, added)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return _Op(reader, "subscript", parent, moved, added)
        if _is_torch_split(parent, node):
            # torch.chunk(x, 2, dim=-1) (Qwen3.5's gated query) read as x.chunk(2, dim=-1).
            assert isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            method = ast.copy_location(
                ast.Call(ast.Attribute(node, parent.func.attr, ast.Load()), parent.args[1:], parent.keywords), parent
            )
            return _Op(reader, parent.func.attr, method, moved, added)
        if isinstance(parent, ast.Assign) and parent.value is node:
            if len(parent.targets) != 1 or not isinstance(parent.targets[0], ast.Name):
                return None
            use = reader.next_use(parent.targets[0].id, parent)
            if use is None:
                return None
            node = use
            continue
        if (
            isinstance(parent, ast.Call)
            and node in parent.args
            and isinstance(parent.func, ast.Attribute)
            and isinstance(parent.func.value, ast.Name)
            and parent.func.value.id == "self"
            and parent.func.attr not in reader.module._modules
        ):
            tree = function_node(cls, parent.func.attr)
            if tree is None:
                return None
            inner = SourceReader(reader.module, tree)
            use = inner.first_use_of_parameter(parent.args.index(node))
            if use is None:
                return None
            reader, node = inner, use
            continue
        return None
    return None


def _is_torch_split(parent: ast.AST | None, node: ast.AST) -> bool:
    """``parent`` is ``torch.chunk(node, ...)`` or ``torch.split(node, ...)``."""
    return (
        isinstance(parent, ast.Call)
        and bool(parent.args)
        and parent.args[0] is node
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr in ("chunk", "split")
        and isinstance(parent.func.value, ast.Name)
        and parent.func.value.id == "torch"
    )


def _split_axis(op: _Op, rank: int | None) -> int | None:
    """The (negative) axis along which ``op`` splits its input, or None when it cannot be told."""
    reader = op.reader
    if op.method in ("chunk", "split"):
        call = op.node
        assert isinstance(call, ast.Call)
        dim_node = next(
            (k.value for k in call.keywords if k.arg == "dim"), call.args[1] if len(call.args) > 1 else None
        )
        dim = reader.int_value(dim_node) if dim_node is not None else 0
        if dim is None:
            return None
        if dim >= 0:
            return None if rank is None else dim - rank
        return dim
    if op.method == "subscript":
        index = op.node.slice  # type: ignore[attr-defined]
        items = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        full = [isinstance(i, ast.Slice) and i.lower is None and i.upper is None and i.step is None for i in items]
        picked = [
            i
            for i, f in enumerate(full)
            if not f and not (isinstance(items[i], ast.Constant) and items[i].value is Ellipsis)
        ]
        if len(picked) != 1:
            return None
        ellipsis = [i for i, item in enumerate(items) if isinstance(item, ast.Constant) and item.value is Ellipsis]
        if ellipsis and ellipsis[0] < picked[0]:
            return picked[0] - len(items)
        if not ellipsis:
            return None if rank is None else picked[0] - rank
        return None
    return None


def _projection_call(reader: SourceReader, projection: str, first: str) -> ast.Call | None:
    calls = [
        n
        for n in ast.walk(reader.tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
        and n.func.attr == projection
        and reader.live(n)
    ]
    if len(calls) != 1 or len(calls[0].args) != 1 or not isinstance(calls[0].args[0], ast.Name):
        return None
    return calls[0] if calls[0].args[0].id == first else None


def _shape_heads(reader: SourceReader, counts: set[int], widths: set[str], cls: type, seen: set[str]) -> set[str]:
    """Head-count attributes the function (and the methods it calls on self) uses in shapes."""
    found: set[str] = set()
    for node in ast.walk(reader.tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or not reader.live(node):
            continue  # a branch this module never takes (Falcon's new_decoder_architecture when multi-query)
        is_self_method = (
            isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr not in reader.module._modules
        )
        if node.func.attr in _SHAPING or is_self_method:
            for arg in (*node.args, *(k.value for k in node.keywords)):
                found |= reader.head_attributes(arg, counts, widths)
        if is_self_method and node.func.attr not in seen:
            seen.add(node.func.attr)
            tree = function_node(cls, node.func.attr)
            if tree is not None:
                found |= _shape_heads(SourceReader(reader.module, tree), counts, widths, cls, seen)
    return found


def read_packed_split(
    block: nn.Module, projection: str, out_features: int, head_counts: set[int], head_size: int | None = None
) -> PackedSplit | Refused | None:
    """How ``block``'s forward splits the output of its packed projection ``projection``.

    ``head_counts`` are the model's head counts (query and key/value heads): attributes of the
    module with those values, used in shapes, are reported as head counts. None when the source
    cannot be followed.
    """
    cls = type(block)
    tree = function_node(cls, "forward")
    if tree is None or not tree.args.args[1:]:
        return None
    reader = SourceReader(block, tree)
    call = _projection_call(reader, projection, tree.args.args[1].arg)
    if call is None:
        return None
    op = _follow(reader, call, cls)
    if op is None:
        return None
    if op.method in ("view", "reshape"):
        return _read_groups(op, out_features, head_counts, cls, head_size)
    if op.method in ("chunk", "split") and not op.moved:
        return _read_parts(op, out_features, head_counts, cls, reader, head_size)
    return None


def _read_groups(
    op: _Op, out_features: int, counts: set[int], cls: type, head_size: int | None
) -> PackedSplit | Refused | None:
    reader, view = op.reader, op.node
    assert isinstance(view, ast.Call)
    shape = reader.expand_shape(list(view.args))
    trailing: list[ast.expr] = []
    for element in reversed(shape):
        if element is None or reader.int_value(element) is None:
            break
        trailing.insert(0, element)
    if len(trailing) < 2:
        return None
    values = [reader.int_value(e) for e in trailing]
    if values[0] != -1 and values[1:].count(-1) == 1:
        # Falcon's GQA on 5.25: view(*shape, self.num_kv_heads, -1, self.head_dim): the -1 is what
        # the features leave, the queries of one group and its key and value.
        known = math.prod(v for v in values if v != -1)  # type: ignore[misc]
        if known <= 0 or out_features % known:
            return None
        values = [v if v != -1 else out_features // known for v in values]
    parts = _parts_view(reader, trailing, values, out_features, counts, head_size)
    if parts:  # GOT-OCR2's reshape(b, s, 3, self.num_attention_heads, -1): [q; k; v], each by heads
        heads = _shape_heads(SourceReader(reader.module, function_node(cls, "forward")), counts, set(), cls, set())  # type: ignore[arg-type]
        return _unsure(reader.module, heads, head_size) or PackedSplit(
            "parts", parts=parts, head_attributes=tuple(sorted(heads))
        )
    unit = 1
    for v in values[1:]:
        unit *= v  # type: ignore[operator]
    if unit <= 0 or out_features % unit:
        return None
    groups = out_features // unit
    if values[0] not in (-1, groups):
        return None
    group_attrs = reader.head_attributes(trailing[0], counts, set()) if values[0] != -1 else set()
    if values[0] != -1 and not group_attrs:
        return Refused(f"its output is viewed as {groups} groups of {unit} features, a count that is not a head count")
    rank = len(shape) if None not in shape else None
    after = _follow(reader, view, cls)
    if after is not None and after.method in ("view", "reshape") and not after.moved and not after.rank_added:
        # Viewed again before it is split (Falcon on 5.25: as heads, then as KV groups): the
        # features are still in their order, so the later view is the one that says the layout.
        return _read_groups(after, out_features, counts, cls, head_size)
    if after is None or after.method not in ("chunk", "split", "subscript"):
        return None
    axis = _split_axis(after, rank)
    inside = axis is not None and (axis == -1 if after.moved else -len(trailing) < axis <= -1)
    shared = _shared_heads(reader, trailing, after, axis, counts, unit, head_size)
    if shared:
        # Multi-query (Falcon-7B's view(b, s, num_heads + 2, head_dim), then [..., :-2, :]): the query
        # heads, then one key and one value head, one after another.
        heads = _shape_heads(SourceReader(reader.module, function_node(cls, "forward")), counts, set(), cls, set())  # type: ignore[arg-type]
        unsure = _unsure(reader.module, heads - group_attrs, head_size)
        if unsure:
            return unsure
        queries = (groups - shared) * unit
        return PackedSplit(
            "parts", parts=(queries, *(unit,) * shared), head_attributes=tuple(sorted(heads | group_attrs))
        )
    if not inside:
        return Refused(
            f"its output, viewed as {groups} groups of {unit} features, is split across the groups (multi-query's "
            "shared key/value heads after all query heads?), so a rank's rows are not its own heads"
        )
    # The attributes sizing one group (CodeGen's embed_dim // mp_num) stay whole: a group is not split.
    widths = {a for e in trailing[1:] for a in _attributes_in(reader, e)} - _ratios(reader, trailing[1:], counts)
    heads = _shape_heads(SourceReader(reader.module, function_node(cls, "forward")), counts, widths, cls, set())  # type: ignore[arg-type]
    unsure = _unsure(reader.module, heads - group_attrs, head_size)
    if unsure:
        return unsure
    return PackedSplit("groups", groups=groups, head_attributes=tuple(sorted(heads | group_attrs)))


def _parts_view(
    reader: SourceReader,
    trailing: list[ast.expr],
    values: list[int | None],
    out_features: int,
    counts: set[int],
    head_size: int | None,
) -> tuple[int, ...]:
    """The parts of a view ``(..., P, heads, head_size or -1)`` whose P is a literal (the parts one
    after another, each split by heads: ``[q; k; v]``), else (); the heads are a head-count attribute."""
    if len(trailing) != 3 or not isinstance(trailing[0], ast.Constant) or not head_size:
        return ()
    count, heads, size = values
    if not (
        count
        and count >= 2
        and heads in counts
        and size in (-1, head_size)
        and count * heads * head_size == out_features
        and reader.head_attributes(trailing[1], counts, set())
    ):
        return ()
    return (out_features // count,) * count


def _shared_heads(
    reader: SourceReader,
    trailing: list[ast.expr],
    after: _Op,
    axis: int | None,
    counts: set[int],
    unit: int,
    head_size: int | None,
) -> int:
    """How many single heads follow the query heads in a view of ``heads + c`` groups of one head
    each, split across the groups with the query heads taken first; else 0."""
    if after.moved or unit != head_size or axis != -len(trailing):
        return 0
    if after.method == "subscript":
        return _single_heads_sliced_off(reader, trailing[0], after.node, axis, counts)  # type: ignore[arg-type]
    if after.method == "split":
        return _single_heads_split_off(reader, trailing[0], after.node, counts)  # type: ignore[arg-type]
    return 0


def _single_heads_sliced_off(
    reader: SourceReader, count: ast.expr, subscript: ast.Subscript, axis: int, counts: set[int]
) -> int:
    """Falcon-7B on 5.24: ``view(b, s, self.num_heads + 2, head_dim)``, then ``[..., :-2, :]``."""
    if not (isinstance(count, ast.BinOp) and isinstance(count.op, ast.Add)):
        return 0
    shared = reader.int_value(count.right)
    if not shared or not reader.head_attributes(count.left, counts, set()):
        return 0
    index = subscript.slice
    items = list(index.elts) if isinstance(index, ast.Tuple) else [index]
    picked = items[len(items) + axis] if len(items) >= -axis else None
    if not (
        isinstance(picked, ast.Slice)
        and picked.lower is None
        and picked.step is None
        and picked.upper is not None
        and reader.int_value(picked.upper) == -shared
    ):
        return 0
    return shared


def _single_heads_split_off(reader: SourceReader, count: ast.expr, call: ast.Call, counts: set[int]) -> int:
    """Falcon-7B on 5.25: ``view(*shape, -1, head_dim)``, then ``split([self.num_heads, 1, 1], dim=-2)``."""
    sizes = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "split_size"), None)
    if (
        not isinstance(sizes, (ast.List, ast.Tuple))
        or len(sizes.elts) < 2
        or not reader.head_attributes(sizes.elts[0], counts, set())
        or any(reader.int_value(e) != 1 for e in sizes.elts[1:])
    ):
        return 0
    groups, heads, shared = reader.int_value(count), reader.int_value(sizes.elts[0]), len(sizes.elts) - 1
    if heads is None or groups not in (-1, heads + shared):
        return 0
    return shared


def _unsure(module: nn.Module, found: set[str], head_size: int | None) -> Refused | None:
    # An attribute equal to a head count and to the head size, read outside a role the view fixes.
    same = sorted(a for a in found if getattr(module, a) == head_size)
    if same:
        return Refused(
            f"{', '.join(same)} equals both a head count and the head size {head_size}: which it is cannot be told"
        )
    return None


def _read_parts(
    op: _Op, out_features: int, counts: set[int], cls: type, forward: SourceReader, head_size: int | None
) -> PackedSplit | Refused | None:
    reader, call = op.reader, op.node
    assert isinstance(call, ast.Call)
    axis = _split_axis(op, 3 + op.rank_added)  # the projection output is [batch, sequence, features]
    if axis != -1 or not call.args:
        return None
    size = reader.int_value(call.args[0])
    if op.method == "chunk":
        if size is None or size < 2 or out_features % size:
            return None
        parts = (out_features // size,) * size
    elif size is not None:
        if size <= 0 or out_features % size:
            return None
        parts = (size,) * (out_features // size)
    else:
        try:
            listed = reader.value(call.args[0])
        except Exception:  # noqa: BLE001
            return None
        if not (isinstance(listed, list) and all(isinstance(v, int) for v in listed)) or sum(listed) != out_features:
            return None
        parts = tuple(listed)
    # Split sizes read from attributes (GPT-2's split_size) are this rank's sizes once sharded.
    sized = {
        a.attr
        for a in ast.walk(call.args[0])
        if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"
    }
    heads = _shape_heads(forward, counts, set(), cls, set())
    unsure = _unsure(reader.module, heads - sized, head_size)
    if unsure:
        return unsure
    return PackedSplit("parts", parts=parts, head_attributes=tuple(sorted(heads | sized)))


def read_shape_head_attributes(
    block: nn.Module, head_counts: set[int], head_size: int | None
) -> tuple[str, ...] | Refused | None:
    """The head-count attributes ``block``'s forward (and the methods it calls on self) uses in
    shapes (GPT-Neo's ``self._split_heads(query, self.num_heads, self.head_dim)``); None without source."""
    tree = function_node(type(block), "forward")
    if tree is None:
        return None
    heads = _shape_heads(SourceReader(block, tree), head_counts, set(), type(block), set())
    unsure = _unsure(block, heads, head_size)
    return unsure if unsure is not None else tuple(sorted(heads))

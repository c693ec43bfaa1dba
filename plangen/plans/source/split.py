"""What a parent module's ``forward`` source says about blocks split over two of its children
(BERT's ``attention.self`` then ``attention.output``, ``intermediate`` then ``output``), and the
other readers the split blocks need: the column-parallel half's output must reach the row-parallel
half and nothing else, which only the parent's source can tell.

The general readers and their rules (read, never run; anything not followed answers ``None``) are
:mod:`plangen.plans.source.forward`'s; this module adds the ones that follow a value across
sibling children and helper methods.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from functools import lru_cache

from plangen.plans.source.forward import (
    BlockCall,
    statement_assigns,
    first_parameter,
    forward_tree,
    self_call_name,
    self_calls,
    unpacked_outputs,
)

# ---------------------------------------------------------------------------------------------
# Blocks split over two sibling modules (BERT's ``attention.self`` then ``attention.output``,
# ``intermediate`` then ``output``): the column-parallel half's output must reach the row-parallel
# half and nothing else, which only the parent's source can tell.


@lru_cache(maxsize=None)
def forward_and_helpers(cls: type) -> tuple[ast.FunctionDef, ...]:
    """``cls.forward`` and the methods of ``cls`` it names as ``self.<method>`` (BERT's layer hands
    ``self.feed_forward_chunk`` to ``apply_chunking_to_forward``), each parsed on its own."""
    tree = forward_tree(cls)
    if tree is None:
        return ()
    trees = [tree]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
            continue
        method = inspect.getattr_static(cls, node.attr, None)
        if not inspect.isfunction(method) or node.attr == "forward":
            continue
        try:
            parsed = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            return ()
        if parsed.body and isinstance(parsed.body[0], ast.FunctionDef) and parsed.body[0] not in trees:
            trees.append(parsed.body[0])
    return tuple(trees)


def _calls_in(function: ast.FunctionDef) -> dict[str, list[tuple[ast.Call, ast.AST | None]]]:
    calls: dict[str, list[tuple[ast.Call, ast.AST | None]]] = {}
    for parent in ast.walk(function):
        for node in ast.iter_child_nodes(parent):
            name = self_call_name(node)
            if name is not None:
                calls.setdefault(name, []).append((node, parent))  # type: ignore[arg-type]
    return calls


def read_helper_block_call(parent_cls: type, child_name: str, child_cls: type) -> BlockCall | None:
    """:func:`read_block_call` over ``forward`` and the helper methods it names; None when ``self.<child>``
    is called other than exactly once there, or in a way that cannot be told for sure."""
    calls = [c for tree in forward_and_helpers(parent_cls) for c in _calls_in(tree).get(child_name, [])]
    if len(calls) != 1:
        return None
    call, parent = calls[0]
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if call.args:
        return BlockCall(len(call.args), None, unpacked_outputs(call, parent))
    first = first_parameter(child_cls)
    if first is None or first not in {k.arg for k in call.keywords}:
        return None
    return BlockCall(0, first, unpacked_outputs(call, parent))


def _position(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def _end(node: ast.AST) -> tuple[int, int]:
    return (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def _is_rest_of(node: ast.AST, name: str) -> bool:
    """``name[1:]``: the outputs after the first (attention weights handed up and dropped)."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and isinstance(node.slice, ast.Slice)
        and node.slice.upper is None
        and node.slice.step is None
        and isinstance(node.slice.lower, ast.Constant)
        and node.slice.lower.value == 1
    )


def _chunked_child(cls: type, node: ast.AST) -> str | None:
    """``A`` for ``apply_chunking_to_forward(self.m, ...)`` where method ``m`` of ``cls`` is only
    ``return self.A(<its argument>)`` (X-MOD's layer: ``feed_forward_chunk`` returns
    ``self.intermediate(x)``). The chunks are slices of the sequence, concatenated back: the value is
    ``A``'s output."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "apply_chunking_to_forward"
        and node.args
        and isinstance(node.args[0], ast.Attribute)
        and isinstance(node.args[0].value, ast.Name)
        and node.args[0].value.id == "self"
    ):
        return None
    method = inspect.getattr_static(cls, node.args[0].attr, None)
    if not inspect.isfunction(method):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method))).body[0]
    except (OSError, TypeError, SyntaxError, IndentationError, IndexError):
        return None
    body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # type: ignore[attr-defined]
    params = [a.arg for a in tree.args.args[1:]]  # type: ignore[attr-defined]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or len(params) != 1:
        return None
    returned = body[0].value
    if (
        self_call_name(returned) is None
        or returned.keywords
        or len(returned.args) != 1  # type: ignore[union-attr]
        or not (isinstance(returned.args[0], ast.Name) and returned.args[0].id == params[0])
    ):  # type: ignore[union-attr]
        return None
    return self_call_name(returned)


def _either_or_calls(function: ast.FunctionDef) -> dict[int, ast.If]:
    """The calls of one child made on either branch of an ``if`` of the function body (BigBird's
    attention: ``out, w = self.self(...)`` as the last statement of both the full- and the
    block-sparse branch), each branch's last statement assigning the same target from ``self.<A>(...)``:
    one call site whichever branch runs. Keyed by the id of each of the two calls."""
    found: dict[int, ast.If] = {}
    for statement in function.body:
        if not (isinstance(statement, ast.If) and statement.body and statement.orelse):
            continue
        ends = [statement.body[-1], statement.orelse[-1]]
        if not all(isinstance(e, ast.Assign) and len(e.targets) == 1 for e in ends):
            continue
        names = {self_call_name(e.value) for e in ends}  # type: ignore[attr-defined]
        if len(names) == 1 and None not in names and ast.dump(ends[0].targets[0]) == ast.dump(ends[1].targets[0]):  # type: ignore[attr-defined]
            found.update({id(e.value): statement for e in ends})  # type: ignore[attr-defined]
    return found


def _bound_once_to(function: ast.FunctionDef, call: ast.Call, cls: type | None = None) -> str | None:
    """The child whose first output alone is ``call``'s first argument: ``x = self.A(...)`` or
    ``x, _ = self.A(...)`` then ``call(x, ...)``, or ``x = self.A(...)`` then ``call(x[0], ...)``, the
    assignment a plain statement of the function body, ``x`` read nowhere else before its next
    assignment (but as ``x[1:]``, the outputs after the first). ``x`` may also be a method of ``cls``
    returning ``self.A(...)`` applied in chunks (:func:`_chunked_child`)."""
    arg = call.args[0] if call.args else None
    first_of = isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant) and arg.slice.value == 0
    name_node = arg.value if first_of else arg  # type: ignore[union-attr]
    if not isinstance(name_node, ast.Name):
        return None
    name = name_node.id
    assigns = sorted((n for n in ast.walk(function) if statement_assigns(n, name)), key=_position)
    before = [a for a in assigns if _position(a) < _position(call) and call not in ast.walk(a)]
    either_or = (
        _either_or_calls(function).get(id(before[-1].value)) if before and isinstance(before[-1], ast.Assign) else None
    )
    if not before or (before[-1] not in function.body and either_or is None) or not isinstance(before[-1], ast.Assign):
        return None
    producing = before[-1]
    # Assigned on both branches of one if: x is read after the if, and by nothing inside it but the call.
    end = _end(either_or) if either_or is not None else _end(producing)
    if either_or is not None and any(
        _position(either_or) <= _position(a) < _position(producing)
        for a in assigns
        if a not in (either_or.body[-1], either_or.orelse[-1])
    ):
        return None
    target = producing.targets[0] if len(producing.targets) == 1 else None
    if isinstance(target, (ast.Tuple, ast.List)) and target.elts and not first_of:
        target = target.elts[0]
    source = self_call_name(producing.value)
    if cls is not None and source is None:
        source = _chunked_child(cls, producing.value)
    if source is None or not (isinstance(target, ast.Name) and target.id == name):
        return None
    later = [a for a in assigns if _position(a) > _position(producing)]
    following = later[0] if later else None
    inside_following = (
        {id(n) for n in ast.walk(following.value)} if following is not None and following.value else set()
    )
    rest = {id(n.value) for n in ast.walk(function) if _is_rest_of(n, name)}  # type: ignore[attr-defined]
    uses = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Load)
        and id(n) not in rest
        and _position(n) > end
        and (following is None or _position(n) < _position(following) or id(n) in inside_following)
    ]
    return source if uses == [name_node] else None


@lru_cache(maxsize=None)
def read_fed_by(parent_cls: type) -> dict[str, str]:
    """Children that ``parent_cls`` (forward and its helper methods) calls, exactly once, on another
    child's output and nothing else reads that output: ``{"output": "self"}`` for BERT's attention
    (``out, w = self.self(h, ...)`` then ``self.output(out, h)``)."""
    found: dict[str, str] = {}
    counts: dict[str, int] = {}
    for tree in forward_and_helpers(parent_cls):
        either_or = _either_or_calls(tree)
        for name, calls in _calls_in(tree).items():
            # Both branches' calls of an either-or are one call site (one runs).
            counts[name] = counts.get(name, 0) + len(calls) - sum(id(c) in either_or for c, _ in calls) // 2
            for call, _ in calls:
                source = _bound_once_to(tree, call, parent_cls)
                if source is not None:
                    found[name] = source
    return {name: source for name, source in found.items() if counts[name] == 1 and counts.get(source) == 1}


@lru_cache(maxsize=None)
def read_sole_reader(block_cls: type) -> str | None:
    """The child that alone reads ``block_cls.forward``'s first argument (``self.dense(hidden_states)``),
    before that argument is reassigned by a plain statement of the body; None otherwise."""
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return None
    assigns = sorted((n for n in ast.walk(tree) if statement_assigns(n, first)), key=_position)
    reassigned = assigns[0] if assigns else None
    if reassigned is not None and reassigned not in tree.body:
        return None
    inside = {id(n) for n in ast.walk(reassigned.value)} if reassigned is not None and reassigned.value else set()
    uses = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Name)
        and n.id == first
        and isinstance(n.ctx, ast.Load)
        and (reassigned is None or _position(n) < _position(reassigned) or id(n) in inside)
    ]
    if len(uses) != 1:
        return None
    for node in ast.walk(tree):
        name = self_call_name(node)
        if name is not None and node.args and node.args[0] is uses[0] and len(node.args) == 1:  # type: ignore[attr-defined]
            return name
    return None


@lru_cache(maxsize=None)
def read_choice_readers(block_cls: type) -> frozenset[str]:
    """Children ``block_cls.forward`` calls on ``x = <other argument> if <cond> else <first argument>``
    (BERT's ``current_states``: the encoder's states for cross-attention, else the block input), ``x``
    assigned once, by a plain statement of the body. Either way they read an input of the block."""
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return frozenset()
    arguments = {a.arg for a in (*tree.args.posonlyargs, *tree.args.args, *tree.args.kwonlyargs)}
    aliases = set()
    for statement in tree.body:
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(statement.value, ast.IfExp)
        ):
            continue
        branches = {b.id for b in (statement.value.body, statement.value.orelse) if isinstance(b, ast.Name)}
        alias = statement.targets[0].id
        if first in branches and len(branches) == 2 and branches <= arguments and alias not in arguments:
            if sum(statement_assigns(n, alias) for n in ast.walk(tree)) == 1:
                aliases.add(alias)
    readers = set()
    for node in ast.walk(tree):
        name = self_call_name(node)
        args = getattr(node, "args", None)
        if name is not None and args and isinstance(args[0], ast.Name) and args[0].id in aliases:
            readers.add(name)
    return frozenset(readers)


@lru_cache(maxsize=None)
def read_reshape_attributes(block_cls: type) -> frozenset[str]:
    """Attributes ``self.X`` that ``block_cls.forward`` passes to ``.view(...)`` / ``.reshape(...)``:
    sizes fixed when the module was built (``context.view(..., self.all_head_size)``), which a split
    by heads would leave at the unsharded value."""
    tree = forward_tree(block_cls)
    if tree is None:
        return frozenset()
    sizes: list[ast.AST] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("view", "reshape")
        ):
            sizes += node.args
    # A shape built beforehand (``shape = x.size()[:-2] + (self.all_head_size,)``): what it was built from.
    names = {n.id for arg in sizes for n in ast.walk(arg) if isinstance(n, ast.Name)}
    sizes += [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(statement_assigns(n, name) for name in names)
    ]
    return frozenset(
        n.attr
        for arg in sizes
        for n in ast.walk(arg)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    )


@lru_cache(maxsize=None)
def read_alike_readers(parent_cls: type, child_name: str, child_cls: type) -> frozenset[str]:
    """Children of ``child_cls`` that its forward calls on any parameter ``parent_cls`` passes the same
    variable as the first (CTRL: ``self.multi_head_attention(normed, normed, normed, ...)`` into
    ``forward(self, v, k, q, ...)``, then ``self.Wq(q)``, ``self.Wk(k)``, ``self.Wv(v)``): they all
    read the block's input. Only parameters the forward never reassigns; empty when unsure."""
    calls = self_calls(parent_cls).get(child_name, [])
    tree = forward_tree(child_cls)
    if len(calls) != 1 or tree is None:
        return frozenset()
    args = calls[0][0].args
    if not args or not isinstance(args[0], ast.Name) or any(isinstance(a, ast.Starred) for a in args):
        return frozenset()
    try:
        params = [p.name for p in list(inspect.signature(child_cls.forward).parameters.values())[1:]]
    except (TypeError, ValueError):
        return frozenset()
    alike = {params[i] for i, a in enumerate(args[: len(params)]) if isinstance(a, ast.Name) and a.id == args[0].id}
    alike = {p for p in alike if not any(statement_assigns(n, p) for n in ast.walk(tree))}
    return frozenset(
        name
        for node in ast.walk(tree)
        if (name := self_call_name(node)) is not None
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in alike  # type: ignore[attr-defined]
    )


@lru_cache(maxsize=None)
def read_fed_from(block_cls: type, child: str, sources: frozenset[str]) -> bool:
    """True when ``block_cls.forward`` calls ``self.<child>`` exactly once, on an expression of
    variables each assigned from a call of one of ``sources`` (Doge's ``dt_proj(value_states
    .transpose(1, 2).reshape(...))``, ``value_states = self.v_proj(...)...``), and of nothing else."""
    tree = forward_tree(block_cls)
    if tree is None:
        return False
    calls = [n for n in ast.walk(tree) if self_call_name(n) == child]
    if len(calls) != 1 or len(calls[0].args) != 1 or calls[0].keywords:  # type: ignore[attr-defined]
        return False
    names = {n.id for n in ast.walk(calls[0].args[0]) if isinstance(n, ast.Name)}  # type: ignore[attr-defined]
    if not names:
        return False
    fed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(self_call_name(n) in sources for n in ast.walk(node.value)):
            fed |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    return names <= fed


@lru_cache(maxsize=None)
def read_rebuilt_child_classes(parent_cls: type, child: str) -> tuple[type, ...]:
    """The module classes a method of ``parent_cls`` other than ``forward`` and ``__init__`` builds
    in a method that assigns ``self.<child> = ...`` (BigBird's ``set_attention_type`` swaps its
    ``self`` between ``BigBirdSelfAttention`` and ``BigBirdBlockSparseAttention``): the child may be
    one of those at a forward, not the one the plan saw. Classes are names of the class's module."""
    from torch import nn

    namespace = vars(sys.modules.get(parent_cls.__module__, None) or object())
    found: list[type] = []
    for name, method in vars(parent_cls).items():
        if name in ("forward", "__init__") or not inspect.isfunction(method):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        assigns_child = any(
            isinstance(t, ast.Attribute) and t.attr == child and isinstance(t.value, ast.Name) and t.value.id == "self"
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
        )
        if not assigns_child:
            continue
        for node in ast.walk(tree):
            built = (
                namespace.get(node.func.id) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            )
            if isinstance(built, type) and issubclass(built, nn.Module) and built not in found:
                found.append(built)
    return tuple(found)


@lru_cache(maxsize=None)
def read_draws_numpy_random(cls: type) -> bool:
    """Whether ``cls``'s source reads ``np.random`` / ``numpy.random`` (BigBird's block-sparse
    attention draws each head's random key blocks from numpy's seeded global stream)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == "random"
        and isinstance(n.value, ast.Name)
        and n.value.id in ("np", "numpy")
        for n in ast.walk(tree)
    )

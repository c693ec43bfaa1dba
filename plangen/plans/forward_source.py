"""What a module's ``forward`` source says about its children: how each is called, what each reads.

The synthesized plans depend on two facts that shapes cannot tell:

* how a decoder layer passes the hidden state to a block (``self.self_attn(hidden_states=...)`` as a
  keyword, ``self.mlp(hidden_states)`` positionally, and how many positional arguments), because
  ``PrepareModuleInput`` must name that argument exactly;
* which of a block's linear layers read the block's own input (q/k/v, gate/up: column-parallel)
  and which read something computed inside it (o_proj, down_proj: row-parallel), because with
  ``hidden == heads x head_dim`` all four attention projections have the same shape.

Both are read from the source (``ast``), not observed by running a model: plans must come from a
meta-device model in milliseconds (``plangen list`` derives ~200), and a real forward of every
architecture would need real weights. Reading is conservative: anything the reader cannot follow
(no source, ``*args``, a block called two different ways) answers ``None`` and the caller falls back
to something that is correct without that fact. The numerical sweep is what proves the result.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class BlockCall:
    """How a parent's forward calls one child: ``positional`` arguments, then keywords.

    ``keyword`` names the argument carrying the hidden state when none is positional. ``outputs``
    is how many values the parent unpacks from the call (``out, _ = self.self_attn(...)``: 2; a
    plain use: 1; None when it cannot be told, e.g. ``self.block(x)[0]``).
    """

    positional: int
    keyword: str | None = None
    outputs: int | None = 1


@lru_cache(maxsize=None)
def _forward_tree(cls: type) -> ast.FunctionDef | None:
    forward = getattr(cls, "forward", None)
    if forward is None:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _first_parameter(cls: type) -> str | None:
    """The name of ``forward``'s first argument after ``self`` (the hidden state, by convention)."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None
    return params[0].name


@lru_cache(maxsize=None)
def _self_calls(cls: type) -> dict[str, list[tuple[ast.Call, ast.AST | None]]]:
    """Every ``self.<name>(...)`` call in ``cls.forward``, by name, with the node around it."""
    tree = _forward_tree(cls)
    calls: dict[str, list[tuple[ast.Call, ast.AST | None]]] = {}
    if tree is None:
        return calls
    for parent in ast.walk(tree):
        for node in ast.iter_child_nodes(parent):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            ):
                calls.setdefault(node.func.attr, []).append((node, parent))
    return calls


@lru_cache(maxsize=None)
def read_block_call(parent_cls: type, child_name: str, child_cls: type) -> BlockCall | None:
    """How ``parent_cls.forward`` calls ``self.<child_name>``; None when it cannot be told for sure."""
    calls = _self_calls(parent_cls).get(child_name)
    if not calls:
        return None
    found: set[BlockCall] = set()
    for call, parent in calls:
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        outputs = _unpacked_outputs(call, parent)
        if call.args:
            found.add(BlockCall(len(call.args), None, outputs))
            continue
        first = _first_parameter(child_cls)
        names = {k.arg for k in call.keywords if k.arg is not None}
        if first is None or first not in names:
            return None
        found.add(BlockCall(0, first, outputs))
    return found.pop() if len(found) == 1 else None


def _unpacked_outputs(call: ast.Call, parent: ast.AST | None) -> int | None:
    if isinstance(parent, ast.Subscript) and parent.value is call:
        return None  # self.block(x)[0]: a tuple of unknown length
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1:
        target = parent.targets[0]
        if isinstance(target, (ast.Tuple, ast.List)):
            if any(isinstance(e, ast.Starred) for e in target.elts):
                return None
            return len(target.elts)
    return 1


def _assigns(statement: ast.AST, name: str) -> bool:
    targets: list[ast.AST] = []
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        targets = [statement.target]
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


@lru_cache(maxsize=None)
def read_input_readers(block_cls: type) -> frozenset[str] | None:
    """Children that ``block_cls.forward`` calls directly on its first argument, before reassigning it.

    ``self.q_proj(hidden_states)`` counts; ``self.o_proj(attn_output)`` and anything after
    ``hidden_states = ...`` (except inside that very statement's right-hand side) do not.
    """
    tree = _forward_tree(block_cls)
    first = _first_parameter(block_cls)
    if tree is None or first is None:
        return None
    reassignments = sorted(
        (n for n in ast.walk(tree) if _assigns(n, first)), key=lambda n: (n.lineno, n.col_offset)
    )
    reassigned = reassignments[0] if reassignments else None
    inside_reassignment = set()
    if reassigned is not None and reassigned.value is not None:
        inside_reassignment = {id(n) for n in ast.walk(reassigned.value)}
    readers: set[str] = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == first
        ):
            continue
        if reassigned is None or node.lineno < reassigned.lineno or id(node) in inside_reassignment:
            readers.add(node.func.attr)
    return frozenset(readers)


def _self_call_name(node: ast.AST | None) -> str | None:
    """``B`` for a ``self.B(...)`` call node, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ):
        return node.func.attr
    return None


@lru_cache(maxsize=None)
def read_applied_to(block_cls: type) -> dict[str, str]:
    """Children that ``block_cls.forward`` applies, every time, straight to another child's output.

    ``self.q_norm(self.q_proj(x))`` gives ``{"q_norm": "q_proj"}``; so does ``q = self.q_proj(x)``
    then ``self.q_norm(q)`` when ``q`` is assigned only there. A child called on anything else, or
    called on outputs of two different children, is left out.
    """
    tree = _forward_tree(block_cls)
    if tree is None:
        return {}
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        assigned.setdefault(name.id, []).append(node)

    def producer(arg: ast.AST) -> str | None:
        if isinstance(arg, ast.Name):
            sources = assigned.get(arg.id, [])
            if len(sources) != 1 or not isinstance(sources[0], ast.Assign) or len(sources[0].targets) != 1:
                return None
            if not isinstance(sources[0].targets[0], ast.Name):
                return None
            arg = sources[0].value
        return _self_call_name(arg)

    found: dict[str, set[str | None]] = {}
    for name, calls in _self_calls(block_cls).items():
        for call, _ in calls:
            arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
            found.setdefault(name, set()).add(producer(arg) if arg is not None else None)
    return {name: next(iter(p)) for name, p in found.items() if len(p) == 1 and None not in p}


@lru_cache(maxsize=None)
def read_modified_in_place(parent_cls: type) -> frozenset[str]:
    """Children whose output ``parent_cls.forward`` modifies in place (``out = self.mlp(x)`` then
    ``out += y``, or ``out.add_(y)``): a view handed out by a style must not be that output."""
    tree = _forward_tree(parent_cls)
    if tree is None:
        return frozenset()
    produced: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, name = node.targets[0], _self_call_name(node.value)
            if name is not None and isinstance(target, ast.Name):
                produced.setdefault(target.id, set()).add(name)
    modified: set[str] = set()
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_")
              and not node.func.attr.startswith("_") and isinstance(node.func.value, ast.Name)):
            target = node.func.value.id
        if target is not None:
            modified |= produced.get(target, set())
    return frozenset(modified)

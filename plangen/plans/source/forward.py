"""What a module's ``forward`` source says about its children: how each is called, what each reads.

The synthesized plans depend on facts that shapes cannot tell:

* how a decoder layer passes the hidden state to a block (``self.self_attn(hidden_states=...)`` as a
  keyword, ``self.mlp(hidden_states)`` positionally, and how many positional arguments), because
  ``PrepareModuleInput`` must name that argument exactly;
* which of a block's linear layers read the block's own input (q/k/v, gate/up: column-parallel)
  and which read something computed inside it (o_proj, down_proj: row-parallel), because with
  ``hidden == heads x head_dim`` all four attention projections have the same shape;
* which children read which one's output (a BART layer's ``fc2`` reads ``fc1``'s through its
  activation), and which module attributes a block shapes its tensors by (``self.num_heads`` in
  OPT's ``view(bsz, -1, self.num_heads, self.head_dim)``, which must become this rank's count).

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
from typing import Any


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


def _parse(function: Any) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _forward_function(cls: type) -> Any:
    """``cls.forward``, or the method it only hands to ``apply_chunking_to_forward`` (XLM's
    ``TransformerFFN.forward`` runs ``self.ff_chunk`` on its input, in chunks or whole): what it computes."""
    forward = getattr(cls, "forward", None)
    tree = _parse(forward) if forward is not None else None
    body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] if tree else []
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "apply_chunking_to_forward"
        and call.args
        and isinstance(call.args[0], ast.Attribute)
        and isinstance(call.args[0].value, ast.Name)
        and call.args[0].value.id == "self"
        and callable(getattr(cls, call.args[0].attr, None))
    ):
        return getattr(cls, call.args[0].attr)
    return forward


@lru_cache(maxsize=None)
def forward_tree(cls: type) -> ast.FunctionDef | None:
    forward = _forward_function(cls)
    return _parse(forward) if forward is not None else None


def first_parameter(cls: type) -> str | None:
    """The name of ``forward``'s first argument after ``self`` (the hidden state, by convention)."""
    try:
        params = list(inspect.signature(_forward_function(cls)).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None
    return params[0].name


@lru_cache(maxsize=None)
def self_calls(cls: type) -> dict[str, list[tuple[ast.Call, ast.AST | None]]]:
    """Every ``self.<name>(...)`` call in ``cls.forward``, by name, with the node around it."""
    tree = forward_tree(cls)
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
    calls = self_calls(parent_cls).get(child_name)
    if not calls:
        return None
    found: set[BlockCall] = set()
    for call, parent in calls:
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        outputs = unpacked_outputs(call, parent)
        if call.args:
            found.add(BlockCall(len(call.args), None, outputs))
            continue
        first = first_parameter(child_cls)
        names = {k.arg for k in call.keywords if k.arg is not None}
        if first is None or first not in names:
            return None
        found.add(BlockCall(0, first, outputs))
    return found.pop() if len(found) == 1 else None


def unpacked_outputs(call: ast.Call, parent: ast.AST | None) -> int | None:
    if isinstance(parent, ast.Subscript) and parent.value is call:
        return None  # self.block(x)[0]: a tuple of unknown length
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1:
        target = parent.targets[0]
        if isinstance(target, (ast.Tuple, ast.List)):
            if any(isinstance(e, ast.Starred) for e in target.elts):
                return None
            return len(target.elts)
    return 1


def statement_assigns(statement: ast.AST, name: str) -> bool:
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
    ``hidden_states = ...`` (except inside that very statement's right-hand side) do not. So does a
    call on a name bound once to the first argument (see :func:`_input_aliases`).
    """
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return None
    inputs = {first, *_input_aliases(tree, first)}
    reassignments = sorted(
        (n for n in ast.walk(tree) if statement_assigns(n, first)), key=lambda n: (n.lineno, n.col_offset)
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
            and node.args[0].id in inputs
        ):
            continue
        if reassigned is None or node.lineno < reassigned.lineno or id(node) in inside_reassignment:
            readers.add(node.func.attr)
    return frozenset(readers)


def read_input_name_readers(block_cls: type) -> frozenset[str] | None:
    """Children that ``block_cls.forward`` calls on the name of its first argument, reassigned or not.

    Looser than :func:`read_input_readers`, for blocks that first mask their input in place of the
    name (``hidden_states = apply_mask_to_padding_states(hidden_states, attention_mask)``, as the
    linear-attention mixers do) and then project it: the projections still read the block input.
    """
    tree = forward_tree(block_cls)
    first = first_parameter(block_cls)
    if tree is None or first is None:
        return None
    return frozenset(
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == first
    )


def _input_aliases(tree: ast.AST, first: str) -> set[str]:
    """Names bound once to the first argument, or to it or another input (cross-attention's
    ``current_states = key_value_states if is_cross_attention else hidden_states``): a projection
    called on one reads the block input whenever the block runs as self-attention."""
    bound: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound.setdefault(name.id, []).append(node)

    def is_first(value: ast.AST) -> bool:
        return isinstance(value, ast.Name) and value.id == first

    aliases = set()
    for name, nodes in bound.items():
        node = nodes[0]
        if name == first or len(nodes) != 1 or not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        if not isinstance(node.targets[0], ast.Name):
            continue
        value = node.value
        if is_first(value) or (isinstance(value, ast.IfExp) and (is_first(value.body) or is_first(value.orelse))):
            aliases.add(name)
    return aliases


_UNKNOWN = "?"


def _argument_chain(expr: ast.AST, chains: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The ``self`` children an expression's value came through, outermost first; ends in ``"?"``
    where it came from anything but one call's first argument (a sum, a tuple, an unknown name)."""
    if isinstance(expr, ast.Name):
        return chains.get(expr.id, (_UNKNOWN,))
    if not isinstance(expr, ast.Call) or not expr.args or any(isinstance(a, ast.Starred) for a in expr.args):
        return (_UNKNOWN,)
    rest = [*expr.args[1:], *(k.value for k in expr.keywords)]
    # Other arguments may be settings (p=self.dropout, training=self.training), never other tensors.
    if any(isinstance(n, ast.Call) or (isinstance(n, ast.Name) and n.id != "self") for r in rest for n in ast.walk(r)):
        return (_UNKNOWN,)
    inner = _argument_chain(expr.args[0], chains)
    name = self_call_name(expr)
    return (name, *inner) if name is not None else inner


def _bound_names(statement: ast.AST) -> set[str]:
    return {
        n.id
        for node in ast.walk(statement)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for n in ast.walk(t)
        if isinstance(n, ast.Name)
    }


@lru_cache(maxsize=None)
def read_argument_chains(parent_cls: type) -> dict[str, tuple[str, ...]]:
    """For each child ``parent_cls.forward`` calls on one argument: the children that argument came
    through, outermost first (``"?"`` where the reader lost track), the same at every call.

    In a BART decoder layer ``x = self.activation_fn(self.fc1(x)); x = dropout(x, p=...);
    self.fc2(x)`` gives ``fc2: ("activation_fn", "fc1", ...)``: ``fc2`` reads ``fc1``'s output
    through a parameter-free activation only. Names bound inside ``if``/``for``/``with`` blocks are
    unknown after them (the branch may not run).
    """
    tree = forward_tree(parent_cls)
    first = first_parameter(parent_cls)
    if tree is None or first is None:
        return {}
    chains: dict[str, tuple[str, ...]] = {first: ()}
    found: dict[str, set[tuple[str, ...]]] = {}

    def record(node: ast.AST) -> None:
        for call in ast.walk(node):
            name = self_call_name(call)
            if name is not None:
                assert isinstance(call, ast.Call)
                chain = _argument_chain(call.args[0], chains) if len(call.args) >= 1 else (_UNKNOWN,)
                found.setdefault(name, set()).add(chain)

    def walk(statements: list[ast.stmt], nested: bool) -> None:
        for statement in statements:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                record(statement.value)
                target = statement.targets[0]
                if isinstance(target, ast.Name):
                    chains[target.id] = _argument_chain(statement.value, chains)
                else:
                    chains.update({n: (_UNKNOWN,) for n in _bound_names(statement)})
                continue
            bodies = [getattr(statement, f, None) for f in ("body", "orelse", "finalbody")]
            bodies = [b for b in bodies if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]
            if not bodies:
                record(statement)
                chains.update({n: (_UNKNOWN,) for n in _bound_names(statement)})
                continue
            for field_name in ("test", "iter", "items"):  # the header of a compound statement
                header = getattr(statement, field_name, None)
                for part in header if isinstance(header, list) else [header]:
                    if isinstance(part, ast.AST):
                        record(part)
            for body in bodies:
                walk(body, True)
            chains.update({n: (_UNKNOWN,) for n in _bound_names(statement)})

    walk(tree.body, False)
    return {name: next(iter(c)) for name, c in found.items() if len(c) == 1}


def read_fed_by(parent_cls: type, child: str) -> str | None:
    """The child whose output ``parent_cls.forward`` hands ``child`` straight, at every call
    (``self.o_proj(self.attn_sub_norm(x))``: ``attn_sub_norm``); None where it is anything else."""
    fed = read_argument_chains(parent_cls).get(child, (_UNKNOWN,))[0]
    return None if fed == _UNKNOWN else fed


@lru_cache(maxsize=None)
def read_added_children(parent_cls: type) -> frozenset[str]:
    """Children whose output ``parent_cls.forward`` adds to another value with ``+`` (BART's
    ``inputs_embeds + positions`` after ``positions = self.embed_positions(...)``): the operand is
    the call, or a name whose latest binding before the sum is the call (``x = x.to(device)``
    rebindings passed over)."""
    tree = forward_tree(parent_cls)
    if tree is None:
        return frozenset()
    bindings: dict[str, list[ast.Assign]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bindings.setdefault(node.targets[0].id, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bindings.setdefault(name.id, []).append(None)  # type: ignore[arg-type]

    def latest(name: str, line: int) -> str | None:
        before = [b for b in bindings.get(name, []) if b is None or b.lineno < line]
        if any(b is None for b in before):
            return None  # also bound by unpacking or augmented assignment: cannot tell
        for binding in sorted(before, key=lambda b: b.lineno, reverse=True):
            value = binding.value
            if _strip_to(value) is not value and isinstance(_strip_to(value), ast.Name) and _strip_to(value).id == name:
                continue  # x = x.to(device)
            return _child_output(value, lambda n: None)
        return None

    added = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for operand in (node.left, node.right):
                child = _child_output(operand, lambda n, line=node.lineno: latest(n, line))
                if child is not None:
                    added.add(child)
    return frozenset(added)


def _strip_to(expr: ast.AST) -> ast.AST:
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "to":
        expr = expr.func.value
    return expr


def _child_output(expr: ast.AST, name_of: Any) -> str | None:
    """The child whose output ``expr`` is: ``self.c(...)``, ``self.c(...).to(...)``, or a name ``name_of`` resolves."""
    expr = _strip_to(expr)
    if isinstance(expr, ast.Name):
        return name_of(expr.id)
    return self_call_name(expr)


def self_call_name(node: ast.AST | None) -> str | None:
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
    tree = forward_tree(block_cls)
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
        return self_call_name(arg)

    found: dict[str, set[str | None]] = {}
    for name, calls in self_calls(block_cls).items():
        for call, _ in calls:
            arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
            found.setdefault(name, set()).add(producer(arg) if arg is not None else None)
    return {name: next(iter(p)) for name, p in found.items() if len(p) == 1 and None not in p}


@lru_cache(maxsize=None)
def read_modified_in_place(parent_cls: type) -> frozenset[str]:
    """Children whose output ``parent_cls.forward`` modifies in place (``out = self.mlp(x)`` then
    ``out += y``, or ``out.add_(y)``): a view handed out by a style must not be that output."""
    tree = forward_tree(parent_cls)
    if tree is None:
        return frozenset()
    produced: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, name = node.targets[0], self_call_name(node.value)
            if name is not None and isinstance(target, ast.Name):
                produced.setdefault(target.id, set()).add(name)
    modified: set[str] = set()
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("_")
            and isinstance(node.func.value, ast.Name)
        ):
            target = node.func.value.id
        if target is not None:
            modified |= produced.get(target, set())
    return frozenset(modified)


@lru_cache(maxsize=None)
def read_returned_child(block_cls: type) -> str | None:
    """The child whose output ``block_cls.forward`` returns as it is (``return self.norm(x)``, every
    return statement alike), called nowhere else; None otherwise."""
    tree = forward_tree(block_cls)
    if tree is None:
        return None
    names = {self_call_name(node.value) for node in ast.walk(tree) if isinstance(node, ast.Return)}
    if len(names) != 1:
        return None
    name = names.pop()
    if name is None or len(self_calls(block_cls).get(name, [])) != 1:
        return None
    return name


def _weight_read_nodes(cls: type, child_name: str) -> list[ast.AST] | None:
    """The nodes of ``cls.forward`` reading ``<...>.<child_name>.weight``'s values: indexed, or
    handed to a function (``F.linear(x, emb.weight)``); its dtype or shape is no read."""
    tree = forward_tree(cls)
    if tree is None:
        return None

    def is_weight(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "weight"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == child_name
        )

    return [
        node
        for node in ast.walk(tree)
        if (isinstance(node, ast.Subscript) and is_weight(node.value))
        or (isinstance(node, ast.Call) and any(is_weight(a) for a in (*node.args, *(k.value for k in node.keywords))))
    ]


def read_weight_row_reads(cls: type, child_name: str) -> bool:
    """Whether every read of ``<...>.<child_name>.weight`` in ``cls.forward`` takes one row of it
    (``weight[pad_token_id, :]``: a first index that is neither a slice nor a list), and there is one:
    what :class:`plangen.styles.tied.EmbeddingRowReadParallel` reads whole from a sharded weight."""
    nodes = _weight_read_nodes(cls, child_name) or []

    def one_row(node: ast.AST) -> bool:
        if not isinstance(node, ast.Subscript):
            return False
        first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) and node.slice.elts else node.slice
        return not isinstance(first, (ast.Slice, ast.List, ast.Tuple, ast.Starred)) and not (
            isinstance(first, ast.Constant) and first.value in (None, Ellipsis)
        )

    return bool(nodes) and all(one_row(node) for node in nodes)


def read_weight_reads(cls: type, child_name: str) -> bool:
    """Whether ``cls.forward`` reads ``<...>.<child_name>.weight`` itself (Gemma 4's multimodal
    model takes the pad token's row of ``language_model.embed_tokens.weight``): a weight read
    outside its module's own forward sees whatever a style made of it."""
    return bool(_weight_read_nodes(cls, child_name))


def read_returned_parameters(block: Any) -> frozenset[int]:
    """Places in the tuple ``block.forward`` returns that hold one of its own parameters in every return
    (GPT-NeoX-Japanese's last attention returns ``self.dense_bias``, which its layer adds to the output)."""
    tree = forward_tree(type(block))
    returns = [node.value for node in ast.walk(tree) if isinstance(node, ast.Return)] if tree is not None else []
    if not returns or not all(isinstance(r, ast.Tuple) for r in returns):
        return frozenset()
    return frozenset.intersection(
        *(
            frozenset(
                i
                for i, e in enumerate(r.elts)
                if isinstance(e, ast.Attribute)
                and isinstance(e.value, ast.Name)
                and e.value.id == "self"
                and block._parameters.get(e.attr) is not None
            )
            for r in returns
        )
    )


def read_added_buffer_reads(module: Any, child: str) -> tuple[str, ...]:
    """Buffers ``module.forward`` indexes and adds to the output of ``self.<child>`` in one sum (CTRL's
    model: ``pos_embeds = self.pos_encoding[position_ids, :]``, then ``inputs_embeds + pos_embeds``,
    ``inputs_embeds = self.w(input_ids)``): a table read outside any module, whose values no style lays out."""
    tree = forward_tree(type(module))
    if tree is None:
        return ()
    bound = [
        (node.targets[0].id, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    ]
    outputs = {name for name, value in bound if self_call_name(value) == child}
    read = {
        name: value.value.attr
        for name, value in bound
        if isinstance(value, ast.Subscript)
        and isinstance(value.value, ast.Attribute)
        and isinstance(value.value.value, ast.Name)
        and value.value.value.id == "self"
        and value.value.attr in module._buffers
    }

    def terms(node: ast.AST) -> set[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return terms(node.left) | terms(node.right)
        return {node.id} if isinstance(node, ast.Name) else set()

    sums = [terms(node) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)]
    return tuple(sorted({read[name] for names in sums if names & outputs for name in names & read.keys()}))

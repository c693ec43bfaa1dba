"""The parsed plan file that level-1 rules inspect, and their base class.

:class:`PlanFile` finds the module-level ``custom_parallel_plan`` (a dict literal, or a function
returning one), its entries, and resolves names through the file's own imports, so ``CP()`` after
``from torch.distributed.tensor.parallel import ColwiseParallel as CP`` and ``tp.ColwiseParallel()``
after ``import torch.distributed.tensor.parallel as tp`` are both known. Nothing here imports torch
or runs the file.
"""

from __future__ import annotations

import builtins
import difflib
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Iterator, Mapping, Sequence, Union

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from plangen.check import known_styles as known
from plangen.check.diagnostics import parse_ignore_comment
from plangen.check.rule import Rule

PLAN_NAME = "custom_parallel_plan"

# (node, or None for "the file"; message): what rules yield; the runner turns nodes into positions.
Finding = tuple[Union[cst.CSTNode, None], str]


@dataclass(frozen=True)
class Resolved:
    """What a name in the plan refers to.

    ``kind``: ``style``, ``placement`` or ``private_placement`` (known to plangen);
    ``unknown_in_known_module`` (imported from torch's TP/DTensor modules or plangen.styles, which are
    fully known, so the name is certainly wrong there); ``undefined`` (neither defined nor
    imported); ``builtin``; ``opaque`` (anything the source alone cannot judge).
    """

    kind: str
    name: str
    module: str = ""


@dataclass(frozen=True)
class Value:
    """The static category of an expression, e.g. ``bool``, ``placement``, ``style_class``."""

    category: str
    resolved: Resolved | None = None

    def describe(self, code: str) -> str:
        name = self.resolved.name if self.resolved else code
        return {
            "none": "None",
            "bool": f"a bool ({code})",
            "int": f"an int ({code})",
            "float": f"a float ({code})",
            "str": f"a str ({code})",
            "bytes": f"bytes ({code})",
            "tuple": "a tuple",
            "dict": "a dict",
            "set": "a set",
            "placement": f"a placement ({code})",
            "private_placement": f"a placement ({code})",
            "style": f"a parallel style ({code})",
            "style_class": f"the class `{name}` itself (call it: `{code}()`)",
            "placement_class": f"the class `{name}` itself (call it: `{code}()`)",
            "builtin_call": f"a call to the builtin `{name}`",
        }.get(self.category, code)


# Node tests by isinstance, not libcst.matchers: importing that module costs more than a whole
# level-1 check (about 0.2 s), and `plangen verify` has a time budget.


def is_name(node: cst.CSTNode, *values: str) -> bool:
    """``node`` is a bare name, one of ``values``."""
    return isinstance(node, cst.Name) and node.value in values


def is_signed(node: cst.CSTNode, kinds: tuple[type[cst.CSTNode], ...]) -> bool:
    """``node`` is a number literal of ``kinds``, with or without a leading ``-`` or ``+``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, kinds)


class _CommentCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.comments: list[cst.Comment] = []

    def visit_Comment(self, node: cst.Comment) -> None:
        self.comments.append(node)


def find_comments(node: cst.CSTNode) -> list[cst.Comment]:
    """Every comment under ``node``, in source order."""
    collector = _CommentCollector()
    node.visit(collector)
    return collector.comments


def suggest(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        close = [c for c in candidates if c.lower() == name.lower()]
    return f"; did you mean `{close[0]}`?" if close else ""


def string_value(node: cst.BaseExpression) -> str | bytes | None:
    """The value of a plain (non-f) string literal, else None."""
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        return node.evaluated_value
    return None


class PlanFile:
    """A parsed plan file: its plan definitions and entries, and its names resolved through its imports.

    Names are resolved from one pass that records every binding in the file, in any scope: a name
    bound only by one import resolves to what it imports; a name bound otherwise (or several ways)
    cannot be judged; a name bound nowhere is undefined. Ignoring scopes only ever makes a name
    unjudgeable, never wrongly undefined. (libcst's QualifiedNameProvider does this per scope, but
    its scope analysis costs two thirds of a check, and level 1 must stay fast.)
    """

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        # Positions are resolved only when a finding needs one: most files are clean.
        self._positions: Mapping[cst.CSTNode, CodeRange] | None = None
        self._values: dict[int, Value] = {}  # classify() by node id: rules ask about the same nodes
        self.assignments: list[cst.BaseExpression] = []  # values assigned to custom_parallel_plan
        self.functions: list[cst.FunctionDef] = []  # def custom_parallel_plan(...)
        self.other_binding = False  # bound some other way (import, for, tuple target...): unjudgeable
        self.star_imports: list[str | None] = []
        self.bindings: dict[str, set[str]] = {}  # name -> {"import:a.b", "other"}
        module.visit(_BindingCollector(self))

    # positions and source text

    def position(self, node: cst.CSTNode | None) -> tuple[int, int]:
        if node is None:
            return 1, 1
        if getattr(node, "lpar", None):  # libcst's range starts inside the parentheses
            node = node.lpar[0]  # type: ignore[attr-defined]
        if self._positions is None:
            self._positions = self.wrapper.resolve(PositionProvider)
        start = self._positions[node].start
        return start.line, start.column + 1

    def code(self, node: cst.CSTNode, limit: int = 40) -> str:
        text = " ".join(self.module.code_for_node(node).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def ignore_comments(self) -> dict[int, frozenset[str]]:
        if "plangen:" not in self.module.code:
            return {}
        ignores: dict[int, frozenset[str]] = {}
        for comment in find_comments(self.module):
            codes = parse_ignore_comment(comment.value)
            if codes is not None:
                ignores[self.position(comment)[0]] = codes
        return ignores

    # the plan's dict literals and entries

    @property
    def is_defined(self) -> bool:
        return bool(self.assignments or self.functions)

    @cached_property
    def plan_values(self) -> list[cst.BaseExpression]:
        """Every expression that becomes the plan: assigned values and returned values."""
        values = list(self.assignments)
        for function in self.functions:
            values += [r.value for r in _returns(function) if r.value is not None]
        return values

    @cached_property
    def dicts(self) -> list[cst.Dict]:
        return [v for v in self.plan_values if isinstance(v, cst.Dict)]

    @cached_property
    def entries(self) -> list[cst.DictElement]:
        return [e for d in self.dicts for e in d.elements if isinstance(e, cst.DictElement)]

    @cached_property
    def style_calls(self) -> list[tuple[cst.Call, known.StyleSpec]]:
        calls = []
        for entry in self.entries:
            value = self.classify(entry.value)
            if value.category == "style" and value.resolved is not None:
                calls.append((entry.value, known.STYLES[value.resolved.name]))
        return calls  # type: ignore[return-value]

    @cached_property
    def style_arguments(self) -> list[tuple[cst.Call, known.StyleSpec, cst.Arg, known.StyleParam]]:
        """Keyword arguments of style calls whose keyword the style has."""
        found = []
        for call, spec in self.style_calls:
            for arg in call.args:
                param = spec.param(arg.keyword.value) if arg.keyword else None
                if param is not None:
                    found.append((call, spec, arg, param))
        return found

    @cached_property
    def value_expressions(self) -> list[cst.BaseExpression]:
        """Entry values and, inside known style and placement calls, the argument values."""
        found: list[cst.BaseExpression] = []
        pending = [e.value for e in self.entries]
        while pending:
            node = pending.pop()
            found.append(node)
            if isinstance(node, (cst.Tuple, cst.List)):
                pending += [e.value for e in node.elements if isinstance(e, cst.Element)]
            elif isinstance(node, cst.Dict):
                pending += [e.value for e in node.elements if isinstance(e, cst.DictElement)]
            elif isinstance(node, cst.Call) and self.classify(node).category in ("style", "placement"):
                pending += [a.value for a in node.args if not a.star]
        return found

    @cached_property
    def placement_calls(self) -> list[tuple[cst.Call, str]]:
        calls = []
        for node in self.value_expressions:
            value = self.classify(node)
            if value.category == "placement" and value.resolved is not None:
                calls.append((node, value.resolved.name))
        return calls  # type: ignore[return-value]

    # name resolution

    def resolve_name(self, node: cst.BaseExpression) -> Resolved:
        dotted = get_full_name_for_node(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if dotted is None:
            return Resolved("opaque", "")
        written = dotted
        head, _, rest = dotted.partition(".")
        bindings = self.bindings.get(head)
        if not bindings:
            if head in _BUILTINS:
                return Resolved("builtin", dotted)
            return self._resolve_unbound(node, written)
        # Bound several ways (``try: import ... except ImportError: import ...``): known only if all agree.
        resolved = {_resolve_binding(binding, rest, written) for binding in bindings}
        return resolved.pop() if len(resolved) == 1 else Resolved("opaque", written)

    def _resolve_unbound(self, node: cst.BaseExpression, written: str) -> Resolved:
        if not isinstance(node, cst.Name):
            return Resolved("opaque", written)
        for module in self.star_imports:
            if module in known.KNOWN_MODULES:
                resolved = _resolve_import(module, node.value)
                if resolved.kind != "unknown_in_known_module":
                    return resolved
        if self.star_imports:  # any star import may define it
            return Resolved("opaque", written)
        return Resolved("undefined", node.value)

    def classify(self, node: cst.BaseExpression) -> Value:
        value = self._values.get(id(node))
        if value is None:
            value = self._values[id(node)] = self._classify(node)
        return value

    def _classify(self, node: cst.BaseExpression) -> Value:
        if is_name(node, "None"):
            return Value("none")
        if is_name(node, "True", "False"):
            return Value("bool")
        if is_signed(node, (cst.Integer,)):
            return Value("int")
        if is_signed(node, (cst.Float, cst.Imaginary)):
            return Value("float")
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
            return Value("bytes" if isinstance(string_value(node), bytes) else "str")
        if isinstance(node, cst.FormattedString):
            return Value("str")
        if isinstance(node, (cst.Tuple, cst.List)):
            return Value("tuple")
        if isinstance(node, cst.Dict):
            return Value("dict")
        if isinstance(node, cst.Set):
            return Value("set")
        if isinstance(node, cst.Call):
            resolved = self.resolve_name(node.func)
            category = {
                "style": "style",
                "placement": "placement",
                "private_placement": "private_placement",
                "builtin": "builtin_call",
                "unknown_in_known_module": "unknown_call",
                "undefined": "undefined",
            }.get(resolved.kind, "unknown")
            return Value(category, resolved)
        if isinstance(node, (cst.Name, cst.Attribute)):
            resolved = self.resolve_name(node)
            category = {
                "style": "style_class",
                "placement": "placement_class",
                "private_placement": "placement_class",
                "undefined": "undefined",
            }.get(resolved.kind, "unknown")
            return Value(category, resolved)
        return Value("unknown")


def _resolve_binding(binding: str, rest: str, written: str) -> Resolved:
    if not binding.startswith("import:"):
        return Resolved("opaque", written)
    module, _, attr = (binding.removeprefix("import:") + (f".{rest}" if rest else "")).rpartition(".")
    if not module:
        return Resolved("opaque", written)
    for alias, target in known.PLACEMENT_MODULE_ALIASES.items():
        if module == alias or module.startswith(alias + "."):
            module = target + module[len(alias) :]
    return _resolve_import(module, attr)


def _resolve_import(module: str, attr: str) -> Resolved:
    style = known.STYLES.get(attr)
    if style is not None and module in style.modules:
        return Resolved("style", attr, module)
    if module in known.PLACEMENT_MODULES.get(attr, ()):
        return Resolved("placement", attr, module)
    if attr in known.PRIVATE_PLACEMENTS and module.startswith("torch.distributed"):
        return Resolved("private_placement", attr, module)
    if module in known.KNOWN_MODULES:
        return Resolved("unknown_in_known_module", attr, module)
    return Resolved("opaque", f"{module}.{attr}")


_BUILTINS = frozenset(dir(builtins))


class _BindingCollector(cst.CSTVisitor):
    """One pass over the file: every name binding (any scope), and the module-level plan."""

    def __init__(self, plan: PlanFile) -> None:
        super().__init__()
        self.plan = plan
        self.depth = 0  # 0 at module level (also inside if/try/with/for there)

    def bind(self, name: str, binding: str = "other") -> None:
        self.plan.bindings.setdefault(name, set()).add(binding)
        if name == PLAN_NAME and self.depth == 0:
            self.plan.other_binding = True

    def bind_target(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.bind(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.bind_target(element.value)
        elif isinstance(target, cst.StarredElement):
            self.bind_target(target.value)

    # scopes

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == PLAN_NAME and self.depth == 0:
            self.plan.functions.append(node)
            self.plan.bindings.setdefault(PLAN_NAME, set()).add("other")
        else:
            self.bind(node.name.value)
        self.depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bind(node.name.value)
        self.depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.depth -= 1

    def visit_Global(self, node: cst.Global) -> None:
        if any(item.name.value == PLAN_NAME for item in node.names):
            self.plan.other_binding = True

    # bindings

    def visit_Param(self, node: cst.Param) -> None:
        self.bind(node.name.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if self.depth == 0 and is_name(target.target, PLAN_NAME):
                self.plan.assignments.append(node.value)
                self.plan.bindings.setdefault(PLAN_NAME, set()).add("other")
            else:
                self.bind_target(target.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is None:  # an annotation alone binds nothing
            return
        if self.depth == 0 and is_name(node.target, PLAN_NAME):
            self.plan.assignments.append(node.value)
            self.plan.bindings.setdefault(PLAN_NAME, set()).add("other")
        else:
            self.bind_target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bind_target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self.bind_target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.bind_target(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:  # with ... as x, except E as x
        self.bind_target(node.name)  # type: ignore[arg-type]

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bind_target(node.target)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self.bind(node.name.value)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self.bind(node.name.value)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self.bind(node.rest.value)

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            if alias.evaluated_alias is not None:
                self.bind(alias.evaluated_alias, f"import:{alias.evaluated_name}")
            else:  # ``import a.b`` binds ``a``
                head = alias.evaluated_name.partition(".")[0]
                self.bind(head, f"import:{head}")
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = None if node.relative or node.module is None else get_full_name_for_node(node.module)
        if isinstance(node.names, cst.ImportStar):
            self.plan.star_imports.append(module)
            return False
        for alias in node.names:
            # A relative import's module is unknown here.
            binding = f"import:{module}.{alias.evaluated_name}" if module else "other"
            self.bind(alias.evaluated_alias or alias.evaluated_name, binding)
        return False


class _ReturnCollector(cst.CSTVisitor):
    """The return and yield statements of one function, not of the functions nested in it."""

    def __init__(self) -> None:
        super().__init__()
        self.returns: list[cst.Return] = []
        self.yields = False
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.depth += 1
        return self.depth == 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.returns.append(node)

    def visit_Yield(self, node: cst.Yield) -> None:
        self.yields = True


def collect_returns(function: cst.FunctionDef) -> _ReturnCollector:
    collector = _ReturnCollector()
    function.visit(collector)
    return collector


def _returns(function: cst.FunctionDef) -> list[cst.Return]:
    return collect_returns(function).returns


# --- rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invalid:
    """An example that must produce the rule's code at (line, col), with ``contains`` in the message."""

    source: str
    line: int
    col: int
    contains: str = ""


class StaticRule(Rule):
    """A level-1 rule: its story (:class:`plangen.check.rule.Rule`), its message template, its check
    of the parsed file, and example files of its own: every ``VALID`` one yields no finding at all,
    every ``INVALID`` one exactly this rule's finding at the given position (the tests run them all)."""

    level = "static"
    message: ClassVar[str]
    VALID: ClassVar[tuple[str, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        raise NotImplementedError


def plan_source(value: str, *imports: str) -> str:
    """A one-entry plan file for examples: the imports, a blank line, then the plan with ``value``.

    Each import is a line of code, or the name of a known style or placement, imported from its
    usual module (names from the same module share one line, in the order given).
    """
    lines: dict[str, list[str]] = {}
    for item in imports:
        style = known.STYLES.get(item)
        module = style.modules[0] if style else known.PLACEMENT_MODULES.get(item, ("",))[0]
        if module:
            lines.setdefault(f"from {module} import", []).append(item)
        else:
            lines[item] = []
    header = "\n".join(f"{line} {', '.join(names)}" if names else line for line, names in lines.items())
    return f'{header}\n\ncustom_parallel_plan = {{"lm_head": {value}}}\n'

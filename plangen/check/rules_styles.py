"""Level-1 rules about styles and their arguments (PG1xx).

Styles and placements are known from :mod:`plangen.check.known_styles`; a value the source cannot
judge (a variable, a helper's result) passes: only what is certain is reported.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator

import libcst as cst

from plangen.check import known_styles as known
from plangen.check.plan_file import (
    DTENSOR_IMPORT,
    TP_IMPORT,
    Finding,
    Invalid,
    PlanFile,
    Resolved,
    Rule,
    is_name,
    plan_source,
    string_value,
    suggest,
)


class UnknownStyleRule(Rule):
    code = "PG101"
    message = "`{name}` is not a parallel style{hint}"
    VALID = (
        plan_source("tp.ColwiseParallel()", "import torch.distributed.tensor.parallel as tp"),
        plan_source("CP()", f"{TP_IMPORT} ColwiseParallel as CP"),
        plan_source("RotaryEmbedParallel()", "RotaryEmbedParallel"),
        plan_source("MyStyle()", "from mypackage import MyStyle"),
        plan_source("make_style()", "def make_style(): ..."),
    )
    INVALID = (
        Invalid(
            plan_source("tp.ColumnwiseParallel()", "import torch.distributed.tensor.parallel as tp"),
            3,
            36,
            "`ColwiseParallel`",
        ),
        Invalid(plan_source("RotaryEmbedParallel()", f"{TP_IMPORT} RotaryEmbedParallel"), 3, 36, "plangen.styles"),
        Invalid(plan_source("parallelize_module()", f"{TP_IMPORT} parallelize_module"), 3, 36),
        Invalid(plan_source("Colwise()", "from plangen.styles import Colwise"), 3, 36, "`ColwiseParallel`"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for entry in plan.entries:
            value = plan.classify(entry.value)
            if value.category == "unknown_call" and isinstance(entry.value, cst.Call) and value.resolved:
                yield entry.value.func, _unknown_style_message(self.message, value.resolved)


def _unknown_style_message(template: str, resolved: Resolved) -> str:
    spec = known.STYLES.get(resolved.name)
    if spec is not None:
        return f"`{resolved.name}` is not in `{resolved.module}`; import it with `{spec.import_hint}`"
    return template.format(name=resolved.name, hint=suggest(resolved.name, list(known.STYLES)))


class UndefinedNameRule(Rule):
    code = "PG102"
    message = "`{name}` is not defined{hint}"
    VALID = (
        plan_source("ColwiseParallel(output_layouts=Replicate())", "ColwiseParallel", "Replicate"),
        plan_source("ColwiseParallel()", f"from torch.distributed.tensor.parallel import *"),
        plan_source("ColwiseParallel()", "from somewhere import *"),
        plan_source("STYLE", "STYLE = None"),
        plan_source("ColwiseParallel(output_layouts=LAYOUT)", "ColwiseParallel", "LAYOUT = None"),
    )
    INVALID = (
        Invalid(
            plan_source("ColwiseParallel()"), 3, 36, "from torch.distributed.tensor.parallel import ColwiseParallel"
        ),
        Invalid(plan_source("ColwiseParalel()"), 3, 36, "did you mean `ColwiseParallel`"),
        Invalid(plan_source("ColwiseParallel(output_layouts=Replicate())", "ColwiseParallel"), 3, 67, "Replicate"),
        Invalid(plan_source("ColwiseParallel(output_layouts=LAYOUT)", "ColwiseParallel"), 3, 67),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for node in plan.value_expressions:
            target = node.func if isinstance(node, cst.Call) else node
            if isinstance(target, cst.Name) and plan.resolve_name(target).kind == "undefined":
                yield target, self.message.format(name=target.value, hint=_import_hint(target.value))


def _import_hint(name: str) -> str:
    if name in known.STYLES:
        return f"; add `{known.STYLES[name].import_hint}`"
    if name in known.PLACEMENT_MODULES:
        return f"; add `{known.placement_import_hint(name)}`"
    return suggest(name, [*known.STYLES, *known.PLACEMENT_MODULES])


class NotAStyleRule(Rule):
    code = "PG103"
    message = "plan values must be parallel styles such as `ColwiseParallel()`, not {what}"
    VALID = (
        plan_source("ColwiseParallel()", "ColwiseParallel"),
        plan_source("STYLES['colwise']", "STYLES = {}"),
        plan_source("make()", "from helpers import make"),
    )
    INVALID = (
        Invalid(plan_source("'colwise'"), 3, 36, "ColwiseParallel()"),
        Invalid(plan_source("'rowwise_rep'"), 3, 36, "RowwiseParallel(input_layouts=Replicate())"),
        Invalid(plan_source("'replicate'"), 3, 36, "`from plangen.styles import LeaveUnsharded`"),
        Invalid(plan_source("'gather'"), 3, 36, "no parallel style can honour"),
        Invalid(plan_source("'colwse'"), 3, 36, "did you mean `colwise`"),
        Invalid(plan_source("ColwiseParallel", "ColwiseParallel"), 3, 36, "call it: `ColwiseParallel()`"),
        Invalid(plan_source("Replicate()", "Replicate"), 3, 36, "a placement"),
        Invalid(plan_source("None"), 3, 36, "None"),
        Invalid(plan_source("dict()"), 3, 36, "builtin"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for entry in plan.entries:
            value = plan.classify(entry.value)
            if value.category not in (
                "none", "bool", "int", "float", "str", "bytes", "tuple", "dict", "set",
                "placement", "private_placement", "style_class", "placement_class", "builtin_call",
            ):  # fmt: skip
                continue
            what = value.describe(plan.code(entry.value))
            text = string_value(entry.value)
            if isinstance(text, str):
                what += _hf_style_hint(text)
            yield entry.value, self.message.format(what=what)


def _hf_style_hint(text: str) -> str:
    equivalent = known.HF_STYLE_EQUIVALENTS.get(text)
    if equivalent is not None:
        style = known.STYLES[equivalent.partition("(")[0]]
        return f", a Hugging Face tp_plan name; write `{equivalent}` (`{style.import_hint}`)"
    if text in known.HF_UNSUPPORTED_STYLES:
        return ", a Hugging Face tp_plan name that no parallel style can honour"
    return suggest(text, [*known.HF_STYLE_EQUIVALENTS, *known.HF_UNSUPPORTED_STYLES])


class UnknownKeywordRule(Rule):
    code = "PG104"
    message = "`{style}` has no keyword `{keyword}`{hint}"
    VALID = (
        plan_source("ColwiseParallel(use_local_output=False, **extra)", "ColwiseParallel"),
        # Bound twice, so not certainly torch's class.
        plan_source("ColwiseParallel(output_layout=None)", "ColwiseParallel", "def f(ColwiseParallel): ..."),
    )
    INVALID = (
        Invalid(plan_source("ColwiseParallel(output_layout=None)", "ColwiseParallel"), 3, 52, "`output_layouts`"),
        Invalid(plan_source("SequenceParallel(seq_dim=1)", "SequenceParallel"), 3, 53, "sequence_dim"),
        Invalid(plan_source("AllReduceParamGrads(x=1)", "AllReduceParamGrads"), 3, 56, "no arguments"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, spec in plan.style_calls:
            names = [p.name for p in spec.params]
            for arg in call.args:
                if arg.keyword is not None and spec.param(arg.keyword.value) is None:
                    hint = suggest(arg.keyword.value, names) or f"; it takes {', '.join(names) or 'no arguments'}"
                    yield arg.keyword, self.message.format(style=spec.name, keyword=arg.keyword.value, hint=hint)


class PositionalArgumentRule(Rule):
    code = "PG105"
    message = "`{style}` takes no positional arguments{keywords}"
    VALID = (plan_source("SequenceParallel(sequence_dim=1, *extra)", "SequenceParallel"),)
    INVALID = (
        Invalid(plan_source("SequenceParallel(1)", "SequenceParallel"), 3, 53, "sequence_dim"),
        Invalid(plan_source("RotaryEmbedParallel(1)", "RotaryEmbedParallel"), 3, 56),
        Invalid(plan_source("LeaveUnsharded(True)", "LeaveUnsharded"), 3, 51, "arguments"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, spec in plan.style_calls:
            for arg in call.args:
                if arg.keyword is None and not arg.star:
                    names = ", ".join(f"{p.name}=" for p in spec.params)
                    keywords = f"; its keywords: {names}" if names else ""
                    yield arg.value, self.message.format(style=spec.name, keywords=keywords)
                    break


class MissingKeywordRule(Rule):
    code = "PG106"
    message = "`{style}` needs `{keyword}=`"
    VALID = (
        plan_source(
            "PrepareModuleOutput(output_layouts=A, desired_output_layouts=B)", "PrepareModuleOutput", "A = B = None"
        ),
        plan_source("PrepareModuleOutput(**layouts)", "PrepareModuleOutput", "layouts = {}"),
    )
    INVALID = (
        Invalid(
            plan_source("PrepareModuleOutput(output_layouts=A)", "PrepareModuleOutput", "A = None"),
            4,
            36,
            "desired_output_layouts",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, spec in plan.style_calls:
            if any(arg.star == "**" for arg in call.args):
                continue
            given = {arg.keyword.value for arg in call.args if arg.keyword is not None}
            for param in spec.params:
                if param.required and param.name not in given:
                    yield call, self.message.format(style=spec.name, keyword=param.name)


class WrongArgumentTypeRule(Rule):
    code = "PG107"
    message = "`{keyword}` of `{style}` expects {expected}, not {what}"
    VALID = (
        plan_source(
            "ColwiseParallel(input_layouts=Shard(1), output_layouts=None, use_local_output=FLAG)",
            "ColwiseParallel",
            "Shard",
            "FLAG = True",
        ),
        plan_source(
            "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=[Replicate(), None])",
            "PrepareModuleInput",
            "Replicate",
            "Shard",
        ),
        plan_source("SequenceParallel(sequence_dim=-1)", "SequenceParallel"),
        plan_source(
            "PrepareModuleInput(input_kwarg_layouts={'x': Shard(1)}, desired_input_kwarg_layouts={'x': Replicate()})",
            "PrepareModuleInput",
            "Replicate",
            "Shard",
        ),
    )
    INVALID = (
        Invalid(plan_source("ColwiseParallel(input_layouts=True)", "ColwiseParallel"), 3, 66, "a bool"),
        Invalid(
            plan_source("ColwiseParallel(use_local_output=Replicate())", "ColwiseParallel", "Replicate"),
            4,
            69,
            "a placement",
        ),
        Invalid(
            plan_source("ColwiseParallel(output_layouts=(Shard(1),))", "ColwiseParallel", "Shard"),
            4,
            67,
            "a single placement",
        ),
        Invalid(
            plan_source("ColwiseParallel(output_layouts=Replicate)", "ColwiseParallel", "Replicate"),
            4,
            67,
            "call it: `Replicate()`",
        ),
        Invalid(plan_source("SequenceParallel(sequence_dim=True)", "SequenceParallel"), 3, 66, "an int"),
        Invalid(plan_source("SequenceParallel(sequence_dim='1')", "SequenceParallel"), 3, 66, "a str"),
        Invalid(
            plan_source(
                "PrepareModuleOutput(output_layouts=(Replicate(), None), desired_output_layouts=(Replicate(), None))",
                "PrepareModuleOutput",
                "Replicate",
            ),
            4,
            129,
            "None",
        ),
        Invalid(
            plan_source(
                "PrepareModuleInput(input_kwarg_layouts={'x': 1}, desired_input_kwarg_layouts=D)",
                "PrepareModuleInput",
                "D = {}",
            ),
            4,
            81,
            "an int",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for _call, spec, arg, param in plan.style_arguments:
            for node, expected in _type_errors(plan, arg.value, param.kind):
                what = plan.classify(node).describe(plan.code(node))
                yield node, self.message.format(keyword=param.name, style=spec.name, expected=expected, what=what)


_PLACEMENT_WORDS = "a placement (Shard(dim), Replicate(), Partial())"
# Categories an argument may have without the source proving it wrong.
_UNJUDGED = ("unknown", "undefined", "unknown_call", "private_placement")


def _type_errors(
    plan: PlanFile, node: cst.BaseExpression, kind: known.ValueKind
) -> Iterator[tuple[cst.BaseExpression, str]]:
    category = plan.classify(node).category
    if category in _UNJUDGED:
        return
    if category == "none":
        if not kind.allows_none:
            yield node, _expected_words(kind)
        return
    if kind.base == "bool":
        if category != "bool":
            yield node, "True or False"
    elif kind.base == "int":
        if category != "int":
            yield node, "an int"
    elif kind.base == "placement_dict":
        if category != "dict":
            yield node, "a dict of keyword name → placement"
            return
        for element in node.elements:  # type: ignore[attr-defined]
            if isinstance(element, cst.DictElement):
                if plan.classify(element.key).category not in ("str", *_UNJUDGED):
                    yield element.key, "str keys (keyword argument names)"
                yield from _type_errors(plan, element.value, known.PLACEMENT)
    elif category == "tuple":
        if not kind.allows_tuple:
            yield node, "a single placement"
            return
        for element in node.elements:  # type: ignore[attr-defined]
            if isinstance(element, cst.Element):
                element_category = plan.classify(element.value).category
                if element_category == "none":
                    if not kind.tuple_allows_none:
                        yield element.value, "placements"
                elif element_category not in ("placement", *_UNJUDGED):
                    yield element.value, "placements"
    elif category != "placement":
        yield node, _expected_words(kind)


def _expected_words(kind: known.ValueKind) -> str:
    return {"bool": "True or False", "int": "an int", "placement_dict": "a dict of keyword name → placement"}.get(
        kind.base, _PLACEMENT_WORDS if not kind.allows_tuple else f"{_PLACEMENT_WORDS} or a tuple of them"
    )


class InvalidPlacementRule(Rule):
    code = "PG108"
    message = "invalid placement: {problem}"
    VALID = (
        plan_source(
            "ColwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(dim=D))", "ColwiseParallel", "Shard", "D = 0"
        ),
        plan_source("RowwiseParallel(output_layouts=Partial('sum'))", "RowwiseParallel", "Partial"),
        plan_source("RowwiseParallel(input_layouts=Partial(reduce_op='avg'))", "RowwiseParallel", "Partial"),
        plan_source("RowwiseParallel(input_layouts=Shard(*dims))", "RowwiseParallel", "Shard", "dims = [0]"),
    )
    INVALID = (
        Invalid(plan_source("RowwiseParallel(input_layouts=Shard('1'))", "RowwiseParallel", "Shard"), 4, 72, "a str"),
        Invalid(
            plan_source(
                "RowwiseParallel(input_layouts=Shard(0.5))",
                "try:\n    from torch.distributed.tensor import Shard\nexcept ImportError:\n"
                f"    from torch.distributed._tensor import Shard\n{TP_IMPORT} RowwiseParallel",
            ),
            7,
            72,
            "a float",
        ),
        Invalid(plan_source("RowwiseParallel(input_layouts=Shard())", "RowwiseParallel", "Shard"), 4, 66, "Shard(0)"),
        Invalid(
            plan_source("RowwiseParallel(input_layouts=Shard(1, 2))", "RowwiseParallel", "Shard"), 4, 66, "one argument"
        ),
        Invalid(
            plan_source("RowwiseParallel(output_layouts=Replicate(0))", "RowwiseParallel", "Replicate"),
            4,
            67,
            "no arguments",
        ),
        Invalid(
            plan_source("RowwiseParallel(output_layouts=Partial('mean'))", "RowwiseParallel", "Partial"),
            4,
            75,
            "'mean'",
        ),
        Invalid(
            plan_source("RowwiseParallel(output_layouts=Partial(1))", "RowwiseParallel", "Partial"), 4, 75, "a str"
        ),
        Invalid(
            plan_source(
                "RowwiseParallel(output_layouts=dt.Shrad(1))",
                "import torch.distributed.tensor as dt",
                "RowwiseParallel",
            ),
            4,
            67,
            "`Shard`",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, name in plan.placement_calls:
            for node, problem in _placement_problems(plan, call, name):
                yield node, self.message.format(problem=problem)
        entry_values = {id(e.value) for e in plan.entries}  # an unknown call there is PG101's
        for node in plan.value_expressions:
            value = plan.classify(node)
            if value.category == "unknown_call" and value.resolved and value.resolved.name not in known.STYLES:
                if id(node) not in entry_values:
                    resolved = value.resolved
                    hint = suggest(resolved.name, list(known.PLACEMENT_MODULES))
                    problem = f"`{resolved.module}` has no placement `{resolved.name}`{hint}"
                    yield node.func, self.message.format(problem=problem)  # type: ignore[attr-defined]


def _placement_problems(plan: PlanFile, call: cst.Call, name: str) -> Iterator[Finding]:
    if any(arg.star for arg in call.args):
        return
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
    parameter = {"Shard": "dim", "Partial": "reduce_op"}.get(name)
    for keyword, arg in keywords.items():
        if keyword != parameter:
            yield arg.keyword, f"`{name}` has no keyword `{keyword}`"
    if parameter is None:
        if positional:
            yield call, "`Replicate()` takes no arguments"
        return
    values = [a.value for a in positional] + ([keywords[parameter].value] if parameter in keywords else [])
    if len(values) > 1:
        yield call, f"`{name}` takes one argument, the {'tensor dim' if name == 'Shard' else 'reduce op'}"
        return
    if name == "Shard":
        if not values:
            yield call, "`Shard` needs the tensor dim, e.g. `Shard(0)`"
        elif plan.classify(values[0]).category not in ("int", *_UNJUDGED):
            what = plan.classify(values[0]).describe(plan.code(values[0]))
            yield values[0], f"the dim of `Shard` must be an int, not {what}"
    elif values:
        category = plan.classify(values[0]).category
        op = string_value(values[0])
        if category == "str" and isinstance(op, str) and op not in known.PARTIAL_REDUCE_OPS:
            yield values[0], f"`Partial` reduce op {op!r} is not one of {', '.join(known.PARTIAL_REDUCE_OPS)}"
        elif category not in ("str", "none", *_UNJUDGED):
            what = plan.classify(values[0]).describe(plan.code(values[0]))
            yield values[0], f"the reduce op of `Partial` must be a str, not {what}"


class PrivatePlacementRule(Rule):
    code = "PG109"
    message = "`{name}` is a private torch placement; use Shard, Replicate or Partial"
    VALID = (plan_source("ColwiseParallel(output_layouts=Shard(0))", "ColwiseParallel", "Shard"),)
    INVALID = (
        Invalid(
            plan_source(
                "ColwiseParallel(output_layouts=_StridedShard(0, split_factor=2))",
                "ColwiseParallel",
                "from torch.distributed.tensor.placement_types import _StridedShard",
            ),
            4,
            67,
            "_StridedShard",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for node in plan.value_expressions:
            value = plan.classify(node)
            if value.category in ("private_placement", "placement_class") and value.resolved:
                if value.resolved.kind == "private_placement":
                    target = node.func if isinstance(node, cst.Call) else node
                    yield target, self.message.format(name=value.resolved.name)


class PartialTargetRule(Rule):
    code = "PG110"
    message = '{problem}: DTensor cannot redistribute to Partial ("for internal use only")'
    VALID = (
        plan_source("ColwiseParallel(input_layouts=Partial())", "ColwiseParallel", "Partial"),
        plan_source("RowwiseParallel(output_layouts=Partial())", "RowwiseParallel", "Partial"),
        plan_source(
            "PrepareModuleInput(input_layouts=(Partial(), None), desired_input_layouts=(Partial(), Partial()))",
            "PrepareModuleInput",
            "Partial",
        ),
    )
    INVALID = (
        Invalid(
            plan_source("ColwiseParallel(output_layouts=Partial())", "ColwiseParallel", "Partial"),
            4,
            67,
            "ColwiseParallel",
        ),
        Invalid(
            plan_source("RowwiseParallel(output_layouts=Partial('avg'))", "RowwiseParallel", "Partial"),
            4,
            67,
            "Partial(sum)",
        ),
        Invalid(
            plan_source("PackedRowwiseParallel(output_layouts=Partial('max'))", f"PackedRowwiseParallel", "Partial"),
            4,
            73,
            "Partial(sum)",
        ),
        Invalid(
            plan_source(
                "PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Partial())",
                "PrepareModuleInput",
                "Partial",
                "Shard",
            ),
            4,
            101,
            "Shard(1)",
        ),
        Invalid(
            plan_source(
                "PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Partial(),))",
                "PrepareModuleOutput",
                "Partial",
                "Replicate",
            ),
            4,
            111,
            "Replicate()",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, spec in plan.style_calls:
            args = _keyword_values(call)
            produced = known.PRODUCED_OUTPUT.get(spec.name)
            if produced is not None and "output_layouts" in args:
                target = _placement_literal(plan, args["output_layouts"])
                if target and target.startswith("Partial") and target != produced:
                    problem = f"`{spec.name}` produces {produced}, so output_layouts cannot be {target}"
                    yield args["output_layouts"], self.message.format(problem=problem)
            for source, desired in _LAYOUT_PAIRS:
                if source in args and desired in args:
                    yield from self._check_pairs(plan, args[source], args[desired], source)

    def _check_pairs(
        self, plan: PlanFile, source: cst.BaseExpression, desired: cst.BaseExpression, source_name: str
    ) -> Iterator[Finding]:
        for key, desired_node in _layout_items(desired).items():
            source_node = _layout_items(source).get(key)
            if source_node is None:
                continue
            wanted = _placement_literal(plan, desired_node)
            have = _placement_literal(plan, source_node)
            if wanted and wanted.startswith("Partial") and have and have != wanted:
                problem = f"{source_name} gives {have} here, which cannot become {wanted}"
                yield desired_node, self.message.format(problem=problem)


_LAYOUT_PAIRS = (
    ("input_layouts", "desired_input_layouts"),
    ("input_kwarg_layouts", "desired_input_kwarg_layouts"),
    ("output_layouts", "desired_output_layouts"),
)


def _keyword_values(call: cst.Call) -> dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in call.args if a.keyword is not None}


def _layout_items(node: cst.BaseExpression) -> dict[Any, cst.BaseExpression]:
    """Index or keyword → layout for a tuple/list, dict or single layout; {} when unknowable."""
    if isinstance(node, (cst.Tuple, cst.List)):
        if any(not isinstance(e, cst.Element) for e in node.elements):
            return {}
        return {i: e.value for i, e in enumerate(node.elements)}
    if isinstance(node, cst.Dict):
        items = {}
        for element in node.elements:
            key = string_value(element.key) if isinstance(element, cst.DictElement) else None
            if not isinstance(key, str):
                return {}
            items[key] = element.value  # type: ignore[union-attr]
        return items
    return {0: node}


def _layout_count(plan: PlanFile, node: cst.BaseExpression) -> int | None:
    if isinstance(node, (cst.Tuple, cst.List, cst.Dict)):
        return len(_layout_items(node)) if _layout_items(node) or not node.elements else None
    return 1 if plan.classify(node).category == "placement" else None


def _placement_literal(plan: PlanFile, node: cst.BaseExpression) -> str | None:
    """A canonical text for a placement written with literal arguments, e.g. ``Partial(sum)``."""
    value = plan.classify(node)
    if value.category != "placement" or value.resolved is None or not isinstance(node, cst.Call):
        return None
    if any(a.star for a in node.args):
        return None
    args = [a.value for a in node.args]
    name = value.resolved.name
    if name == "Replicate":
        return "Replicate()" if not args else None
    if name == "Partial":
        op = string_value(args[0]) if args else "sum"
        if args and is_name(args[0], "None"):
            op = "sum"
        known_op = isinstance(op, str) and op in known.PARTIAL_REDUCE_OPS
        return f"Partial({op})" if known_op and len(args) <= 1 else None
    if len(args) == 1 and isinstance(args[0], (cst.Integer, cst.UnaryOperation)):
        try:
            return f"Shard({ast.literal_eval(plan.code(args[0], limit=1000))})"
        except (ValueError, SyntaxError):
            return None
    return None


class LayoutCountRule(Rule):
    code = "PG111"
    message = "{problem}: `{style}` pairs each layout with a desired one"
    VALID = (
        plan_source(
            "PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=(Replicate(),))",
            "PrepareModuleInput",
            "Replicate",
            "Shard",
        ),
        plan_source(
            "PrepareModuleInput(input_layouts=LAYOUTS, desired_input_layouts=(Replicate(),))",
            "PrepareModuleInput",
            "Replicate",
            "LAYOUTS = ()",
        ),
        plan_source("PrepareModuleInput(desired_input_layouts=Replicate())", "PrepareModuleInput", "Replicate"),
        plan_source("PrepareModuleInput(input_layouts=None)", "PrepareModuleInput"),
    )
    INVALID = (
        Invalid(
            plan_source(
                "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(),))",
                "PrepareModuleInput",
                "Replicate",
                "Shard",
            ),
            4,
            109,
            "2 input_layouts",
        ),
        Invalid(
            plan_source("PrepareModuleInput(input_layouts=Shard(1))", "PrepareModuleInput", "Shard"),
            4,
            55,
            "desired_input_layouts",
        ),
        Invalid(
            plan_source("PrepareModuleInput(input_kwarg_layouts={'x': Shard(1)})", "PrepareModuleInput", "Shard"),
            4,
            55,
            "desired_input_kwarg_layouts",
        ),
        Invalid(
            plan_source(
                "PrepareModuleOutput(output_layouts=(Shard(1), Shard(1)), desired_output_layouts=Shard(1))",
                "PrepareModuleOutput",
                "Shard",
            ),
            4,
            116,
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for call, spec in plan.style_calls:
            args = _keyword_values(call)
            keywords = {a.keyword.value: a.keyword for a in call.args if a.keyword is not None}
            for source, desired in _LAYOUT_PAIRS:
                if spec.param(desired) is None or source not in args or plan.classify(args[source]).category == "none":
                    continue
                desired_given = desired in args and plan.classify(args[desired]).category != "none"
                if not desired_given and source == "input_layouts":
                    problem = f"`{source}` without `{desired}`"
                    yield keywords[source], self.message.format(problem=problem, style=spec.name)
                    continue
                if not desired_given and source == "output_layouts":  # both required: PG106, PG107
                    continue
                have = _layout_count(plan, args[source])
                want = _layout_count(plan, args[desired]) if desired_given else 0
                if have is not None and want is not None and have != want:
                    problem = f"{have} {source} but {want} {desired}"
                    node = args[desired] if desired_given else keywords[source]
                    yield node, self.message.format(problem=problem, style=spec.name)


STYLE_RULES: tuple[Rule, ...] = (
    UnknownStyleRule(),
    UndefinedNameRule(),
    NotAStyleRule(),
    UnknownKeywordRule(),
    PositionalArgumentRule(),
    MissingKeywordRule(),
    WrongArgumentTypeRule(),
    InvalidPlacementRule(),
    PrivatePlacementRule(),
    PartialTargetRule(),
    LayoutCountRule(),
)

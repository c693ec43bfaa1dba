"""Level-1 rules about the placements in style arguments (PG108-PG111): placements written
right, no private ones, no redistribution to Partial, and layouts paired with desired ones.

As in :mod:`plangen.check.rules.static.styles`, a value the source cannot judge passes, and each rule
carries its story beside its check.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator

import libcst as cst

from plangen.check import known_styles as known
from plangen.check.plan_file import (
    Finding,
    Invalid,
    PlanFile,
    StaticRule,
    is_name,
    plan_source,
    string_value,
    suggest,
)
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT
from plangen.check.rules.static.styles import UNJUDGED


class InvalidPlacementRule(StaticRule):
    code = "PG108"
    title = "invalid placement"
    explanation = (
        "Placements are `Shard(dim)` with an int dim, `Replicate()`, and `Partial()` or"
        ' `Partial("sum" | "avg" | "min" | "max" | "product")`.'
    )
    wrong = (
        f"{TP_IMPORT} RowwiseParallel\n{DTENSOR_IMPORT} Shard\n"
        'custom_parallel_plan = {"model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard("1"))}'
    )
    right = (
        f"{TP_IMPORT} RowwiseParallel\n{DTENSOR_IMPORT} Shard\n"
        'custom_parallel_plan = {"model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard(1))}'
    )
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
        elif plan.classify(values[0]).category not in ("int", *UNJUDGED):
            what = plan.classify(values[0]).describe(plan.code(values[0]))
            yield values[0], f"the dim of `Shard` must be an int, not {what}"
    elif values:
        category = plan.classify(values[0]).category
        op = string_value(values[0])
        if category == "str" and isinstance(op, str) and op not in known.PARTIAL_REDUCE_OPS:
            yield values[0], f"`Partial` reduce op {op!r} is not one of {', '.join(known.PARTIAL_REDUCE_OPS)}"
        elif category not in ("str", "none", *UNJUDGED):
            what = plan.classify(values[0]).describe(plan.code(values[0]))
            yield values[0], f"the reduce op of `Partial` must be a str, not {what}"


class PrivatePlacementRule(StaticRule):
    code = "PG109"
    title = "private placement"
    explanation = (
        "Placements whose names start with an underscore (`_StridedShard`, `_MaskPartial`) are torch"
        " internals that change between releases; use Shard, Replicate or Partial."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\nfrom torch.distributed.tensor.placement_types import _StridedShard\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=_StridedShard(0, split_factor=2))}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Shard\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Shard(0))}'
    )
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


class PartialTargetRule(StaticRule):
    code = "PG110"
    title = "redistribution to Partial"
    explanation = (
        'DTensor refuses to redistribute to a Partial placement (torch 2.11-2.14: "redistributing to'
        ' Partial is for internal use only"; 2.15 allows Shard to Partial("sum") alone): a desired or'
        " output layout can be Partial only where the tensor is already in that same Partial state"
        ' (RowwiseParallel\'s output is Partial("sum")), on every torch plangen supports.'
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Partial\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Partial())}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )
    message = (
        "{problem}: DTensor cannot redistribute to Partial (torch 2.11-2.14 refuse it; 2.15 only Shard to Partial(sum))"
    )
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
            plan_source("PackedRowwiseParallel(output_layouts=Partial('max'))", "PackedRowwiseParallel", "Partial"),
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


class LayoutCountRule(StaticRule):
    code = "PG111"
    title = "layout count mismatch"
    explanation = (
        "PrepareModuleInput/Output pair each layout with a desired layout: both must be given, with"
        " as many entries (torch raises AssertionError otherwise)."
    )
    wrong = (
        f"{TP_IMPORT} PrepareModuleInput\n{DTENSOR_IMPORT} Replicate, Shard\n"
        'custom_parallel_plan = {\n    "model.layers.*.self_attn": PrepareModuleInput(\n'
        "        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(),)\n    ),\n}"
    )
    right = (
        f"{TP_IMPORT} PrepareModuleInput\n{DTENSOR_IMPORT} Replicate, Shard\n"
        'custom_parallel_plan = {\n    "model.layers.*.self_attn": PrepareModuleInput(\n'
        "        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)\n    ),\n}"
    )
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

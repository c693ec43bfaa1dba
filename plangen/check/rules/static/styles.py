"""Level-1 rules about styles and how they are called (PG101-PG107): known styles, defined names,
values that are styles, keyword arguments that exist, are given by keyword and are complete, and
argument values of the types the style's parameters take.

Styles and placements are known from :mod:`plangen.check.known_styles`; a value the source cannot
judge (a variable, a helper's result) passes: only what is certain is reported. Each rule carries
its story (title, explanation, wrong and right files) beside its check. The placements written in
the arguments are judged in :mod:`plangen.check.rules.static.placements`.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from plangen.check import known_styles as known
from plangen.check.plan_file import (
    Finding,
    Invalid,
    PlanFile,
    Resolved,
    StaticRule,
    plan_source,
    string_value,
    suggest,
)
from plangen.check.rule import DTENSOR_IMPORT, TP_IMPORT


class UnknownStyleRule(StaticRule):
    code = "PG101"
    title = "unknown parallel style"
    explanation = (
        "The value calls something that is not a known parallel style, or imports a style from a"
        " module that does not define it. Known: torch's "
        + ", ".join(f"`{s.name}`" for s in known.STYLES.values() if known.TORCH_PARALLEL in s.modules)
        + " (`torch.distributed.tensor.parallel`); plangen's "
        + ", ".join(f"`{s.name}`" for s in known.STYLES.values() if known.TORCH_PARALLEL not in s.modules)
        + " (`plangen.styles`)."
    )
    wrong = (
        'import torch.distributed.tensor.parallel as tp\ncustom_parallel_plan = {"lm_head": tp.ColumnwiseParallel()}'
    )
    right = 'import torch.distributed.tensor.parallel as tp\ncustom_parallel_plan = {"lm_head": tp.ColwiseParallel()}'
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


class UndefinedNameRule(StaticRule):
    code = "PG102"
    title = "undefined name"
    explanation = "The name is neither defined nor imported in the file, so evaluating the plan raises NameError."
    wrong = 'custom_parallel_plan = {"lm_head": ColwiseParallel()}'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    message = "`{name}` is not defined{hint}"
    VALID = (
        plan_source("ColwiseParallel(output_layouts=Replicate())", "ColwiseParallel", "Replicate"),
        plan_source("ColwiseParallel()", "from torch.distributed.tensor.parallel import *"),
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


class NotAStyleRule(StaticRule):
    code = "PG103"
    title = "value is not a parallel style"
    explanation = (
        "Each value must be a ParallelStyle object such as `ColwiseParallel()`. Strings like"
        ' `"colwise"` are Hugging Face `tp_plan` names, not styles; a class must be called.'
    )
    wrong = 'custom_parallel_plan = {"lm_head": "colwise"}'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
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


class UnknownKeywordRule(StaticRule):
    code = "PG104"
    title = "unknown keyword argument"
    explanation = "The style has no parameter of that name; the constructor would raise TypeError."
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layout=Replicate())}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )
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


class PositionalArgumentRule(StaticRule):
    code = "PG105"
    title = "positional argument"
    explanation = "Parallel styles take keyword-only arguments; a positional argument raises TypeError."
    wrong = f'{TP_IMPORT} SequenceParallel\ncustom_parallel_plan = {{"model.norm": SequenceParallel(1)}}'
    right = f'{TP_IMPORT} SequenceParallel\ncustom_parallel_plan = {{"model.norm": SequenceParallel(sequence_dim=1)}}'
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


class MissingKeywordRule(StaticRule):
    code = "PG106"
    title = "missing required keyword argument"
    explanation = "The style has a parameter without a default that the call does not pass."
    wrong = (
        f"{TP_IMPORT} PrepareModuleOutput\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"model.norm": PrepareModuleOutput(output_layouts=Replicate())}'
    )
    right = (
        f"{TP_IMPORT} PrepareModuleOutput\n{DTENSOR_IMPORT} Replicate, Shard\n"
        'custom_parallel_plan = {\n    "model.norm": PrepareModuleOutput(\n'
        "        output_layouts=Replicate(), desired_output_layouts=Shard(1)\n    ),\n}"
    )
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


class WrongArgumentTypeRule(StaticRule):
    code = "PG107"
    title = "wrong argument type"
    explanation = (
        "The value has a type the parameter does not accept: a bool or a number where a placement is"
        " expected, a placement where a bool is expected, a tuple where a single placement is"
        " expected, a placement class that is not called."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=True)}'
    )
    right = (
        f"{TP_IMPORT} ColwiseParallel\n{DTENSOR_IMPORT} Replicate\n"
        'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}'
    )
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
UNJUDGED = ("unknown", "undefined", "unknown_call", "private_placement")


def _type_errors(
    plan: PlanFile, node: cst.BaseExpression, kind: known.ValueKind
) -> Iterator[tuple[cst.BaseExpression, str]]:
    category = plan.classify(node).category
    if category in UNJUDGED:
        return
    if category == "none":
        if not kind.allows_none:
            yield node, _expected_words(kind)
        return
    if kind.base in ("int", "str") and kind.allows_tuple:
        words = _expected_words(kind)
        if category != "tuple":
            yield node, words
            return
        for element in node.elements:  # type: ignore[attr-defined]
            if isinstance(element, cst.Element) and plan.classify(element.value).category not in (kind.base, *UNJUDGED):
                yield element.value, words
        return
    if kind.base == "bool":
        if category != "bool":
            yield node, "True or False"
    elif kind.base == "int":
        if category != "int":
            yield node, "an int"
    elif kind.base == "str":
        if category != "str":
            yield node, "a str"
    elif kind.base == "placement_dict":
        if category != "dict":
            yield node, "a dict of keyword name → placement"
            return
        for element in node.elements:  # type: ignore[attr-defined]
            if isinstance(element, cst.DictElement):
                if plan.classify(element.key).category not in ("str", *UNJUDGED):
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
                elif element_category not in ("placement", *UNJUDGED):
                    yield element.value, "placements"
    elif category != "placement":
        yield node, _expected_words(kind)


def _expected_words(kind: known.ValueKind) -> str:
    if kind.allows_tuple and kind.base in ("int", "str"):
        return f"a tuple of {kind.base}s"
    return {
        "bool": "True or False",
        "int": "an int",
        "str": "a str",
        "placement_dict": "a dict of keyword name → placement",
    }.get(kind.base, _PLACEMENT_WORDS if not kind.allows_tuple else f"{_PLACEMENT_WORDS} or a tuple of them")


class HalfTiedPairRule(StaticRule):
    code = "PG112"
    title = "half of a tied pair"
    explanation = (
        "`TiedEmbeddingParallel` (on the input embedding) and `TiedHeadParallel` (on the output head) keep a"
        " tied weight one parameter only together: whichever is applied first shards the weight, the other"
        " takes the same parameter. One without the other leaves two parameters under a runtime that does"
        " not re-tie them (NeMo RL's `_parallelize_model`), which then trains two copies. Give the other end"
        " its tied style, or use `RowwiseParallel` / `ColwiseParallel` at both ends."
    )
    wrong = (
        f"{DTENSOR_IMPORT} Replicate\n{TP_IMPORT} ColwiseParallel\n\nfrom plangen.styles import TiedEmbeddingParallel\n\n"
        "custom_parallel_plan = {\n"
        '    "model.embed_tokens": TiedEmbeddingParallel(input_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}'
    )
    right = (
        f"{DTENSOR_IMPORT} Replicate\n\nfrom plangen.styles import TiedEmbeddingParallel, TiedHeadParallel\n\n"
        "custom_parallel_plan = {\n"
        '    "model.embed_tokens": TiedEmbeddingParallel(input_layouts=Replicate()),\n'
        '    "lm_head": TiedHeadParallel(output_layouts=Replicate()),\n}'
    )
    message = (
        "`{name}` without `{partner}` in the same plan: the tied weight becomes two parameters under a runtime"
        " that does not re-tie (NeMo RL); give the other end `{partner}(...)`"
    )
    VALID = (
        "from plangen.styles import TiedEmbeddingParallel, TiedHeadParallel\n\n"
        'custom_parallel_plan = {"model.embed_tokens": TiedEmbeddingParallel(), "lm_head": TiedHeadParallel()}\n',
        plan_source("ColwiseParallel()", "ColwiseParallel"),
    )
    INVALID = (
        Invalid(plan_source("TiedHeadParallel()", "TiedHeadParallel"), 3, 36, "`TiedEmbeddingParallel`"),
        Invalid(plan_source("TiedEmbeddingParallel()", "TiedEmbeddingParallel"), 3, 36, "`TiedHeadParallel`"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        from plangen.plan.style_table import STYLE_FACTS

        for plan_dict in plan.dicts:
            calls = [
                (e.value, plan.classify(e.value).resolved) for e in plan_dict.elements if isinstance(e, cst.DictElement)
            ]
            named = {r.name for value, r in calls if r is not None and plan.classify(value).category == "style"}
            for value, resolved in calls:
                facts = STYLE_FACTS.get(resolved.name) if resolved is not None else None
                partner = facts.tied_partner if facts is not None else None
                if partner is not None and plan.classify(value).category == "style" and partner not in named:
                    yield value, self.message.format(name=resolved.name, partner=partner)

"""Level-1 rules about the file's structure (PG0xx): it parses, defines ``custom_parallel_plan``
as a dict (or a function returning one), and its keys are distinct strings. Each rule carries its
story (title, explanation, wrong and right files) beside its check."""

from __future__ import annotations

import ast
import warnings
from typing import Iterator

import libcst as cst

from plangen.check.diagnostics import Diagnostic
from plangen.check.plan_file import (
    Finding,
    Invalid,
    PlanFile,
    StaticRule,
    collect_returns,
    is_name,
    string_value,
)
from plangen.check.rule import TP_IMPORT
from plangen.model.module_tree import LORA_PARTS
from plangen.plan.targets import DEFAULT_TARGET, TARGETS  # torch-free

_NOT_A_DICT_NODES = (
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.FormattedString,
    cst.List,
    cst.Tuple,
    cst.Set,
    cst.ListComp,
    cst.SetComp,
    cst.GeneratorExp,
    cst.Ellipsis,
)


def _not_a_dict(node: cst.BaseExpression) -> bool:
    return isinstance(node, _NOT_A_DICT_NODES) or is_name(node, "None", "True", "False")


class SyntaxErrorRule(StaticRule):
    """Not run on a tree: :func:`check_syntax` runs it before parsing with libcst."""

    code = "PG001"
    title = "syntax error"
    explanation = "The file is not valid Python; nothing else can be checked until it parses."
    wrong = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel(}}'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    message = "syntax error: {error}"
    VALID = ("custom_parallel_plan = (\n    {}\n)\n",)
    INVALID = (
        Invalid("custom_parallel_plan = {\n    'a': ColwiseParallel(,\n}\n", 3, 1, "does not match"),
        Invalid("x = (\n", 1, 5, "was never closed"),
        Invalid("f(a=1, a=2)\n", 1, 8, "keyword argument repeated"),
        Invalid("return 5\n", 1, 1, "'return' outside function"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        return iter(())


def check_syntax(source: str, path: str) -> Diagnostic | None:
    """Compile (never run) the source so that errors carry Python's own message and position."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for "\d"; not our business
            compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        message = SyntaxErrorRule.message.format(error=error.msg)
        line, col = error.lineno or 1, error.offset or 1
        return Diagnostic(path, line, col, SyntaxErrorRule.code, message, SyntaxErrorRule.severity)
    except ValueError as error:  # null bytes
        message = SyntaxErrorRule.message.format(error=error)
        return Diagnostic(path, 1, 1, SyntaxErrorRule.code, message, SyntaxErrorRule.severity)
    return None


class MissingPlanRule(StaticRule):
    code = "PG002"
    title = "no custom_parallel_plan"
    explanation = (
        "A plan file defines `custom_parallel_plan` at module level: a dict literal, or a function"
        " without required arguments that returns one."
    )
    wrong = f'{TP_IMPORT} ColwiseParallel\nplan = {{"lm_head": ColwiseParallel()}}'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    message = "no module-level `custom_parallel_plan`: assign a dict or define a function returning one"
    VALID = (
        "custom_parallel_plan = {}\n",
        "custom_parallel_plan: dict = {}\n",
        "def custom_parallel_plan():\n    return {}\n",
        "if True:\n    custom_parallel_plan = {}\n",
        "from elsewhere import custom_parallel_plan\n",
        "from elsewhere import *\n",
    )
    INVALID = (
        Invalid("plan = {}\n", 1, 1),
        Invalid("custom_parallel_plan: dict\n", 1, 1),
        Invalid("def f():\n    custom_parallel_plan = {}\n", 1, 1),
        Invalid("class C:\n    custom_parallel_plan = {}\n", 1, 1),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        if not plan.is_defined and not plan.other_binding and not plan.star_imports:
            yield None, self.message


class PlanFunctionArgumentsRule(StaticRule):
    code = "PG003"
    title = "plan function takes required arguments"
    explanation = "`custom_parallel_plan()` is called without arguments, so every parameter needs a default."
    wrong = f'{TP_IMPORT} ColwiseParallel\n\n\ndef custom_parallel_plan(model):\n    return {{"lm_head": ColwiseParallel()}}'
    right = f'{TP_IMPORT} ColwiseParallel\n\n\ndef custom_parallel_plan():\n    return {{"lm_head": ColwiseParallel()}}'
    message = "`custom_parallel_plan()` is called without arguments, but `{name}` has no default"
    VALID = (
        "def custom_parallel_plan(model=None, *args, **kwargs):\n    return {}\n",
        "def custom_parallel_plan(*, tp_size=2):\n    return {}\n",
    )
    INVALID = (
        Invalid("def custom_parallel_plan(model):\n    return {}\n", 1, 26, "`model`"),
        Invalid("def custom_parallel_plan(a=1, *, tp_size):\n    return {}\n", 1, 34, "`tp_size`"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for function in plan.functions:
            params = function.params
            for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                if param.default is None:
                    yield param.name, self.message.format(name=param.name.value)
                    break


class PlanNotADictRule(StaticRule):
    code = "PG004"
    title = "plan is not a dict"
    explanation = (
        "`custom_parallel_plan` must be (or return) a dict from module patterns to styles; this"
        " value is certainly something else."
    )
    wrong = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = [("lm_head", ColwiseParallel())]'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    message = "`custom_parallel_plan` must be a dict of pattern → style, not {what}"
    VALID = (
        "custom_parallel_plan = {}\n",
        "custom_parallel_plan = dict(lm_head=None)\n",
        "custom_parallel_plan = build()\n",
        "def custom_parallel_plan():\n    plan = {}\n    return plan\n",
        "def custom_parallel_plan():\n    def inner():\n        return 1\n    return {}\n",
    )
    INVALID = (
        Invalid("custom_parallel_plan = [('lm_head', None)]\n", 1, 24, "a list"),
        Invalid("custom_parallel_plan = None\n", 1, 24, "None"),
        Invalid("def custom_parallel_plan():\n    return ()\n", 2, 12, "a tuple"),
        Invalid("def custom_parallel_plan():\n    plan = {}\n", 1, 5, "returns None"),
        Invalid("def custom_parallel_plan():\n    yield {}\n", 1, 5, "generator"),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for value in plan.assignments:
            if _not_a_dict(value):
                yield value, self.message.format(what=_describe_literal(value))
        for function in plan.functions:
            collected = collect_returns(function)
            if collected.yields:
                yield function.name, self.message.format(what="a generator: `custom_parallel_plan()` uses yield")
            elif not any(r.value is not None for r in collected.returns):
                yield function.name, self.message.format(what="None: `custom_parallel_plan()` returns None")
            for ret in collected.returns:
                if ret.value is not None and _not_a_dict(ret.value):
                    yield ret.value, self.message.format(what=_describe_literal(ret.value))


def _describe_literal(node: cst.BaseExpression) -> str:
    if is_name(node, "None"):
        return "None"
    kind = type(node).__name__
    names = {"List": "a list", "Tuple": "a tuple", "Set": "a set", "ListComp": "a list", "SetComp": "a set"}
    return names.get(kind, f"a {kind.lower()} literal")


class KeyNotAStringRule(StaticRule):
    code = "PG005"
    title = "key is not a string"
    explanation = (
        'Keys are module name patterns such as `"model.layers.*.mlp.up_proj"`; a number, tuple or'
        " bytes key can never match a module."
    )
    wrong = f"{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{0: ColwiseParallel()}}"
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{"model.layers.0.mlp.up_proj": ColwiseParallel()}}'
    message = "plan keys are module name patterns (str), not {what}"
    VALID = (
        f"{TP_IMPORT} ColwiseParallel as C\nPATTERN, BASE = 'b', {{}}\n"
        "custom_parallel_plan = {'a': C(), f'layers.{0}.mlp': C(), PATTERN: C(), **BASE}\n",
        f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{'model.' 'norm': C()}}\n",
    )
    INVALID = (
        Invalid(f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{\n    0: C(),\n}}\n", 3, 5, "an int"),
        Invalid(f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{('a', 'b'): C()}}\n", 2, 25, "a tuple"),
        Invalid(f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{b'lm_head': C()}}\n", 2, 25, "bytes"),
        Invalid(
            f"{TP_IMPORT} ColwiseParallel as C\ndef custom_parallel_plan():\n    return {{None: C()}}\n", 3, 13, "None"
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for entry in plan.entries:
            value = plan.classify(entry.key)
            if value.category in ("none", "bool", "int", "float", "bytes", "tuple", "dict", "set"):
                yield entry.key, self.message.format(what=value.describe(plan.code(entry.key)))


class DuplicateKeyRule(StaticRule):
    code = "PG006"
    title = "duplicate key"
    explanation = "A dict literal keeps only the last value for a repeated key, so the earlier entry is silently lost."
    wrong = f'{TP_IMPORT} ColwiseParallel, RowwiseParallel\ncustom_parallel_plan = {{\n    "lm_head": ColwiseParallel(),\n    "lm_head": RowwiseParallel(),\n}}'
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{\n    "lm_head": ColwiseParallel(),\n}}'
    message = "duplicate key {key!r} (first at line {line}): the dict keeps only the last value"
    VALID = (f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{'a': C(), 'b': C()}}\n",)
    INVALID = (
        Invalid(
            f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{\n    'a': C(),\n    \"a\": C(),\n}}\n",
            4,
            5,
            "line 3",
        ),
        Invalid(
            f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{'a.b': C(), 'a.' 'b': C()}}\n", 2, 37, "'a.b'"
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for plan_dict in plan.dicts:
            first_seen: dict[str, cst.BaseExpression] = {}
            for element in plan_dict.elements:
                if not isinstance(element, cst.DictElement):
                    continue
                key = string_value(element.key)
                if not isinstance(key, str):
                    continue
                if key in first_seen:
                    line = plan.position(first_seen[key])[0]
                    yield element.key, self.message.format(key=key, line=line)
                else:
                    first_seen[key] = element.key


# What verify reads from a generated file's constants when no option overrides them, and what
# each must be. The one place these kinds are written: the renderer writes them, verify and cost
# read them through :func:`plangen.check.static.read_plan_metadata`.
PLAN_CONSTANTS: dict[str, str] = {
    "PLANGEN_MODEL": "a model spec string (a model_type, a class name or a config path)",
    "PLANGEN_TP_SIZE": "a positive integer",
    "PLANGEN_SEQUENCE_PARALLEL": "True or False",
    "PLANGEN_PLAN_VARIANT": "'optimized' or 'stable' (written only for 'stable')",
    "PLANGEN_TARGET": f"the runtime the plan is for, one of {', '.join(map(repr, TARGETS))} (written only for another than {DEFAULT_TARGET!r})",
}


def constant_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be ``name``'s value, or None when it can."""
    if name == "PLANGEN_MODEL":
        good = isinstance(value, str) and bool(value.strip())
    elif name == "PLANGEN_TP_SIZE":
        good = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    elif name == "PLANGEN_SEQUENCE_PARALLEL":
        good = isinstance(value, bool)
    elif name == "PLANGEN_PLAN_VARIANT":
        from plangen.plan import VARIANTS  # torch-free: level 1 never imports torch

        good = value in VARIANTS
    elif name == "PLANGEN_TARGET":
        good = value in TARGETS
    else:
        return None
    return None if good else f"{name} must be {PLAN_CONSTANTS[name]}, got {value!r}"


class PlanConstantRule(StaticRule):
    code = "PG007"
    title = "unusable PLANGEN_* constant"
    explanation = (
        "Generated files record what they were made for: `PLANGEN_MODEL` (a model spec),"
        " `PLANGEN_TP_SIZE` (a positive integer) and `PLANGEN_SEQUENCE_PARALLEL` (True or False)."
        " verify checks the file against them when `--model`, `--tp-size` and `--sequence-parallel`"
        " are not given, and `plangen cost` prices the plan with them, so a value of the wrong kind"
        ' (`0`, `-4`, `"two"`, `2.5`, `True` as a TP size, or a value computed at run time) would'
        " check the file at a size nobody meant; it is reported on its line instead. A"
        " `PLANGEN_MODEL` that names no model is reported the same way when level 2 resolves it."
    )
    wrong = (
        f'{TP_IMPORT} ColwiseParallel\n\nPLANGEN_TP_SIZE = 0\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    )
    right = (
        f'{TP_IMPORT} ColwiseParallel\n\nPLANGEN_TP_SIZE = 2\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}'
    )
    message = "{problem}"
    VALID = (
        'PLANGEN_MODEL = "llama"\nPLANGEN_TP_SIZE = 8\nPLANGEN_SEQUENCE_PARALLEL = False\ncustom_parallel_plan = {}\n',
        "PLANGEN_TP_SIZE: int = 2\nPLANGEN_OTHER = object()\ncustom_parallel_plan = {}\n",
        'PLANGEN_PLAN_VARIANT = "stable"\ncustom_parallel_plan = {}\n',
        "def f():\n    PLANGEN_TP_SIZE = 'local, not the constant'\ncustom_parallel_plan = {}\n",
    )
    INVALID = (
        Invalid("PLANGEN_TP_SIZE = -4\ncustom_parallel_plan = {}\n", 1, 19, "positive integer, got -4"),
        Invalid("PLANGEN_TP_SIZE = 0\ncustom_parallel_plan = {}\n", 1, 19, "got 0"),
        Invalid("PLANGEN_TP_SIZE = 'two'\ncustom_parallel_plan = {}\n", 1, 19, "got 'two'"),
        Invalid("PLANGEN_TP_SIZE = 2.5\ncustom_parallel_plan = {}\n", 1, 19, "got 2.5"),
        Invalid("PLANGEN_TP_SIZE = True\ncustom_parallel_plan = {}\n", 1, 19, "got True"),
        Invalid("x = 1\nPLANGEN_MODEL = ''\ncustom_parallel_plan = {}\n", 2, 17, "model spec string"),
        Invalid("PLANGEN_SEQUENCE_PARALLEL = 'yes'\ncustom_parallel_plan = {}\n", 1, 29, "True or False"),
        Invalid("PLANGEN_PLAN_VARIANT = 'fast'\ncustom_parallel_plan = {}\n", 1, 24, "'optimized' or 'stable'"),
        Invalid(
            "import os\nPLANGEN_TP_SIZE = int(os.environ['TP'])\ncustom_parallel_plan = {}\n", 2, 19, "not a literal"
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for name, value in _module_constants(plan.module):
            if name not in PLAN_CONSTANTS:
                continue
            try:
                literal = ast.literal_eval(plan.module.code_for_node(value).strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                problem = f"{name} must be {PLAN_CONSTANTS[name]} written as a literal, not a literal here: {plan.code(value)}"
                yield value, self.message.format(problem=problem)
                continue
            problem = constant_problem(name, literal)
            if problem is not None:
                yield value, self.message.format(problem=problem)


def _module_constants(module: cst.Module) -> Iterator[tuple[str, cst.BaseExpression]]:
    """Module-level ``NAME = value`` and ``NAME: T = value`` assignments."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if isinstance(target.target, cst.Name):
                        yield target.target.value, small.value
            elif isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target, cst.Name):
                yield small.target.value, small.value


class LoraPartKeyRule(StaticRule):
    code = "PG008"
    title = "key names a part of a LoRA layer"
    explanation = (
        "On a peft LoRA model, plangen's runtime translates the key of each wrapped module"
        " (`model.layers.*.self_attn.q_proj`) onto the LoRA layer's `base_layer` and adapters, placing"
        " the adapters to match the base's style (docs/rl.md). A key that names `base_layer`, `lora_A`,"
        " `lora_B` or another part itself bypasses that: the adapters would be left unplaced, so the"
        " runtime refuses it. Write the key of the wrapped module, as for the model without LoRA."
    )
    wrong = (
        f"{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{\n"
        '    "model.layers.*.self_attn.q_proj.base_layer": ColwiseParallel(),\n}'
    )
    right = f'{TP_IMPORT} ColwiseParallel\ncustom_parallel_plan = {{\n    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n}}'
    message = (
        "key {key!r} names `{part}` inside a LoRA layer: write {wrapped!r}; plangen places the base layer and adapters"
    )
    VALID = (
        f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{'base_model.model.model.layers.*.mlp.up_proj': C()}}\n",
        f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{'model.lora_Alpha': C()}}\n",
    )
    INVALID = (
        Invalid(
            f"{TP_IMPORT} ColwiseParallel as C\ncustom_parallel_plan = {{\n    'model.layers.*.mlp.up_proj.base_layer': C(),\n}}\n",
            3,
            5,
            "'model.layers.*.mlp.up_proj'",
        ),
        Invalid(
            f"{TP_IMPORT} ColwiseParallel as C\ndef custom_parallel_plan():\n    return {{'lm_head.lora_B.default': C()}}\n",
            3,
            13,
            "names `lora_B`",
        ),
    )

    def check(self, plan: PlanFile) -> Iterator[Finding]:
        for entry in plan.entries:
            key = string_value(entry.key)
            if not isinstance(key, str):
                continue
            parts = key.split(".")
            for i, part in enumerate(parts):
                if part in LORA_PARTS and i:
                    yield entry.key, self.message.format(key=key, part=part, wrapped=".".join(parts[:i]))
                    break

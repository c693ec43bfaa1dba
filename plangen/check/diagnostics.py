"""Diagnostics: the finding type, the registry of codes, ignore comments, and output renderers.

Codes are stable: once published a code keeps its meaning and is never reused, so that
``# plangen: ignore[PG101]`` comments and CI filters keep working. Ranges: PG0xx file structure,
PG1xx styles and their arguments, PG2xx and up the model-level checks. Every code is registered in
:data:`CODES` with an example; ``docs/diagnostics.md`` is generated from it
(``python -m plangen.check.diagnostics > docs/diagnostics.md``) and a test keeps the two equal.

This module imports nothing heavy: the CLI uses it to render results.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping

from plangen.check.known_styles import STYLES, TORCH_PARALLEL


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding; ``line`` and ``col`` are 1-based, as editors and CI annotations expect."""

    path: str
    line: int
    col: int
    code: str
    message: str


@dataclass(frozen=True)
class CodeInfo:
    code: str
    title: str
    explanation: str
    wrong: str
    right: str


def _code(code: str, title: str, explanation: str, wrong: str, right: str) -> CodeInfo:
    return CodeInfo(code, title, explanation, wrong.strip("\n") + "\n", right.strip("\n") + "\n")


_TP = "from torch.distributed.tensor.parallel import"
_PLACEMENTS = "from torch.distributed.tensor import"

CODES: dict[str, CodeInfo] = {
    info.code: info
    for info in (
        _code(
            "PG001",
            "syntax error",
            "The file is not valid Python; nothing else can be checked until it parses.",
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel(}}',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG002",
            "no custom_parallel_plan",
            "A plan file defines `custom_parallel_plan` at module level: a dict literal, or a function"
            " without required arguments that returns one.",
            f'{_TP} ColwiseParallel\nplan = {{"lm_head": ColwiseParallel()}}',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG003",
            "plan function takes required arguments",
            "`custom_parallel_plan()` is called without arguments, so every parameter needs a default.",
            f'{_TP} ColwiseParallel\n\n\ndef custom_parallel_plan(model):\n    return {{"lm_head": ColwiseParallel()}}',
            f'{_TP} ColwiseParallel\n\n\ndef custom_parallel_plan():\n    return {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG004",
            "plan is not a dict",
            "`custom_parallel_plan` must be (or return) a dict from module patterns to styles; this"
            " value is certainly something else.",
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = [("lm_head", ColwiseParallel())]',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG005",
            "key is not a string",
            "Keys are module name patterns such as `\"model.layers.*.mlp.up_proj\"`; a number, tuple or"
            " bytes key can never match a module.",
            f"{_TP} ColwiseParallel\ncustom_parallel_plan = {{0: ColwiseParallel()}}",
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"model.layers.0.mlp.up_proj": ColwiseParallel()}}',
        ),
        _code(
            "PG006",
            "duplicate key",
            "A dict literal keeps only the last value for a repeated key, so the earlier entry is"
            " silently lost.",
            f'{_TP} ColwiseParallel, RowwiseParallel\ncustom_parallel_plan = {{\n    "lm_head": ColwiseParallel(),\n    "lm_head": RowwiseParallel(),\n}}',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{\n    "lm_head": ColwiseParallel(),\n}}',
        ),
        _code(
            "PG101",
            "unknown parallel style",
            "The value calls something that is not a known parallel style, or imports a style from a"
            " module that does not define it. Known: torch's "
            + ", ".join(f"`{s.name}`" for s in STYLES.values() if TORCH_PARALLEL in s.modules)
            + " (`torch.distributed.tensor.parallel`); plangen's "
            + ", ".join(f"`{s.name}`" for s in STYLES.values() if TORCH_PARALLEL not in s.modules)
            + " (`plangen.styles`).",
            f'import torch.distributed.tensor.parallel as tp\ncustom_parallel_plan = {{"lm_head": tp.ColumnwiseParallel()}}',
            f'import torch.distributed.tensor.parallel as tp\ncustom_parallel_plan = {{"lm_head": tp.ColwiseParallel()}}',
        ),
        _code(
            "PG102",
            "undefined name",
            "The name is neither defined nor imported in the file, so evaluating the plan raises"
            " NameError.",
            'custom_parallel_plan = {"lm_head": ColwiseParallel()}',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG103",
            "value is not a parallel style",
            "Each value must be a ParallelStyle object such as `ColwiseParallel()`. Strings like"
            ' `"colwise"` are Hugging Face `tp_plan` names, not styles; a class must be called.',
            'custom_parallel_plan = {"lm_head": "colwise"}',
            f'{_TP} ColwiseParallel\ncustom_parallel_plan = {{"lm_head": ColwiseParallel()}}',
        ),
        _code(
            "PG104",
            "unknown keyword argument",
            "The style has no parameter of that name; the constructor would raise TypeError.",
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layout=Replicate())}',
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
        ),
        _code(
            "PG105",
            "positional argument",
            "Parallel styles take keyword-only arguments; a positional argument raises TypeError.",
            f'{_TP} SequenceParallel\ncustom_parallel_plan = {{"model.norm": SequenceParallel(1)}}',
            f'{_TP} SequenceParallel\ncustom_parallel_plan = {{"model.norm": SequenceParallel(sequence_dim=1)}}',
        ),
        _code(
            "PG106",
            "missing required keyword argument",
            "The style has a parameter without a default that the call does not pass.",
            f"{_TP} PrepareModuleOutput\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"model.norm": PrepareModuleOutput(output_layouts=Replicate())}',
            f"{_TP} PrepareModuleOutput\n{_PLACEMENTS} Replicate, Shard\n"
            'custom_parallel_plan = {\n    "model.norm": PrepareModuleOutput(\n'
            "        output_layouts=Replicate(), desired_output_layouts=Shard(1)\n    ),\n}",
        ),
        _code(
            "PG107",
            "wrong argument type",
            "The value has a type the parameter does not accept: a bool or a number where a placement is"
            " expected, a placement where a bool is expected, a tuple where a single placement is"
            " expected, a placement class that is not called.",
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=True)}',
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
        ),
        _code(
            "PG108",
            "invalid placement",
            "Placements are `Shard(dim)` with an int dim, `Replicate()`, and `Partial()` or"
            ' `Partial("sum" | "avg" | "min" | "max" | "product")`.',
            f"{_TP} RowwiseParallel\n{_PLACEMENTS} Shard\n"
            'custom_parallel_plan = {"model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard("1"))}',
            f"{_TP} RowwiseParallel\n{_PLACEMENTS} Shard\n"
            'custom_parallel_plan = {"model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard(1))}',
        ),
        _code(
            "PG109",
            "private placement",
            "Placements whose names start with an underscore (`_StridedShard`, `_MaskPartial`) are torch"
            " internals that change between releases; use Shard, Replicate or Partial.",
            f"{_TP} ColwiseParallel\nfrom torch.distributed.tensor.placement_types import _StridedShard\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=_StridedShard(0, split_factor=2))}',
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Shard\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Shard(0))}',
        ),
        _code(
            "PG110",
            "redistribution to Partial",
            "DTensor refuses to redistribute to a Partial placement (\"redistributing to Partial is for"
            " internal use only\"): a desired or output layout can be Partial only where the tensor is"
            " already in that same Partial state (RowwiseParallel's output is Partial(\"sum\")).",
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Partial\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Partial())}',
            f"{_TP} ColwiseParallel\n{_PLACEMENTS} Replicate\n"
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
        ),
        _code(
            "PG111",
            "layout count mismatch",
            "PrepareModuleInput/Output pair each layout with a desired layout: both must be given, with"
            " as many entries (torch raises AssertionError otherwise).",
            f"{_TP} PrepareModuleInput\n{_PLACEMENTS} Replicate, Shard\n"
            'custom_parallel_plan = {\n    "model.layers.*.self_attn": PrepareModuleInput(\n'
            "        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(),)\n    ),\n}",
            f"{_TP} PrepareModuleInput\n{_PLACEMENTS} Replicate, Shard\n"
            'custom_parallel_plan = {\n    "model.layers.*.self_attn": PrepareModuleInput(\n'
            "        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)\n    ),\n}",
        ),
    )
}


# --- ignore comments -------------------------------------------------------------------------

IGNORE_ALL: frozenset[str] = frozenset({"*"})
_IGNORE = re.compile(r"plangen:\s*ignore(?:\[(?P<codes>[^\]]*)\])?")


def parse_ignore_comment(comment: str) -> frozenset[str] | None:
    """The codes a ``# plangen: ignore[...]`` comment silences, :data:`IGNORE_ALL`, or None."""
    match = _IGNORE.search(comment)
    if match is None:
        return None
    if match.group("codes") is None:
        return IGNORE_ALL
    return frozenset(code.strip().upper() for code in match.group("codes").split(",") if code.strip())


def drop_ignored(
    diagnostics: Iterable[Diagnostic], ignores: Mapping[int, frozenset[str]]
) -> list[Diagnostic]:
    """Drop the diagnostics silenced by an ignore comment on their line."""
    kept = []
    for diagnostic in diagnostics:
        codes = ignores.get(diagnostic.line)
        if codes is not None and ("*" in codes or diagnostic.code in codes):
            continue
        kept.append(diagnostic)
    return kept


# --- renderers -------------------------------------------------------------------------------


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    github = "github"


def render_text(diagnostics: Iterable[Diagnostic]) -> str:
    return "".join(f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}\n" for d in diagnostics)


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps([asdict(d) for d in diagnostics], indent=2) + "\n"


def _escape_github_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_github_property(text: str) -> str:
    return _escape_github_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(diagnostics: Iterable[Diagnostic]) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on the file."""
    return "".join(
        f"::error file={_escape_github_property(d.path)},line={d.line},col={d.col},"
        f"title={d.code}::{_escape_github_data(d.message)}\n"
        for d in diagnostics
    )


RENDERERS: dict[OutputFormat, Callable[[Iterable[Diagnostic]], str]] = {
    OutputFormat.text: render_text,
    OutputFormat.json: render_json,
    OutputFormat.github: render_github,
}


def render(diagnostics: Iterable[Diagnostic], output_format: OutputFormat | str = OutputFormat.text) -> str:
    return RENDERERS[OutputFormat(output_format)](sorted(diagnostics))


# --- documentation ---------------------------------------------------------------------------


def render_diagnostics_doc(codes: Mapping[str, CodeInfo] = CODES) -> str:
    """The text of ``docs/diagnostics.md``."""
    lines = [
        "# plangen diagnostics",
        "",
        "<!-- Generated from plangen/check/diagnostics.py by"
        " `python -m plangen.check.diagnostics > docs/diagnostics.md`; do not edit by hand. -->",
        "",
        "`plangen verify` reports findings as `path:line:col: CODE message`. Codes are stable and never"
        " reused: PG0xx concern the file's structure, PG1xx the styles and their arguments, PG2xx and"
        " up the checks against a model.",
        "",
        "A trailing comment silences findings on its line: `# plangen: ignore[PG101]`,"
        " `# plangen: ignore[PG101,PG107]`, or `# plangen: ignore` for every code (not PG001: a file"
        " that does not parse has no comments to read).",
        "",
        "| Code | Title |",
        "| --- | --- |",
        *(f"| [{c.code}](#{c.code.lower()}) | {c.title} |" for c in codes.values()),
        "",
    ]
    for info in codes.values():
        lines += [
            f"## {info.code}",
            "",
            f"**{info.title}.** {info.explanation}",
            "",
            "Wrong:",
            "",
            "```python",
            info.wrong.rstrip("\n"),
            "```",
            "",
            "Right:",
            "",
            "```python",
            info.right.rstrip("\n"),
            "```",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_diagnostics_doc(), end="")

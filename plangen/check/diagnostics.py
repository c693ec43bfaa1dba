"""Diagnostics: the finding type, the registry of codes, ignore comments, and output renderers.

Codes are stable: once published a code keeps its meaning and is never reused, so that
``# plangen: ignore[PG101]`` comments and CI filters keep working. Ranges: PG0xx file structure,
PG1xx styles and their arguments (level 1, from the source), PG2xx the plan against the model
(level 2, meta device), PG3xx the plan run on CPU (level 3, ``--run``). Every code is registered in
:data:`CODES` with a wrong and a right example; examples of levels 2 and 3 carry their model as a
generated file does (``PLANGEN_MODEL = "llama"``). ``docs/diagnostics.md`` is generated from it
(``python -m plangen.check.diagnostics > docs/diagnostics.md``) and a test keeps the two equal.

Severity: most codes are errors (exit status 1). A warning (PG209, PG210) reports something that
is right but likely not what was meant; it is shown with ``warning:`` before its message and
changes the exit status only under ``--strict``.

This module imports nothing heavy: the CLI uses it to render results.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Literal, Mapping

from plangen.check.known_styles import STYLES, TORCH_PARALLEL


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding; ``line`` and ``col`` are 1-based, as editors and CI annotations expect."""

    path: str
    line: int
    col: int
    code: str
    message: str
    # Filled from the registry: a code always has one severity.
    severity: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.severity:
            object.__setattr__(self, "severity", severity_of(self.code))


Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class CodeInfo:
    code: str
    title: str
    explanation: str
    wrong: str
    right: str
    severity: Severity = "error"


def _code(code: str, title: str, explanation: str, wrong: str, right: str, severity: Severity = "error") -> CodeInfo:
    return CodeInfo(code, title, explanation, wrong.strip("\n") + "\n", right.strip("\n") + "\n", severity)


def severity_of(code: str) -> str:
    info = CODES.get(code)
    return info.severity if info is not None else "error"


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
        # --- level 2: the plan against the model (meta device) ---------------------------------
        _code(
            "PG201",
            "plan file cannot be loaded",
            "Level 2 imports the plan file as the runtime will (`plangen.plan_source.load_custom_plan`)."
            " Importing it raised: a module the file imports is missing where verify (and training) runs, its"
            " top level raises, or `custom_parallel_plan()` does. The finding sits on the line that raised.",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\nfrom my_plans import EXTRA\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate()), **EXTRA}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
        ),
        _code(
            "PG202",
            "key matches no module",
            "Keys select modules by torch's own rule: the key and the module path have as many dotted"
            " segments, and each segment matches by fnmatch (`*` never spans a dot). torch only warns about"
            " a key that selects nothing and leaves those modules unsharded.",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'custom_parallel_plan = {"lm_heads": ColwiseParallel(output_layouts=Replicate())}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
        ),
        _code(
            "PG203",
            "style does not fit the module",
            "Column- and row-parallel styles shard nn.Linear and nn.Embedding only (packed ones nn.Linear"
            " only); a row-parallel embedding reads token ids, which must come in whole"
            " (`input_layouts=Replicate()`); gradient-reducing styles need parameters; PrepareModuleInput's"
            " keyword layouts must name parameters of the module's forward.",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": RowwiseParallel(),\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
        ),
        _code(
            "PG204",
            "dimension not divisible by the TP size",
            "Attention heads and key/value heads must divide by the TP size when q/k/v are column-parallel;"
            " so must every dimension a style hands on (or reads) as a plain local shard, since"
            " `DTensor.from_local` assumes even shards: the FFN width between a column- and a row-parallel"
            " projection, the output of a column-parallel embedding. A vocabulary split by a row-parallel"
            " embedding or by a head whose logits stay a DTensor need not divide. The message names the"
            " largest legal TP size.",
            f"{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\nPLANGEN_TP_SIZE = 3\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}',
            f"{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\nPLANGEN_TP_SIZE = 2\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}',
        ),
        _code(
            "PG205",
            "column-parallel without row-parallel",
            "A column-parallel projection whose output stays split over TP must feed a row-parallel one"
            " in the same block (or gather its output with `output_layouts=Replicate()`), and a"
            " row-parallel projection that reads a shard needs a column-parallel one to produce it;"
            " otherwise the next module computes on a slice. The output head may keep vocabulary-parallel"
            " logits, as a DTensor (`use_local_output=False`).",
            f"{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": ColwiseParallel(),\n}',
            f"{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}',
        ),
        _code(
            "PG206",
            "sequence-parallel regions inconsistent",
            "With sequence parallel the residual stream between blocks is split on the sequence"
            " (`Shard(1)`) everywhere: the embedding and every row-parallel block output produce it, blocks"
            " gather it (PrepareModuleInput), every norm on it is SequenceParallel, the head reads it;"
            " without, it is `Replicate()` everywhere. Sequence parallel is on when --sequence-parallel or"
            " PLANGEN_SEQUENCE_PARALLEL says so, else when most of the plan's residual layouts split the"
            " sequence.",
            f"{_PLACEMENTS} Replicate, Shard\n"
            f"{_TP} ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel\n\n"
            'PLANGEN_MODEL = "llama"\nPLANGEN_SEQUENCE_PARALLEL = True\nSEQ, WHOLE = Shard(1), Replicate()\n'
            "custom_parallel_plan = {\n"
            '    "model.embed_tokens": RowwiseParallel(input_layouts=WHOLE, output_layouts=SEQ),\n'
            '    "model.layers.*.input_layernorm": SequenceParallel(),\n'
            '    "model.layers.*.self_attn": PrepareModuleInput(\n'
            '        input_kwarg_layouts={"hidden_states": SEQ}, desired_input_kwarg_layouts={"hidden_states": WHOLE}\n'
            "    ),\n"
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=SEQ),\n'
            '    "model.layers.*.post_attention_layernorm": SequenceParallel(),\n'
            '    "model.layers.*.mlp": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(WHOLE,)),\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=WHOLE),\n'
            '    "model.norm": SequenceParallel(),\n'
            '    "lm_head": ColwiseParallel(input_layouts=SEQ, output_layouts=WHOLE),\n}',
            f"{_PLACEMENTS} Replicate, Shard\n"
            f"{_TP} ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel\n\n"
            'PLANGEN_MODEL = "llama"\nPLANGEN_SEQUENCE_PARALLEL = True\nSEQ, WHOLE = Shard(1), Replicate()\n'
            "custom_parallel_plan = {\n"
            '    "model.embed_tokens": RowwiseParallel(input_layouts=WHOLE, output_layouts=SEQ),\n'
            '    "model.layers.*.input_layernorm": SequenceParallel(),\n'
            '    "model.layers.*.self_attn": PrepareModuleInput(\n'
            '        input_kwarg_layouts={"hidden_states": SEQ}, desired_input_kwarg_layouts={"hidden_states": WHOLE}\n'
            "    ),\n"
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=SEQ),\n'
            '    "model.layers.*.post_attention_layernorm": SequenceParallel(),\n'
            '    "model.layers.*.mlp": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(WHOLE,)),\n'
            '    "model.layers.*.mlp.gate_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.up_proj": ColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=SEQ),\n'
            '    "model.norm": SequenceParallel(),\n'
            '    "lm_head": ColwiseParallel(input_layouts=SEQ, output_layouts=WHOLE),\n}',
        ),
        _code(
            "PG207",
            "per-head norm without gradient reduction",
            "A norm applied to each head after column-parallel q/k projections (Qwen3's and Gemma3's"
            " `q_norm`, `k_norm`) sees only this rank's heads, so its weight gradient on each rank is a"
            " partial sum: it must be summed over TP (`ReplicatedWithGradAllReduce` from plangen.styles),"
            " or every rank's copy drifts apart.",
            f"{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "qwen3"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}',
            f"{_TP} ColwiseParallel, RowwiseParallel\n\nfrom plangen.styles import ReplicatedWithGradAllReduce\n\n"
            'PLANGEN_MODEL = "qwen3"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.q_norm": ReplicatedWithGradAllReduce(),\n'
            '    "model.layers.*.self_attn.k_norm": ReplicatedWithGradAllReduce(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}',
        ),
        _code(
            "PG208",
            "tied embeddings would come apart",
            "When the input embedding and the output head share one weight, both ends must give it the same"
            " layout: the vocabulary split, RowwiseParallel on the embedding and ColwiseParallel on the"
            " head. (A plan that shards only one end is completed by the runtime.)",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": ColwiseParallel(output_layouts=Replicate()),\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
        ),
        _code(
            "PG209",
            "Linear left unsharded",
            "A Linear that no key covers, next to sharded neighbours (a Linear under a module of the same"
            " kind that the plan shards, or the output head while the embedding is sharded), is whole on"
            " every TP rank: right, but probably forgotten. Regions the plan never shards (a vision"
            " tower, Mamba mixers) count as deliberate. Mark a deliberate one with `LeaveUnsharded()` or a"
            " commented-out key in the plan dict, as generated files do. Reported on the plan's first line.",
            f"{_TP} RowwiseParallel\n{_PLACEMENTS} Replicate\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n}',
            f"{_TP} RowwiseParallel\n{_PLACEMENTS} Replicate\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
            '    # "lm_head": left replicated on purpose\n}',
            severity="warning",
        ),
        _code(
            "PG210",
            "packed projection under FSDP2",
            "PackedColwiseParallel/PackedRowwiseParallel compute right, but FSDP2 (torch 2.13) lays their"
            " strided shards out wrongly, so state dicts and checkpoints would come back permuted: the"
            " runtime refuses them at DP size above 1. Right for training at DP size 1 only; say so with an"
            " ignore comment.",
            f"{_TP} RowwiseParallel\n\nfrom plangen.styles import PackedColwiseParallel\n\n"
            'PLANGEN_MODEL = "phi3"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_up_proj": PackedColwiseParallel(),\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}',
            f"{_TP} RowwiseParallel\n\nfrom plangen.styles import PackedColwiseParallel\n\n"
            'PLANGEN_MODEL = "phi3"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.mlp.gate_up_proj": PackedColwiseParallel(),  # plangen: ignore[PG210] DP size 1\n'
            '    "model.layers.*.mlp.down_proj": RowwiseParallel(),\n}',
            severity="warning",
        ),
        # --- level 3: the plan run on CPU (--run) ----------------------------------------------
        _code(
            "PG301",
            "fails at its TP size",
            "Applied to a shrunk model of the same architecture on a fake process group of the plan's TP"
            " size, the plan raised (applying it, in the forward, or in the backward), lost a gradient, or"
            " gave a gradient of the wrong shape. The finding sits on the key of the module that failed.",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Replicate()),\n}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel, RowwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.layers.*.self_attn.q_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.k_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.v_proj": ColwiseParallel(),\n'
            '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}',
        ),
        _code(
            "PG302",
            "differs from the unsharded model",
            "At TP=2 over gloo, the logits or a parameter gradient differ from the unsharded model's by"
            " more than 1e-5 (fp32, same weights, same batch). The first parameter that differs, in the"
            " model's order, is named. Here the final norm sees the whole hidden state on every rank, so"
            " summing its gradient over TP counts it twice.",
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\nfrom plangen.styles import AllReduceParamGrads\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "model.norm": AllReduceParamGrads(),\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\ncustom_parallel_plan = {\n'
            '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}',
        ),
        _code(
            "PG303",
            "distributed run failed",
            "The TP=2 run over gloo did not finish: a rank raised, died or hung (past --timeout), and the"
            " run was ended with every rank killed. A plan must be the same on every rank.",
            f"import os\n\n{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'if os.environ.get("RANK", "0") != "0":\n'
            '    raise SystemExit("this plan only knows rank 0")\n'
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
            f"{_PLACEMENTS} Replicate\n{_TP} ColwiseParallel\n\n"
            'PLANGEN_MODEL = "llama"\n'
            'custom_parallel_plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}',
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


def _prefix(diagnostic: Diagnostic) -> str:
    return "warning: " if diagnostic.severity == "warning" else ""


def render_text(diagnostics: Iterable[Diagnostic]) -> str:
    return "".join(f"{d.path}:{d.line}:{d.col}: {d.code} {_prefix(d)}{d.message}\n" for d in diagnostics)


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps([asdict(d) for d in diagnostics], indent=2) + "\n"


def _escape_github_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_github_property(text: str) -> str:
    return _escape_github_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(diagnostics: Iterable[Diagnostic]) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on the file."""
    return "".join(
        f"::{'warning' if d.severity == 'warning' else 'error'} file={_escape_github_property(d.path)},"
        f"line={d.line},col={d.col},"
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
        " reused: PG0xx concern the file's structure and PG1xx the styles and their arguments (level 1,"
        " read from the source, never run); PG2xx the plan against its model on the meta device (level 2,"
        " the default with level 1: the file is imported as the runtime imports it, its prints go to"
        " stderr); PG3xx the plan run on CPU (level 3, `--run`). A level runs on a file only when the"
        " levels before it found no error there.",
        "",
        "Examples of levels 2 and 3 name their model as generated files do (`PLANGEN_MODEL`,"
        " `PLANGEN_TP_SIZE`, `PLANGEN_SEQUENCE_PARALLEL`), which is what verify uses when `--model`,"
        " `--tp-size` and `--sequence-parallel` are not given.",
        "",
        "Errors set the exit status to 1. Warnings are printed with `warning:` before the message and set"
        " it only under `--strict`.",
        "",
        "A trailing comment silences findings on its line: `# plangen: ignore[PG101]`,"
        " `# plangen: ignore[PG101,PG107]`, or `# plangen: ignore` for every code (not PG001: a file"
        " that does not parse has no comments to read).",
        "",
        "| Code | Title | Severity |",
        "| --- | --- | --- |",
        *(f"| [{c.code}](#{c.code.lower()}) | {c.title} | {c.severity} |" for c in codes.values()),
        "",
    ]
    for info in codes.values():
        severity = " (warning)" if info.severity == "warning" else ""
        lines += [
            f"## {info.code}",
            "",
            f"**{info.title}{severity}.** {info.explanation}",
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

"""Every causal-LM architecture the installed transformers registers, with the plan it gets.

One row per class: the plan the runtime uses at TP > 1 without a custom plan, named by its source
(``hand-written``, ``synthesized`` where the sweep proved it, ``hf``, or ``none``: the vocabulary of
:mod:`plangen.plans.choice`), whether sequence parallelism is
available with it, and the numerical check of that plan from ``plangen/plans/proven.json``.

Classes are read from transformers' causal-LM mapping, plus the multimodal classes that have a
hand-written plan. Each is built on the meta device from its default config shrunk by
:func:`plangen.shrink.shrink_config` (one layer per kind: the same structure, a fraction of the
modules, so ~200 builds take seconds). Nothing is cached on disk.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal

from plangen.errors import one_line

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

PlanKind = Literal["hand-written", "synthesized", "hf", "none"]


@dataclass(frozen=True)
class Architecture:
    class_name: str
    model_type: str  # the type whose config the class is built from (its config class's own type)
    aliases: tuple[str, ...] = ()  # other types transformers maps to the same class


@dataclass(frozen=True)
class CatalogRow:
    class_name: str
    model_type: str
    plan: PlanKind
    sequence_parallel: bool
    # The sweep's verdict on that plan: passed, failed, not run, or n/a (no plan to check).
    check: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_architectures() -> list[Architecture]:
    """One entry per class: transformers' causal LMs, then multimodal classes with a hand-written plan."""
    from transformers.models.auto import modeling_auto as auto

    from plangen.plans import HAND_WRITTEN

    types: dict[str, list[str]] = {}
    for model_type, class_name in sorted(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        types.setdefault(class_name, []).append(model_type)
    for mapping in (auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, auto.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES):
        for model_type, class_name in sorted(mapping.items()):
            if class_name in HAND_WRITTEN and class_name not in types:
                types[class_name] = [model_type]
    return sorted(
        (_architecture(class_name, model_types) for class_name, model_types in types.items()),
        key=lambda a: a.class_name.lower(),
    )


def _architecture(class_name: str, model_types: list[str]) -> Architecture:
    # Several types can map to one class (llama, exaone, internlm3 -> LlamaForCausalLM): name the
    # class by the type its name starts with. (Asking the class for its config would import every
    # modeling module just to list them.)
    def squeeze(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    named = [t for t in model_types if squeeze(class_name).startswith(squeeze(t))]
    main = max(named, key=len) if named else model_types[0]
    return Architecture(class_name, main, tuple(t for t in model_types if t != main))


def build_catalog_model(arch: Architecture) -> "nn.Module":
    """The class on the meta device, from its default config shrunk to one layer of each kind."""
    from plangen.models import build_meta_model, resolve_model
    from plangen.shrink import shrink_config

    resolved = resolve_model(arch.model_type)
    model_class = resolved.model_class
    if model_class.__name__ != arch.class_name:  # a type whose first mapping names another class
        resolved = resolve_model(arch.class_name)
        model_class = resolved.model_class
    # Eager attention: every class supports it, and the plan does not depend on the kernel.
    return build_meta_model(shrink_config(resolved.config, 2, attn_implementation="eager"), model_class)


def _verdict(record: dict[str, Any] | None, with_sp: bool) -> str:
    if not record:
        return "not run"
    if record.get("tp") is not True:
        return "failed"
    if with_sp and record.get("sp") is not True:
        return "failed (SP)"
    return "passed"



def _hand_written_row(arch: Architecture, model: "nn.Module", record: dict[str, Any] | None) -> CatalogRow:
    from plangen.plans import HAND_WRITTEN

    try:
        HAND_WRITTEN[arch.class_name](model, True)
        sp, note = True, ""
    except ValueError as err:
        sp, note = False, one_line(err, part='first')
    record = record if record and record.get("plan") == "hand-written" else None
    return CatalogRow(arch.class_name, arch.model_type, "hand-written", sp, _verdict(record, sp), note)


def build_row(arch: Architecture, proven: dict[str, dict[str, Any]]) -> CatalogRow:
    """The row of one class (``proven``: the sweep's records, :func:`plangen.plans.proven.load_proven`).

    The plan is the runtime's own choice (:func:`plangen.plans.choice.choose_plan`); the row adds the
    sweep's verdict on it and, below the hand-written plans, why the sources above were passed over.
    """
    from plangen.plans import HAND_WRITTEN
    from plangen.plans.choice import NoPlanError, choose_plan

    record = proven.get(arch.class_name)
    try:
        model = build_catalog_model(arch)
    except Exception as err:  # noqa: BLE001 - transformers' default configs fail in many ways
        plan: PlanKind = "hand-written" if arch.class_name in HAND_WRITTEN else "none"
        return CatalogRow(arch.class_name, arch.model_type, plan, False, "n/a",
                          f"its default config does not build: {one_line(err, part='first')}")
    try:
        chosen = choose_plan(model, sequence_parallel=False)
    except NoPlanError as err:
        hf_error = next(p.why for p in err.passed_over if p.source == "hf")
        why = _synthesis_note(model, record)
        return CatalogRow(arch.class_name, arch.model_type, "none", False, "n/a",
                          f"{why}; no usable Hugging Face plan: {one_line(hf_error, part='first')}")
    if chosen.source == "hand-written":
        return _hand_written_row(arch, model, record)
    if chosen.source == "synthesized":
        from plangen.plans.analysis import analyze_model

        sp = record.get("sp") is True  # proven with SP: the sweep's record (choose_plan proved the TP one)
        sp_problems = analyze_model(model).sp_problems
        note = "" if sp else (sp_problems[0] if sp_problems else (record.get("error") or ""))
        return CatalogRow(arch.class_name, arch.model_type, "synthesized", sp, _verdict(record, False), note)
    synthesized = record if record and record.get("plan") == "synthesized" else None
    hf_record = (record or {}).get("hf") if synthesized else (record if record and record.get("plan") == "hf" else None)
    return CatalogRow(arch.class_name, arch.model_type, "hf", False, _verdict(hf_record, False), _synthesis_note(model, record))


def _synthesis_note(model: "nn.Module", record: dict[str, Any] | None) -> str:
    """Why a class without a hand-written plan did not get its synthesized one."""
    from plangen.plans.analysis import analyze_model

    analysis = analyze_model(model)
    synthesized = record if record and record.get("plan") == "synthesized" else None
    if not analysis.synthesizable:
        return f"not synthesized: {analysis.problem}"
    if synthesized:
        return f"synthesized plan failed the check: {synthesized.get('error') or 'differs from the unsharded model'}"
    return "synthesized plan not checked yet (scripts/sweep_plans.py)"


def build_catalog(only: Iterable[str] | None = None) -> list[CatalogRow]:
    """Every architecture's row, in class-name order; ``only``: just these model types or class names."""
    from plangen.plans.proven import load_proven

    wanted = set(only) if only is not None else None
    proven = load_proven()
    return [
        build_row(arch, proven)
        for arch in list_architectures()
        if wanted is None or {arch.class_name, arch.model_type, *arch.aliases} & wanted
    ]


# ---------------------------------------------------------------------------------------------
# Rendering (to strings: the CLI prints)


def render_catalog_json(rows: list[CatalogRow]) -> str:
    import torch
    import transformers

    document = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "architectures": [row.to_dict() for row in rows],
    }
    return json.dumps(document, indent=2) + "\n"


def render_catalog_text(rows: list[CatalogRow], width: int = 160) -> str:
    """A rich table: class, model_type, plan, SP, check, note; then a one-line summary."""
    from rich.console import Console
    from rich.table import Table

    cells = [
        (row.class_name, row.model_type, row.plan, "yes" if row.sequence_parallel else "no", row.check, row.note)
        for row in rows
    ]
    headers = ("class", "model_type", "plan", "SP", "check", "note")
    widths = [max([len(name)] + [len(c[i]) for c in cells]) for i, name in enumerate(headers[:-1])]
    # The note is the only column that gives way to a narrow terminal (cut here: rich would squeeze
    # the other columns instead).
    note_width = max(20, width - sum(widths) - 2 * len(widths))
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for name, column_width in zip(headers, [*widths, note_width]):
        table.add_column(name, no_wrap=True, min_width=min(column_width, len(name)) if name == "note" else column_width)
    for *fixed, note in cells:
        table.add_row(*fixed, note if len(note) <= note_width else note[: note_width - 1] + "…")
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False, markup=False)
    console.print(table)
    from plangen.plans.choice import NO_PLAN, SOURCES

    kinds = [*(s for s in SOURCES if s != "custom"), NO_PLAN]  # a listing has no custom plans
    counts = {kind: sum(1 for r in rows if r.plan == kind) for kind in kinds}
    console.print(f"{len(rows)} architectures: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    return buffer.getvalue()

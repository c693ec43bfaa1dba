"""Turn a plan into the text of a plan module (jinja2 templates), and refuse what does not parse.

Three parts, all pure:

* plan data: :func:`build_plan_context` turns a :class:`plangen.plan.Plan` into plain template data:
  entries grouped under :data:`GROUP_TITLES`, every constructor argument written out
  (:func:`complete_kwargs`), a comment per entry with the modules it matches and their local shard
  shape at the TP size (:func:`describe_modules`), the modules left replicated on purpose;
* values: :func:`render_value` writes a keyword argument (placements, tuples, dicts, literals) as
  the Python expression that builds it, and records which placement classes it used, so the
  generated import block names exactly what the file needs;
* templates: :func:`build_environment` loads templates from a user directory first (``--template
  DIR``), then from the package (``templates/`` in the repository, ``plangen.templates`` once
  installed), with ``StrictUndefined`` so a misspelt variable fails instead of rendering empty.

:func:`render_plan_text` is the three together; :func:`plangen.output.files.write_plan_file` parses
the rendered text (libcst) before it writes anything. What a style does to a weight is read from
:mod:`plangen.plan.style_facts`, never restated here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shlex
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from plangen.output.errors import RenderError, one_line
from plangen.model.resolve import record_model_spec
from plangen.model.module_tree import ModuleIndex
from plangen.plan import GROUPS, Plan, PlanEntry
from plangen.plan.style_facts import (
    EXPERTS,
    FLAT_EXPERTS,
    HEAD_TABLE,
    HEADS,
    MIXER,
    SHARED_EXPERTS,
    SHORT_CONV,
)
from plangen.plan.style_table import STYLE_FACTS

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from plangen.model.resolve import ResolvedModel

PLAN_TEMPLATE = "plan.py.j2"
# Comments and imports wrap past LINE_WIDTH; a plan entry stays on one line up to ENTRY_WIDTH, so
# that the usual entries read one a line (the templates decide how to wrap the others).
LINE_WIDTH = 120
ENTRY_WIDTH = 140
DOC_WIDTH = 100  # the docstring's paragraphs


GROUP_TITLES = {
    "embeddings": "Embeddings",
    "attention": "Attention",
    "mlp": "MLP",
    "norms": "Norms",
    "output": "Output head",
    "other": "Other",
}


# ---------------------------------------------------------------------------------------------
# Values


def render_value(value: Any, used: set[str] | None = None) -> str:
    """``value`` as a Python expression: ``Shard(1)``, ``(Replicate(),)``, ``{"x": Shard(1)}``, literals.

    Placement class names are added to ``used`` (when given).
    """
    from torch.distributed.tensor import Partial, Replicate, Shard
    from plangen.stack.torch_compat import is_strided_shard

    used = set() if used is None else used
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if is_strided_shard(value):  # a Shard subclass with no public constructor
        raise RenderError(f"cannot write the private placement {value!r} in a plan file")
    if isinstance(value, Shard):
        used.add("Shard")
        return f"Shard({value.dim})"
    if isinstance(value, Replicate):
        used.add("Replicate")
        return "Replicate()"
    if isinstance(value, Partial):
        used.add("Partial")
        return f"Partial(reduce_op={json.dumps(value.reduce_op)})"
    if isinstance(value, tuple):
        items = [render_value(v, used) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(render_value(v, used) for v in value)}]"
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise RenderError(f"cannot write a dict with the non-string key {key!r} in a plan file")
            pairs.append(f"{render_value(key, used)}: {render_value(item, used)}")
        return "{" + ", ".join(pairs) + "}"
    raise RenderError(f"cannot write a value of type {type(value).__name__} ({value!r}) in a plan file")


def render_arguments(kwargs: Mapping[str, Any], used: set[str] | None = None) -> list[str]:
    """``["name=value", ...]`` in the order given."""
    return [f"{name}={render_value(value, used)}" for name, value in kwargs.items()]


# ---------------------------------------------------------------------------------------------
# Templates


def package_template_dir() -> Path:
    """Where the shipped templates are: ``templates/`` in a checkout, ``plangen/templates`` installed.

    The checkout beside this package first: an editable install elsewhere maps ``plangen.templates``
    to its own checkout, whose template may not match this code.
    """
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if (checkout / PLAN_TEMPLATE).is_file():
        return checkout
    spec = importlib.util.find_spec("plangen.templates")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / PLAN_TEMPLATE).is_file():
                return Path(location)
    raise RenderError("plangen's templates are missing from this installation (plangen.templates)")


def build_environment(template_dir: Path | str | None = None):
    """A jinja2 environment: ``template_dir`` first (a user's overrides), then plangen's templates."""
    import jinja2

    dirs: list[Path] = []
    if template_dir is not None:
        user = Path(template_dir)
        if not user.is_dir():
            raise RenderError(f"--template {user}: no such directory")
        dirs.append(user)
    dirs.append(package_template_dir())
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(d)) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["docstring"] = docstring_text
    return env


def docstring_text(text: object) -> str:
    """``text`` made safe inside a triple-quoted docstring (backslashes and quotes escaped)."""
    return str(text).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def render_template(
    context: Mapping[str, Any], template_dir: Path | str | None = None, name: str = PLAN_TEMPLATE
) -> str:
    """Render template ``name`` with ``context``; template errors become one-line :class:`RenderError`s."""
    import jinja2

    env = build_environment(template_dir)
    try:
        template = env.get_template(name)
        text = template.render(**context)
    except jinja2.TemplateError as err:
        lineno = getattr(err, "lineno", None)
        where = f"{getattr(err, 'filename', None) or name}:{lineno}" if lineno else name
        raise RenderError(f"template {where}: {one_line(getattr(err, 'message', None) or err)}") from None
    except Exception as err:  # a user's template can fail in any way: report it, write nothing
        raise RenderError(f"template {name}: {one_line(err, with_type=True)}") from None
    return text if text.endswith("\n") else text + "\n"


# ---------------------------------------------------------------------------------------------
# Plan data -> template data


def complete_kwargs(style: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``style``, in signature order: the plan's, else the default.

    Placement arguments that torch fills in when None (``ColwiseParallel``'s layouts) are written
    as the placements torch would use, so the file does not depend on those defaults.
    """
    import inspect

    from plangen.styles import STYLE_CLASSES

    cls = STYLE_CLASSES.get(style)
    if cls is None:
        raise RenderError(f"style {style!r} is neither torch's nor plangen's (plangen.styles); cannot write it")
    facts = STYLE_FACTS.get(style)
    effective = {} if facts is None else facts.default_placements()
    parameters = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    unknown = sorted(set(kwargs) - {p.name for p in parameters})
    if unknown:
        raise RenderError(f"{style} takes no argument(s) {', '.join(unknown)}")
    complete: dict[str, Any] = {}
    for p in parameters:
        if p.name in kwargs:
            value = kwargs[p.name]
        elif p.default is not p.empty:
            value = p.default
        else:
            raise RenderError(f"{style} needs the argument {p.name}, which the plan does not give")
        if value is None and p.name in effective:
            value = effective[p.name]
        complete[p.name] = value
    return complete


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _weight_shape(module: "nn.Module", kind: str | None) -> tuple[int, ...] | None:
    import torch

    from plangen.styles.attention import depthwise_conv, head_parameters

    weight = getattr(module, "weight", None)
    if kind in (EXPERTS, SHARED_EXPERTS) and weight is None:  # packed (or shared) experts: their first 3-D weight
        weight = next((p for p in module.parameters(recurse=False) if p.dim() == 3), None)
    elif kind in (FLAT_EXPERTS, SHORT_CONV):  # DBRX's flat experts: w1 [E * ffn, H], as v1 and w2; a short conv's
        weight = module.mlp.w1 if kind == FLAT_EXPERTS else depthwise_conv(module).weight
    elif kind == HEADS:  # the block's own per-head parameter
        weight = next(iter(head_parameters(module).values()))
    elif kind in (MIXER, HEAD_TABLE):  # a Mamba1 mixer's own A_log [channels, state]; CpmAnt's [buckets, heads] table
        weight = (
            getattr(module, "A_log", None)
            if kind == MIXER
            else next(p for p in module.parameters(recurse=False) if p.dim() == 2)
        )
    return tuple(weight.shape) if isinstance(weight, torch.Tensor) else None


def _module_kind(module: "nn.Module", by_heads: bool) -> str | None:
    from plangen.styles.kinds import module_kind  # torch: imported when a model is described

    return module_kind(module, by_heads)


def _count_by_kind(
    modules: list["nn.Module"], by_heads: bool, whole: str | None = None
) -> list[tuple[int, str, tuple[int, ...] | None, str | None, "nn.Module"]]:
    """(count, type name, weight shape, kind, first such module) per distinct (type, shape), in first-seen order."""
    counts: dict[tuple[str, tuple[int, ...] | None, str | None], int] = {}
    first: dict[tuple[str, tuple[int, ...] | None, str | None], "nn.Module"] = {}
    for module in modules:
        kind = whole or _module_kind(module, by_heads)
        key = (type(module).__name__, _weight_shape(module, kind), kind)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, module)
    return [(n, name, shape, kind, first[(name, shape, kind)]) for (name, shape, kind), n in counts.items()]


def describe_modules(modules: list["nn.Module"], style: str | None, tp_size: int) -> str:
    """``16 × Linear [4096, 4096] → local [2048, 4096] at TP=2``, per distinct type and shape.

    ``style`` None: the modules and their weight shapes only.
    """
    if not modules:
        return "matches no module of this model"
    by_heads = style in STYLE_FACTS and HEADS in STYLE_FACTS[style].shard_dim
    whole = next((k for k in (MIXER, HEAD_TABLE) if style in STYLE_FACTS and k in STYLE_FACTS[style].shard_dim), None)
    return ", ".join(_describe_kind(*kind, style, tp_size) for kind in _count_by_kind(modules, by_heads, whole))


def _describe_kind(
    count: int,
    name: str,
    shape: tuple[int, ...] | None,
    kind: str | None,
    module: "nn.Module",
    style: str | None,
    tp_size: int,
) -> str:
    facts = STYLE_FACTS.get(style) if style is not None else None
    shards = facts is not None and facts.shards
    what = f"{count} × {name}"
    if shape is None:
        return f"{what} (no weight)" if shards else what
    what += f" {_shape(shape)}"
    if facts is None:
        return what
    if facts.replicates:
        return f"{what}, replicated at TP={tp_size}"
    dim = facts.shard_dim.get(kind) if kind else None
    if kind == EXPERTS and style == "ExpertsParallel":
        from plangen.styles.experts import expert_count, expert_layout_of, identity_expert_count

        if expert_layout_of(module, tp_size) == "intermediate":
            local = list(shape)
            local[1] = math.ceil(shape[1] / tp_size)  # [E, 2I, H]: a slice of gate and of up per rank
            why = (
                f"beside {identity_expert_count(module)} identity experts"
                if identity_expert_count(module)
                else f"{expert_count(module)} experts do not divide by the TP size"
            )
            return f"{what} → local {_shape(tuple(local))} at TP={tp_size}: each expert's intermediate split ({why})"
    if dim is not None and dim < len(shape):
        local = list(shape)
        local[dim] = math.ceil(shape[dim] / tp_size)
        uneven = " (uneven split)" if shape[dim] % tp_size else ""
        return f"{what} → local {_shape(tuple(local))} at TP={tp_size}{uneven}"
    if shards:
        return f"{what} (not an nn.Linear or nn.Embedding: {style} cannot shard it)"
    return what


def _comment_lines(*parts: str, indent: int = 4) -> list[str]:
    """``parts`` joined by ``; `` as one comment line when it fits :data:`LINE_WIDTH`, else one part a
    line (each wrapped if it must be); without the ``# `` and the indent."""
    width = LINE_WIDTH - indent - 2
    parts = tuple(p for p in parts if p)
    if len("; ".join(parts)) <= width:
        return ["; ".join(parts)] if parts else []
    lines: list[str] = []
    for part in parts:
        lines += textwrap.wrap(part, width=width, break_long_words=False, break_on_hyphens=False)
    return lines


def _python_path(path: Path) -> str:
    """The dotted name a relative ``a/b/c.py`` imports as from the current directory, else the file path."""
    parts = path.with_suffix("").parts
    if not path.is_absolute() and path.suffix == ".py" and parts and all(p.isidentifier() for p in parts):
        return ".".join(parts) + ".custom_parallel_plan"
    return str(path)


def installed_versions() -> dict[str, str]:
    import torch
    import transformers

    from plangen import __version__

    return {"plangen": __version__, "transformers": transformers.__version__, "torch": torch.__version__}


def build_plan_context(
    model: "nn.Module",
    resolved: "ResolvedModel",
    plan: Plan,
    seed: str,
    *,
    output: Path,
    tp_size: int,
    sequence_parallel: bool,
    command: str,
    versions: Mapping[str, str],
    variant: str = "optimized",
    target: str = "plangen",
) -> dict[str, Any]:
    """Plain data for the plan template: header facts, what the file relies on, imports, constants,
    grouped entries."""
    from plangen.plans.tied import tie_plan_entries

    plan = tie_plan_entries(model, plan)  # any seed (a Hugging Face plan too) keeps a tie by itself
    index = ModuleIndex(model)
    placements: set[str] = set()
    imports: dict[str, set[str]] = {"torch.distributed.tensor.parallel": {"ParallelStyle"}}
    grouped: dict[str, dict[str, list]] = {g: {"entries": [], "replicated": []} for g in GROUPS}

    from plangen.model.heads import head_counts

    counts = head_counts(model.config) if hasattr(model, "config") else None
    kv_replicated = counts is not None and counts[1] % tp_size != 0  # plangen.styles.kv_heads' case
    for entry in plan.entries:
        context = _entry_context(entry, index, tp_size, placements, imports, kv_replicated=kv_replicated)
        grouped[_group(entry)]["entries"].append(context)
    for kept in plan.replicated:
        group = grouped[kept.group if kept.group in grouped else "other"]["replicated"]
        item = {
            "pattern": render_value(kept.pattern),
            "description": describe_modules(index.matching(kept.pattern), None, tp_size),
        }
        for reason in group:
            if reason["why"] == kept.why:
                reason["modules"].append(item)
                break
        else:
            lines = _comment_lines(
                f"Left replicated on purpose: {kept.why}" if kept.why else "Left replicated on purpose"
            )
            group.append({"why": kept.why, "why_lines": lines, "modules": [item]})

    if placements:
        imports["torch.distributed.tensor"] = placements
    module_order = ["torch.distributed.tensor", "torch.distributed.tensor.parallel", "plangen.styles"]
    import_blocks = [
        {"module": module, "names": sorted(imports[module])} for module in module_order if module in imports
    ]
    return {
        "width": LINE_WIDTH,
        "entry_width": ENTRY_WIDTH,
        "model": {
            "spec": resolved.spec,
            "class_name": type(model).__name__,
            "name": resolved.name,
        },
        "tp_size": tp_size,
        "sequence_parallel": sequence_parallel,
        "seed": seed,
        "command": command,
        "versions": dict(versions),
        "plan_path": _python_path(output),
        "verify_command": shlex.join(["plangen", "verify", str(output)]),
        "relies_on": _wrap_paragraph(reliance(model, plan), DOC_WIDTH),
        "target_lines": _wrap_paragraph(target_note(target, type(model).__name__), DOC_WIDTH)
        if target != "plangen"
        else [],
        "imports": import_blocks,
        "constants": [
            {"name": "PLANGEN_MODEL", "value": render_value(record_model_spec(resolved, output))},
            {"name": "PLANGEN_TP_SIZE", "value": repr(tp_size)},
            {"name": "PLANGEN_SEQUENCE_PARALLEL", "value": repr(bool(sequence_parallel))},
            # Only where not the default: files of the optimized plans stay as they were.
            *([{"name": "PLANGEN_PLAN_VARIANT", "value": render_value(variant)}] if variant != "optimized" else []),
            *([{"name": "PLANGEN_TARGET", "value": render_value(target)}] if target != "plangen" else []),
        ],
        "groups": [
            {"key": g, "title": GROUP_TITLES[g], **grouped[g]}
            for g in GROUPS
            if grouped[g]["entries"] or grouped[g]["replicated"]
        ],
    }


def target_note(name: str, class_name: str) -> str:
    """The header's paragraph on the runtime the file is for (``plangen init --target``)."""
    from plangen.plan.targets import TARGETS

    target = TARGETS[name]
    own = class_name in target.own_moe_classes
    wrong = dict(target.own_classes_measured_wrong).get(class_name)
    return (
        f"Target: {target.name}, {target.runtime}. It takes {target.plan_forms}"
        + (
            "; it never re-ties a tied embedding and head (this file's styles keep them one parameter)"
            if not target.reties
            else ""
        )
        + ("; it refuses attention or key/value heads the TP size does not divide" if target.heads_divide_tp else "")
        + (
            f". It swaps in MoE code of its own for {class_name}, which refuses tensor parallelism and this"
            f" plan's keys on experts and routers: set {target.own_code_setting}, which takes this plan"
            if own
            else ""
        )
        + (f". By default {wrong}: set {target.own_code_setting}, under which this plan trains exact" if wrong else "")
        + ". `plangen verify` checks its rules (PLANGEN_TARGET)."
    )


def reliance(model: "nn.Module", plan: Plan) -> str:
    """What a runtime must do for the file to be right, and what the file does by itself."""
    from plangen.model.module_tree import shared_parameters_beyond_tie, tied_embeddings

    styles = {entry.style for entry in plan.entries}
    tied = tied_embeddings(model)
    own = sorted(s for s in styles if STYLE_FACTS[s].module != "torch.distributed.tensor.parallel")
    text = (
        "It relies only on a runtime that calls parallelize_module(model, tp_mesh, custom_parallel_plan) and then"
        " FSDP2 (fully_shard per decoder layer and on the root), as NeMo RL's _parallelize_model does; nothing"
        " from plangen's runtime"
        + (f", though plangen.styles must be importable there (for {', '.join(own)})." if own else ".")
    )
    shared = shared_parameters_beyond_tie(model)
    if shared:
        text += (
            f" Except: {len(shared)} parameters are held by several modules (as {shared[0][0]} and {shared[0][1]}):"
            " only a runtime that makes them one again after parallelize_module (plangen's) trains each as one."
        )
    if any(STYLE_FACTS[s].role == "grad_reduce" for s in styles):
        text += " Per-head norms see only their rank's heads: their style sums their weight gradient over TP."
    if tied is not None and {"TiedEmbeddingParallel", "TiedHeadParallel"} <= styles:
        text += (
            f" {tied[0]} and {tied[1]} share one weight: TiedEmbeddingParallel and TiedHeadParallel keep it one"
            " parameter, sharded once on the vocabulary by whichever is applied first, so no re-tie is needed;"
            " keep the two together (one alone leaves two parameters, which plangen verify reports)."
        )
    elif tied is not None:
        text += (
            f" {tied[0]} and {tied[1]} share one weight, which this plan does not keep together by itself:"
            " only a runtime that re-ties them (plangen's) trains it as one parameter."
        )
    if any(
        e.style in ("ColwiseParallel", "TiedHeadParallel")
        and e.kwargs.get("use_local_output") is False
        and str(e.kwargs.get("output_layouts")) == str(_vocab_shard())
        for e in plan.entries
        if e.group == "output"
    ):
        text += (
            " The logits leave as a DTensor sharded on the vocabulary: the loss must take it"
            " (plangen.loss.vocab_parallel_cross_entropy, or torch's loss_parallel())."
        )
    return text


def _vocab_shard() -> Any:
    from torch.distributed.tensor import Shard

    return Shard(-1)


def _wrap_paragraph(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)


def _group(entry: PlanEntry | Any) -> str:
    return entry.group if entry.group in GROUPS else "other"


def _entry_context(
    entry: PlanEntry,
    index: ModuleIndex,
    tp_size: int,
    placements: set[str],
    imports: dict[str, set[str]],
    *,
    kv_replicated: bool = False,
) -> dict[str, Any]:
    kwargs = complete_kwargs(entry.style, entry.kwargs)
    try:
        arguments = render_arguments(kwargs, placements)
    except RenderError as err:
        raise RenderError(f"{entry.pattern}: {err}") from None
    imports.setdefault(STYLE_FACTS[entry.style].module, set()).add(entry.style)
    modules = index.matching(entry.pattern)
    description = describe_modules(modules, entry.style, tp_size)
    if entry.style == "KVHeadsColwiseParallel" and kv_replicated and modules:
        description = (
            f"{describe_modules(modules, None, tp_size)}, replicated at TP={tp_size}: more TP ranks than KV heads,"
            " each rank computes the one its query heads use"
        )
    if entry.style.startswith("Prepare") and entry.why:  # no weights: say what it does instead
        comment_lines = _comment_lines(f"{description}: {entry.why}")
    else:
        comment_lines = _comment_lines(description, entry.why)
    return {
        "pattern": render_value(entry.pattern),
        "style": entry.style,
        "arguments": arguments,
        "call": f"{entry.style}({', '.join(arguments)})",
        "comment_lines": comment_lines,
    }


def render_plan_text(
    model: "nn.Module",
    resolved: "ResolvedModel",
    plan: Plan,
    seed: str,
    *,
    output: Path,
    tp_size: int,
    sequence_parallel: bool,
    command: str,
    versions: Mapping[str, str] | None = None,
    template_dir: Path | str | None = None,
    variant: str = "optimized",
    target: str = "plangen",
) -> str:
    """The plan module's text for ``plan`` on ``model`` (``versions``: those installed when None)."""
    context = build_plan_context(
        model,
        resolved,
        plan,
        seed,
        output=output,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        command=command,
        versions=versions if versions is not None else installed_versions(),
        variant=variant,
        target=target,
    )
    return render_template(context, template_dir)

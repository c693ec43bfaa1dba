"""``plangen init``: write an editable custom-plan module for a model, seeded with its best plan.

The work is split so each part can be tested alone:

* :func:`load_model` resolves the MODEL spec and builds it on the meta device (real shapes, no memory);
* :func:`build_seed_plan` picks the seed: the optimized plan (hand-written or synthesized) when the
  class has one, else the model's Hugging Face plan translated to torch styles;
* :func:`build_plan_context` turns the plan into plain template data: entries grouped, every
  constructor argument written out, a comment per entry with the modules it matches and the
  local shard shape at the TP size, the modules left replicated on purpose;
* :func:`render_plan_module` renders the template (no I/O besides reading templates);
* :func:`write_plan_file` refuses text that does not parse, never replaces a file without
  ``force`` (and then keeps it as ``*.bak``), and writes atomically;
* :func:`init_plan` is the command: all of the above, errors as one-line :class:`InitError`.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import stat
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from plangen.plan import GROUPS, Plan, PlanEntry
from plangen.render import ENTRY_WIDTH, LINE_WIDTH, RenderError, check_python, render_arguments, render_template

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from plangen.models import ResolvedModel

DEFAULT_TP_SIZE = 2
DEFAULT_DIR = Path("generated")

GROUP_TITLES = {
    "embeddings": "Embeddings",
    "attention": "Attention",
    "mlp": "MLP",
    "norms": "Norms",
    "output": "Output head",
    "other": "Other",
}

# Where each style splits a weight, by module kind: (style, "linear" | "embedding") -> weight dim.
WEIGHT_SHARD_DIM = {
    ("ColwiseParallel", "linear"): 0,  # output features
    ("RowwiseParallel", "linear"): 1,  # input features
    ("ColwiseParallel", "embedding"): 1,  # hidden dim
    ("RowwiseParallel", "embedding"): 0,  # vocabulary
    ("PackedColwiseParallel", "linear"): 0,
    ("PackedRowwiseParallel", "linear"): 1,
}
WEIGHT_SHARD_DIM_STYLES = frozenset(style for style, _ in WEIGHT_SHARD_DIM)
# Styles whose module keeps its weights whole on every rank.
REPLICATING_STYLES = frozenset(
    {
        "SequenceParallel",
        "ReplicatedWithGradAllReduce",
        "AllReduceParamGrads",
        "LeaveUnsharded",
        "MlaKvAProjParallel",
        "RotaryEmbedParallel",
    }
)


def _effective_defaults() -> dict[str, dict[str, Any]]:
    """What torch does when a style's placement argument is None, written out instead of relied on."""
    from torch.distributed.tensor import Replicate, Shard

    return {
        "ColwiseParallel": {"input_layouts": Replicate(), "output_layouts": Shard(-1)},
        "RowwiseParallel": {"input_layouts": Shard(-1), "output_layouts": Replicate()},
        "PackedColwiseParallel": {"input_layouts": Replicate()},
        "PackedRowwiseParallel": {"output_layouts": Replicate()},
    }


class InitError(ValueError):
    """``plangen init`` cannot do what was asked; the message is one line and says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class LoadedModel:
    resolved: "ResolvedModel"
    model: "nn.Module"


@dataclass(frozen=True)
class RenderedPlan:
    """A rendered plan module, not yet written."""

    path: Path
    text: str
    seed: str
    plan: Plan
    model_class: str


@dataclass(frozen=True)
class WriteOutcome:
    path: Path
    backup: Path | None = None
    unchanged: bool = False


@dataclass(frozen=True)
class InitResult:
    path: Path
    seed: str
    model_class: str
    tp_size: int
    sequence_parallel: bool
    backup: Path | None
    unchanged: bool
    next_command: str


# ---------------------------------------------------------------------------------------------
# Model and seed


def resolve(spec: str) -> "ResolvedModel":
    """Resolve ``spec`` as the runtime does (model_type, class name, config path, cached hub id)."""
    from plangen.models import ModelSpecError, resolve_model

    try:
        return resolve_model(spec)
    except ModelSpecError as err:
        raise InitError(str(err)) from None


def load_model(spec: "str | ResolvedModel") -> LoadedModel:
    """Resolve ``spec`` (unless already resolved) and build the model on the meta device."""
    from plangen.models import build_meta_model

    resolved = resolve(spec) if isinstance(spec, str) else spec
    try:
        model = build_meta_model(resolved)
    except Exception as err:  # transformers raises many types for a config it cannot build
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InitError(f"cannot build {resolved.model_class.__name__} from {resolved.spec!r}: {first}") from None
    return LoadedModel(resolved, model)


def check_tp_size(config: Any, tp_size: int, model_name: str) -> None:
    """Refuse a TP size below 1 or one the attention heads cannot be split by (naming the largest legal one)."""
    from plangen.heads import tp_size_problem

    if tp_size < 1:
        raise InitError(f"--tp-size must be at least 1, got {tp_size}")
    problem = tp_size_problem(config, tp_size, model_name)
    if problem is not None:
        raise InitError(f"--tp-size {tp_size}: {problem}")


def build_seed_plan(model: "nn.Module", sequence_parallel: bool) -> tuple[Plan, str]:
    """The plan the file starts from (the runtime's own choice, :func:`plangen.plans.build_seed_plan`),
    and a short description of where it came from."""
    from plangen.plans import build_seed_plan as build_runtime_seed
    from plangen.plans.proven import is_proven

    cls = type(model).__name__
    try:
        plan = build_runtime_seed(model, sequence_parallel)
    except ValueError as err:
        raise InitError(f"--sequence-parallel: {err}" if sequence_parallel else str(err)) from None
    if plan.source == "synthesized":
        proof = (
            "numerically proven for the class" if is_proven(cls, sequence_parallel)
            else "not numerically proven: check it with plangen verify --run"
        )
        return plan, f"the plan synthesized from the module tree of {cls} ({proof})"
    if plan.source == "hf":
        return plan, f"the Hugging Face plan of {cls} (its _tp_plan, translated to torch styles)"
    return plan, f"the {plan.source} plan for {cls}"


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
        raise InitError(f"style {style!r} is neither torch's nor plangen's (plangen.styles); cannot write it")
    effective = _effective_defaults().get(style, {})
    parameters = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    unknown = sorted(set(kwargs) - {p.name for p in parameters})
    if unknown:
        raise InitError(f"{style} takes no argument(s) {', '.join(unknown)}")
    complete: dict[str, Any] = {}
    for p in parameters:
        if p.name in kwargs:
            value = kwargs[p.name]
        elif p.default is not p.empty:
            value = p.default
        else:
            raise InitError(f"{style} needs the argument {p.name}, which the plan does not give")
        if value is None and p.name in effective:
            value = effective[p.name]
        complete[p.name] = value
    return complete


def _style_module(style: str) -> str:
    from plangen.styles import STYLE_CLASSES

    module = STYLE_CLASSES[style].__module__
    if module.startswith("torch."):
        return "torch.distributed.tensor.parallel"
    if module == "plangen.styles":
        return "plangen.styles"
    raise InitError(f"style {style} comes from {module}: only torch's styles and plangen.styles can be written")


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _module_kind(module: "nn.Module") -> str | None:
    from torch import nn

    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, nn.Linear):
        return "linear"
    return None


def _weight_shape(module: "nn.Module") -> tuple[int, ...] | None:
    import torch

    weight = getattr(module, "weight", None)
    return tuple(weight.shape) if isinstance(weight, torch.Tensor) else None


def _count_by_kind(modules: list["nn.Module"]) -> list[tuple[int, str, tuple[int, ...] | None, str | None]]:
    """(count, type name, weight shape, kind) per distinct (type, shape), in first-seen order."""
    counts: dict[tuple[str, tuple[int, ...] | None, str | None], int] = {}
    for module in modules:
        key = (type(module).__name__, _weight_shape(module), _module_kind(module))
        counts[key] = counts.get(key, 0) + 1
    return [(n, name, shape, kind) for (name, shape, kind), n in counts.items()]


def describe_modules(modules: list["nn.Module"], style: str | None, tp_size: int) -> str:
    """``16 × Linear [4096, 4096] → local [2048, 4096] at TP=2``, per distinct type and shape.

    ``style`` None: the modules and their weight shapes only.
    """
    if not modules:
        return "matches no module of this model"
    return ", ".join(_describe_kind(*kind, style, tp_size) for kind in _count_by_kind(modules))


def _describe_kind(
    count: int, name: str, shape: tuple[int, ...] | None, kind: str | None, style: str | None, tp_size: int
) -> str:
    what = f"{count} × {name}"
    if shape is None:
        return f"{what} (no weight)" if style in WEIGHT_SHARD_DIM_STYLES else what
    what += f" {_shape(shape)}"
    if style is None:
        return what
    if style in REPLICATING_STYLES:
        return f"{what}, replicated at TP={tp_size}"
    dim = WEIGHT_SHARD_DIM.get((style, kind)) if kind else None
    if dim is not None and dim < len(shape):
        local = list(shape)
        local[dim] = math.ceil(shape[dim] / tp_size)
        uneven = " (uneven split)" if shape[dim] % tp_size else ""
        return f"{what} → local {_shape(tuple(local))} at TP={tp_size}{uneven}"
    if style in WEIGHT_SHARD_DIM_STYLES:
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


class _ModuleIndex:
    """The named modules of a model, pre-split, for fast pattern matching (torch's fnmatch rule)."""

    def __init__(self, model: "nn.Module") -> None:
        self.modules = [(name.split("."), module) for name, module in model.named_modules() if name]

    def matching(self, pattern: str) -> list["nn.Module"]:
        from fnmatch import translate

        atoms = pattern.split(".")
        regexes = [re.compile(translate(a)) for a in atoms]
        return [
            module
            for parts, module in self.modules
            if len(parts) == len(atoms) and all(r.match(p) for r, p in zip(regexes, parts))
        ]


def _python_path(path: Path) -> str:
    """The dotted name a relative ``a/b/c.py`` imports as from the current directory, else the file path."""
    parts = path.with_suffix("").parts
    if not path.is_absolute() and path.suffix == ".py" and parts and all(p.isidentifier() for p in parts):
        return ".".join(parts) + ".custom_parallel_plan"
    return str(path)


def regenerate_command(
    spec: str, output: Path, tp_size: int, sequence_parallel: bool, template_dir: Path | str | None = None
) -> str:
    args = ["plangen", "init", spec, "-o", str(output), "--tp-size", str(tp_size)]
    if sequence_parallel:
        args.append("--sequence-parallel")
    if template_dir is not None:
        args += ["--template", str(template_dir)]
    args.append("--force")
    return shlex.join(args)


def installed_versions() -> dict[str, str]:
    import torch
    import transformers

    from plangen import __version__

    return {"plangen": __version__, "transformers": transformers.__version__, "torch": torch.__version__}


def build_plan_context(
    loaded: LoadedModel,
    plan: Plan,
    seed: str,
    *,
    output: Path,
    tp_size: int,
    sequence_parallel: bool,
    command: str,
    versions: Mapping[str, str],
) -> dict[str, Any]:
    """Plain data for the plan template: header facts, imports, constants, grouped entries."""
    index = _ModuleIndex(loaded.model)
    placements: set[str] = set()
    imports: dict[str, set[str]] = {"torch.distributed.tensor.parallel": {"ParallelStyle"}}
    grouped: dict[str, dict[str, list]] = {g: {"entries": [], "replicated": []} for g in GROUPS}

    for entry in plan.entries:
        grouped[_group(entry)]["entries"].append(_entry_context(entry, index, tp_size, placements, imports))
    for kept in plan.replicated:
        group = grouped[kept.group if kept.group in grouped else "other"]["replicated"]
        item = {"pattern": _literal(kept.pattern), "description": describe_modules(index.matching(kept.pattern), None, tp_size)}
        for reason in group:
            if reason["why"] == kept.why:
                reason["modules"].append(item)
                break
        else:
            lines = _comment_lines(f"Left replicated on purpose: {kept.why}" if kept.why else "Left replicated on purpose")
            group.append({"why": kept.why, "why_lines": lines, "modules": [item]})

    if placements:
        imports["torch.distributed.tensor"] = placements
    module_order = ["torch.distributed.tensor", "torch.distributed.tensor.parallel", "plangen.styles"]
    import_blocks = [
        {"module": module, "names": sorted(imports[module])} for module in module_order if module in imports
    ]
    model_class = type(loaded.model).__name__
    return {
        "width": LINE_WIDTH,
        "entry_width": ENTRY_WIDTH,
        "model": {
            "spec": loaded.resolved.spec,
            "class_name": model_class,
            "name": loaded.resolved.name,
        },
        "tp_size": tp_size,
        "sequence_parallel": sequence_parallel,
        "seed": seed,
        "command": command,
        "versions": dict(versions),
        "plan_path": _python_path(output),
        "verify_command": shlex.join(["plangen", "verify", str(output)]),
        "imports": import_blocks,
        "constants": [
            {"name": "PLANGEN_MODEL", "value": _literal(loaded.resolved.spec)},
            {"name": "PLANGEN_TP_SIZE", "value": repr(tp_size)},
            {"name": "PLANGEN_SEQUENCE_PARALLEL", "value": repr(bool(sequence_parallel))},
        ],
        "groups": [
            {"key": g, "title": GROUP_TITLES[g], **grouped[g]}
            for g in GROUPS
            if grouped[g]["entries"] or grouped[g]["replicated"]
        ],
    }


def _group(entry: PlanEntry | Any) -> str:
    return entry.group if entry.group in GROUPS else "other"


def _literal(text: str) -> str:
    from plangen.render import render_value

    return render_value(text)


def _entry_context(
    entry: PlanEntry,
    index: _ModuleIndex,
    tp_size: int,
    placements: set[str],
    imports: dict[str, set[str]],
) -> dict[str, Any]:
    kwargs = complete_kwargs(entry.style, entry.kwargs)
    try:
        arguments = render_arguments(kwargs, placements)
    except RenderError as err:
        raise InitError(f"{entry.pattern}: {err}") from None
    imports.setdefault(_style_module(entry.style), set()).add(entry.style)
    modules = index.matching(entry.pattern)
    description = describe_modules(modules, entry.style, tp_size)
    if entry.style.startswith("PrepareModule") and entry.why:  # no weights: say what it does instead
        comment_lines = _comment_lines(f"{description}: {entry.why}")
    else:
        comment_lines = _comment_lines(description, entry.why)
    return {
        "pattern": _literal(entry.pattern),
        "style": entry.style,
        "arguments": arguments,
        "call": f"{entry.style}({', '.join(arguments)})",
        "comment_lines": comment_lines,
    }


# ---------------------------------------------------------------------------------------------
# Render and write


def module_name(name: str) -> str:
    """A model name as a Python identifier for file names: ``llama-3.1-8b`` -> ``llama_3_1_8b``."""
    cleaned = re.sub(r"\W+", "_", name).strip("_").lower() or "model"
    return f"m_{cleaned}" if cleaned[0].isdigit() else cleaned


def default_output(name: str, sequence_parallel: bool) -> Path:
    return DEFAULT_DIR / f"{module_name(name)}{'_sp' if sequence_parallel else ''}_plan.py"


def render_plan_module(
    spec: str,
    output: Path | str | None = None,
    *,
    tp_size: int = DEFAULT_TP_SIZE,
    sequence_parallel: bool = False,
    template_dir: Path | str | None = None,
    versions: Mapping[str, str] | None = None,
    loaded: LoadedModel | None = None,
) -> RenderedPlan:
    """Render the plan module for ``spec`` (nothing written). ``loaded`` reuses a model already built."""
    if tp_size < 1:
        raise InitError(f"--tp-size must be at least 1, got {tp_size}")
    if loaded is None:
        resolved = resolve(spec)
        # Refuse a bad TP size before building anything.
        check_tp_size(resolved.config, tp_size, resolved.model_class.__name__)
        loaded = load_model(resolved)
    check_tp_size(loaded.model.config, tp_size, type(loaded.model).__name__)
    path = Path(output) if output is not None else default_output(loaded.resolved.name, sequence_parallel)
    plan, seed = build_seed_plan(loaded.model, sequence_parallel)
    context = build_plan_context(
        loaded,
        plan,
        seed,
        output=path,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        command=regenerate_command(spec, path, tp_size, sequence_parallel, template_dir),
        versions=versions if versions is not None else installed_versions(),
    )
    try:
        text = render_template(context, template_dir)
    except RenderError as err:
        raise InitError(str(err)) from None
    return RenderedPlan(path, text, seed, plan, type(loaded.model).__name__)


def write_plan_file(path: Path | str, text: str, *, force: bool = False) -> WriteOutcome:
    """Write ``text`` to ``path`` atomically, after checking that it parses as Python.

    An existing file is replaced only with ``force``, and its previous content is kept beside it
    as ``<name>.bak``; a file already holding ``text`` is left alone. Nothing is written when the
    text does not parse or any step fails.
    """
    path = Path(path)
    try:
        check_python(text, f"the rendered plan for {path}")
    except RenderError as err:
        raise InitError(str(err)) from None
    if path.is_dir():
        raise InitError(f"{path} is a directory; pass a .py file path with -o")
    data = text.encode("utf-8")
    exists = path.exists()
    if exists:
        try:
            if path.read_bytes() == data:
                return WriteOutcome(path, unchanged=True)
        except OSError as err:
            raise InitError(f"cannot read the existing {path}: {err.strerror or err}") from None
        if not force:
            raise InitError(f"{path} already exists; pass --force to replace it (the old file is kept as {_backup(path)})")

    created = _make_parents(path.parent)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        backup = None
        if exists:
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
            backup = _backup(path)
            _copy_atomically(path, backup)
            os.replace(tmp, path)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
            try:
                os.link(tmp, path)  # fails if a file appeared meanwhile: never replace one silently
            except FileExistsError:
                raise InitError(f"{path} appeared while writing; pass --force to replace it") from None
            os.unlink(tmp)
        tmp = None
        return WriteOutcome(path, backup=backup)
    except OSError as err:
        raise InitError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if not path.exists():
            for directory in reversed(created):
                try:
                    directory.rmdir()
                except OSError:
                    break


def _backup(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def _copy_atomically(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(src.read_bytes())
        os.chmod(tmp, stat.S_IMODE(src.stat().st_mode))
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _make_parents(directory: Path) -> list[Path]:
    """Create missing parent directories; return the ones created (outermost first)."""
    missing = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except OSError as err:
            for c in reversed(created):
                try:
                    c.rmdir()
                except OSError:
                    pass
            raise InitError(f"cannot create {d}: {err.strerror or err}") from None
        created.append(d)
    return created


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def init_plan(
    spec: str,
    output: Path | str | None = None,
    *,
    tp_size: int = DEFAULT_TP_SIZE,
    sequence_parallel: bool = False,
    force: bool = False,
    template_dir: Path | str | None = None,
    loaded: LoadedModel | None = None,
) -> InitResult:
    """``plangen init``: render the plan module for ``spec`` and write it. Raises :class:`InitError`."""
    if tp_size < 1:
        raise InitError(f"--tp-size must be at least 1, got {tp_size}")
    if output is not None and Path(output).suffix != ".py":
        raise InitError(f"-o {output}: a plan module must be a .py file")
    if template_dir is not None and not Path(template_dir).is_dir():
        raise InitError(f"--template {template_dir}: no such directory")
    rendered = render_plan_module(
        spec,
        output,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        template_dir=template_dir,
        loaded=loaded,
    )
    outcome = write_plan_file(rendered.path, rendered.text, force=force)
    return InitResult(
        path=outcome.path,
        seed=rendered.seed,
        model_class=rendered.model_class,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        backup=outcome.backup,
        unchanged=outcome.unchanged,
        next_command=shlex.join(["plangen", "verify", str(outcome.path)]),
    )

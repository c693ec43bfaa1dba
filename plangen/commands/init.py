"""``plangen init``: write an editable custom-plan module for a model, seeded with its best plan.

The command's flow, each step testable alone:

* :func:`load_model` resolves the MODEL spec and builds it on the meta device (real shapes, no memory);
* :func:`build_seed_plan` picks the seed by the runtime's own priority (hand-written, proven
  synthesized, Hugging Face), else an unproven synthesized plan to edit and verify;
* :func:`render_plan_module` checks the TP size once, takes the seed and renders it
  (:func:`plangen.commands.render.render_plan_text`: the plan as template data, then the template);
* :func:`init_plan` is the command: all of the above, then :func:`plangen.output.files.write_plan_file`
  (refuses text that does not parse, never replaces a file without ``force`` and then keeps it
  as ``*.bak``, writes atomically); every error is one line (:class:`InitError`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from plangen.output.files import check_output_path, write_plan_file
from plangen.plan import Plan
from plangen.commands.render import render_plan_text
from plangen.output.errors import InitError

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from plangen.model.resolve import ResolvedModel

DEFAULT_TP_SIZE = 2
DEFAULT_DIR = Path("generated")


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
class InitResult:
    path: Path
    seed: str
    model_class: str
    tp_size: int
    sequence_parallel: bool
    backup: Path | None
    variant: str
    unchanged: bool
    next_command: str


# ---------------------------------------------------------------------------------------------
# Model and seed


def resolve(spec: str) -> "ResolvedModel":
    """Resolve ``spec`` as the runtime does (model_type, class name, config path, cached hub id)."""
    from plangen.model.resolve import ModelSpecError, resolve_model

    try:
        return resolve_model(spec)
    except ModelSpecError as err:
        raise InitError(str(err)) from None


def load_model(spec: "str | ResolvedModel") -> LoadedModel:
    """Resolve ``spec`` (unless already resolved) and build the model on the meta device."""
    from plangen.model.resolve import build_meta_model

    resolved = resolve(spec) if isinstance(spec, str) else spec
    try:
        model = build_meta_model(resolved)
    except Exception as err:  # transformers raises many types for a config it cannot build
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InitError(f"cannot build {resolved.model_class.__name__} from {resolved.spec!r}: {first}") from None
    return LoadedModel(resolved, model)


def check_seed_plan_heads(model: "nn.Module", plan: Plan, tp_size: int) -> None:
    """A seed plan that does not replicate KV heads (plangen.styles.kv_heads) needs the TP size to divide them;
    one that pads the query heads (plangen.styles.padded_heads) needs every rank to keep a real head."""
    from plangen.styles import build_parallel_styles
    from plangen.plans.checks import plan_heads_problem

    problem = plan_heads_problem(model, build_parallel_styles(plan), tp_size)
    if problem is not None:
        raise InitError(f"--tp-size {tp_size}: {problem}")


def check_seed_plan_splits(model: "nn.Module", plan: Plan, tp_size: int) -> None:
    """Refuse a seed plan whose sharded dimensions do not divide by the TP size, as ``plangen verify``
    would (PG204, the same rule): a file written only to be rejected helps nobody."""
    from plangen.check.model import build_model_plan
    from plangen.check.rules.model.shapes import DivisibilityRule
    from plangen.styles import build_parallel_styles

    model_plan = build_model_plan(model, build_parallel_styles(plan), tp_size)
    problem = next(iter(DivisibilityRule().check(model_plan)), None)
    if problem is not None:
        raise InitError(f"--tp-size {tp_size}: {problem.message}")


def build_seed_plan(model: "nn.Module", sequence_parallel: bool, variant: str = "optimized") -> tuple[Plan, str]:
    """The plan the file starts from (:func:`plangen.plans.choice.choose_plan`, which may seed from an
    unproven synthesized plan), as ``variant`` (:mod:`plangen.plans.variants`), and a short
    description of where it came from."""
    from plangen.plans.choice import choose_plan
    from plangen.plan import VariantError

    try:
        chosen = choose_plan(model, sequence_parallel, allow_unproven=True, variant=variant)
    except VariantError as err:
        raise InitError(f"--variant {variant}: {err}") from None
    except ValueError as err:
        raise InitError(f"--sequence-parallel: {err}" if sequence_parallel else str(err)) from None
    assert chosen.plan is not None
    stable = ", stable variant: no cross-rank sums in the forward" if variant == "stable" else ""
    return chosen.plan, chosen.describe() + stable


def check_variant_option(variant: str) -> str:
    """``--variant`` as a one-line :class:`InitError` when it names no variant."""
    from plangen.plan import VariantError, check_variant

    try:
        return check_variant(variant)
    except VariantError as err:
        raise InitError(f"--variant: {err}") from None


def check_target_option(target: str) -> None:
    """``--target`` as a one-line :class:`InitError` when it names no runtime."""
    from plangen.plan.targets import TargetError, check_target

    try:
        check_target(target)
    except TargetError as err:
        raise InitError(f"--target: {err}") from None


# ---------------------------------------------------------------------------------------------
# Render and write


def regenerate_command(
    spec: str,
    output: Path,
    tp_size: int,
    sequence_parallel: bool,
    template_dir: Path | str | None = None,
    variant: str = "optimized",
    target: str = "plangen",
) -> str:
    args = ["plangen", "init", spec, "-o", str(output), "--tp-size", str(tp_size)]
    if sequence_parallel:
        args.append("--sequence-parallel")
    if variant != "optimized":
        args += ["--variant", variant]
    if target != "plangen":
        args += ["--target", target]
    if template_dir is not None:
        args += ["--template", str(template_dir)]
    args.append("--force")
    return shlex.join(args)


def module_name(name: str) -> str:
    """A model name as a Python identifier for file names: ``llama-3.1-8b`` -> ``llama_3_1_8b``."""
    cleaned = re.sub(r"\W+", "_", name).strip("_").lower() or "model"
    return f"m_{cleaned}" if cleaned[0].isdigit() else cleaned


def default_output(name: str, sequence_parallel: bool, variant: str = "optimized") -> Path:
    stable = "_stable" if variant == "stable" else ""
    return DEFAULT_DIR / f"{module_name(name)}{'_sp' if sequence_parallel else ''}{stable}_plan.py"


def render_plan_module(
    spec: str,
    output: Path | str | None = None,
    *,
    tp_size: int = DEFAULT_TP_SIZE,
    sequence_parallel: bool = False,
    template_dir: Path | str | None = None,
    versions: Mapping[str, str] | None = None,
    loaded: LoadedModel | None = None,
    variant: str = "optimized",
    target: str = "plangen",
) -> RenderedPlan:
    """Render the plan module for ``spec`` (nothing written). ``loaded`` reuses a model already built."""
    if tp_size < 1:
        raise InitError(f"--tp-size must be at least 1, got {tp_size}")
    check_variant_option(variant)
    check_target_option(target)
    resolved = resolve(spec) if loaded is None else loaded.resolved
    # Before building anything; the built model's text config has the same heads. Any layout a plan may
    # take (replicated KV heads, padded query heads): the seed plan is checked for its own once built.
    from plangen.model.heads import any_layout_tp_size_problem

    problem = any_layout_tp_size_problem(resolved.config, tp_size, resolved.model_class.__name__)
    if problem is not None:
        raise InitError(f"--tp-size {tp_size}: {problem}")
    from plangen.plan.targets import TARGETS, refused_heads

    refused = refused_heads(TARGETS[target], resolved.config, tp_size)
    if refused is not None:
        raise InitError(
            f"--tp-size {tp_size}: {target} refuses this model there: {refused.describe(tp_size)};"
            f" plangen's runtime takes TP {tp_size} (--target plangen)"
        )
    if loaded is None:
        loaded = load_model(resolved)
    path = Path(output) if output is not None else default_output(loaded.resolved.name, sequence_parallel, variant)
    plan, seed = build_seed_plan(loaded.model, sequence_parallel, variant)
    check_seed_plan_heads(loaded.model, plan, tp_size)
    check_seed_plan_splits(loaded.model, plan, tp_size)
    text = render_plan_text(
        loaded.model,
        loaded.resolved,
        plan,
        seed,
        output=path,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        command=regenerate_command(spec, path, tp_size, sequence_parallel, template_dir, variant, target),
        versions=versions,
        template_dir=template_dir,
        variant=variant,
        target=target,
    )
    return RenderedPlan(path, text, seed, plan, type(loaded.model).__name__)


def _records_same_settings(
    path: Path, spec: str, tp_size: int, sequence_parallel: bool, variant: str, target: str = "plangen"
) -> bool:
    """Whether the file at ``path`` is a plan generated for ``spec`` with these settings: rendering
    may then give its very text (left alone), which only the write can tell."""
    try:
        if not path.is_file():
            return False
        from plangen.check.static import read_plan_metadata  # libcst: only when there is a file to read

        recorded = read_plan_metadata(path)
    except OSError:
        return False
    from plangen.model.resolve import resolve_recorded_spec

    model = recorded.get("PLANGEN_MODEL")
    if not isinstance(model, str):
        return False
    recorded_spec = resolve_recorded_spec(model, path)  # a config path: recorded relative to the plan
    if Path(spec).exists() and Path(recorded_spec).exists():
        same_model = Path(recorded_spec).resolve() == Path(spec).resolve()
    else:
        same_model = recorded_spec == spec
    return (
        same_model
        and recorded.get("PLANGEN_TP_SIZE") == tp_size
        and recorded.get("PLANGEN_SEQUENCE_PARALLEL") is bool(sequence_parallel)
        and recorded.get("PLANGEN_PLAN_VARIANT", "optimized") == variant
        and recorded.get("PLANGEN_TARGET", "plangen") == target
    )


def init_plan(
    spec: str,
    output: Path | str | None = None,
    *,
    tp_size: int = DEFAULT_TP_SIZE,
    sequence_parallel: bool = False,
    force: bool = False,
    template_dir: Path | str | None = None,
    loaded: LoadedModel | None = None,
    variant: str = "optimized",
    target: str = "plangen",
) -> InitResult:
    """``plangen init``: render the plan module for ``spec`` and write it. Raises :class:`InitError`."""
    if tp_size < 1:
        raise InitError(f"--tp-size must be at least 1, got {tp_size}")
    if output is not None and Path(output).suffix != ".py":
        raise InitError(f"-o {output}: a plan module must be a .py file")
    if template_dir is not None and not Path(template_dir).is_dir():
        raise InitError(f"--template {template_dir}: no such directory")
    check_variant_option(variant)
    check_target_option(target)
    # The output path is checked before anything is imported or built (seconds for a large model).
    if output is not None:
        path = Path(output)
    else:
        path = default_output((resolve(spec) if loaded is None else loaded.resolved).name, sequence_parallel, variant)
    same = _records_same_settings(path, spec, tp_size, sequence_parallel, variant, target)
    check_output_path(path, force=force, same_plan=same)
    rendered = render_plan_module(
        spec,
        path,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        template_dir=template_dir,
        loaded=loaded,
        variant=variant,
        target=target,
    )
    outcome = write_plan_file(rendered.path, rendered.text, force=force)
    return InitResult(
        path=outcome.path,
        seed=rendered.seed,
        model_class=rendered.model_class,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        backup=outcome.backup,
        variant=variant,
        unchanged=outcome.unchanged,
        next_command=shlex.join(["plangen", "verify", str(outcome.path)]),
    )

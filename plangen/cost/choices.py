"""Which plan to cost: the names ``--compare`` accepts, each turned into a styles builder.

``hand-written`` is plangen's hand-written plan for the class (``optimized`` and ``plangen`` are
accepted for it), ``stable`` the runtime's plan as its stable variant (no cross-rank sums in the
forward, :mod:`plangen.plans.variants`), ``hf`` the model's Hugging Face plan, ``nemo`` the NeMo-RL-style baseline
(:mod:`plangen.cost.nemo_plan`), and a ``.py`` path a custom plan file. The subject of a MODEL (no
plan file) is what ``parallelize_model`` would pick without a custom plan, by the runtime's own
:func:`~plangen.plans.choice.choose_plan`; it is named by its source, as everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from plangen.cost.settings import CostError

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

NAMED_PLANS = ("hand-written", "stable", "hf", "nemo")
ALIASES = {
    "optimized": "hand-written",
    "plangen": "hand-written",
    "hugging-face": "hf",
    "huggingface": "hf",
    "nemo-rl": "nemo",
}
DEFAULT = "default"


@dataclass(frozen=True)
class PlanChoice:
    name: str  # as the report shows it
    description: str
    key: str  # identifies the styles, for caching measurements
    build: Callable[["nn.Module"], Mapping[str, "ParallelStyle"]]


def is_plan_file(name: str) -> bool:
    return name.strip().endswith(".py")


def check_plan_name(name: str) -> str:
    """The canonical name, or a :class:`CostError` naming what is accepted."""
    canonical = ALIASES.get(name.strip().lower(), name.strip().lower())
    if canonical in NAMED_PLANS or canonical == DEFAULT:
        return canonical
    if is_plan_file(name):
        if not Path(name).is_file():
            raise CostError(f"{name}: no such plan file")
        return name
    raise CostError(f"unknown plan {name!r}: expected {', '.join(NAMED_PLANS)} or a plan file (.py)")


def resolve_plan_choice(name: str, model: "nn.Module", sequence_parallel: bool) -> PlanChoice:
    """The plan ``name`` for ``model`` (a meta or shrunk instance of the class being costed)."""
    from plangen.plans import HAND_WRITTEN

    name = check_plan_name(name)
    cls = type(model).__name__
    sp_label = ", sequence parallel" if sequence_parallel else ""
    if name == DEFAULT:
        return resolve_runtime_choice(model, sequence_parallel)
    if name == "hand-written":
        if cls not in HAND_WRITTEN:
            raise CostError(f"{cls} has no hand-written plan: compare hf, nemo or a plan file")

        def build_hand_written(m: "nn.Module") -> Mapping[str, "ParallelStyle"]:
            from plangen.styles import build_parallel_styles

            return build_parallel_styles(HAND_WRITTEN[cls](m, sequence_parallel))

        key = f"hand-written:{sequence_parallel}"
        return PlanChoice("hand-written", f"plangen's hand-written plan for {cls}{sp_label}", key, build_hand_written)
    if name == "stable":
        return resolve_runtime_choice(model, sequence_parallel, variant="stable")
    if name == "hf":

        def build_hf(m: "nn.Module") -> Mapping[str, "ParallelStyle"]:
            from plangen.plans.hf_plan import get_hf_tp_plan

            try:
                return get_hf_tp_plan(m)
            except ValueError as error:
                raise CostError(str(error)) from None

        note = " (no sequence parallel: Hugging Face plans have none)" if sequence_parallel else ""
        return PlanChoice("hf", f"the Hugging Face plan of {cls}{note}", "hf", build_hf)
    if name == "nemo":
        from plangen.cost.nemo_plan import build_nemo_style_plan

        def build_nemo(m: "nn.Module") -> Mapping[str, "ParallelStyle"]:
            try:
                return build_nemo_style_plan(m, sequence_parallel)
            except ValueError as error:
                raise CostError(f"nemo: {error}") from None

        return PlanChoice(
            "nemo", f"NeMo RL's Llama plan (_parallelize_llama){sp_label}", f"nemo:{sequence_parallel}", build_nemo
        )
    return load_plan_file_choice(name)


def resolve_runtime_choice(model: "nn.Module", sequence_parallel: bool, variant: str = "optimized") -> PlanChoice:
    """The plan ``parallelize_model`` picks without a custom plan, by the runtime's own priority
    (``variant``: its ``plan_variant``)."""
    from plangen.plans.choice import choose_plan

    try:
        chosen = choose_plan(model, sequence_parallel, variant=variant)
    except ValueError as error:
        raise CostError(f"{variant}: {error}" if variant != "optimized" else str(error)) from None

    def build(m: "nn.Module") -> Mapping[str, "ParallelStyle"]:
        return choose_plan(m, sequence_parallel, variant=variant).build_styles()

    if variant != "optimized":
        return PlanChoice(variant, chosen.reason, f"{variant}:{chosen.source}:{sequence_parallel}", build)

    # The same styles as the named plan of that source: share its measurements.
    key = {"hand-written": f"hand-written:{sequence_parallel}", "hf": "hf"}.get(
        chosen.source, f"runtime:{chosen.source}:{sequence_parallel}"
    )
    sp_label = ", sequence parallel" if sequence_parallel else ""
    return PlanChoice(chosen.source, f"{chosen.reason}{sp_label}", key, build)


def load_plan_file_choice(path: str) -> PlanChoice:
    from plangen.plan.source import PlanLoadError, load_custom_plan

    try:
        styles = load_custom_plan(path)
    except PlanLoadError as error:
        raise CostError(str(error)) from None
    except Exception as error:  # the file is user code: any error while running it is theirs
        raise CostError(f"{path}: running the plan file failed: {type(error).__name__}: {error}") from None
    resolved = Path(path).resolve()
    key = f"file:{resolved}:{resolved.stat().st_mtime_ns}"
    return PlanChoice(path, f"the custom plan in {path}", key, lambda m: styles)

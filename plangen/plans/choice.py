"""Which plan a model gets, and why: the only code that knows the priority.

    custom > hand-written > synthesized (where the sweep proved it) > hf (where the sweep proved it) > none

The runtime (:func:`plangen.parallelize.parallelize_model`), ``plangen init``, ``plangen cost`` and
``plangen list`` all call :func:`choose_plan`; each shows the same source names (:data:`SOURCES`).
``plangen init`` seeds an editable file, so it may also start from a synthesized plan the sweep has
not proven (``allow_unproven=True``): the file says so, and ``plangen verify --run`` proves it.

Pure: nothing is applied to the model; plans stay data until :meth:`ChosenPlan.build_styles`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping, Optional

from plangen.plan import Plan, PlanSource
from plangen.plans.checks import PlanError
from plangen.plans.variants import DEFAULT_VARIANT, build_plan_variant
from plangen.plan import VariantError, check_variant

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

    from plangen.plan.source import PlanLike

# Every plan source, in the order of priority; "none" is what a class without any plan shows.
SOURCES: tuple[str, ...] = ("custom", "hand-written", "synthesized", "hf")
NO_PLAN = "none"


class UnprovenCodeWarning(UserWarning):
    """A hand-written plan applied to model code it was never proven on (another transformers)."""


@dataclass(frozen=True)
class PassedOver:
    """A source of higher priority that was not used, and why."""

    source: str
    why: str


@dataclass(frozen=True)
class ChosenPlan:
    source: PlanSource
    reason: str  # why this plan: one line for logs and reports
    class_name: str
    plan: Optional[Plan] = None  # the plan as data; None for a custom plan given as styles
    custom_styles: Optional[Mapping[str, "ParallelStyle"]] = None
    proven: bool = False  # numerically proven for the class (hand-written plans are, by their tests)
    passed_over: tuple[PassedOver, ...] = ()

    def build_styles(self) -> dict[str, "ParallelStyle"]:
        """``{pattern: ParallelStyle}`` as ``parallelize_module`` takes it."""
        if self.custom_styles is not None:
            return dict(self.custom_styles)
        assert self.plan is not None
        from plangen.styles import build_parallel_styles

        return build_parallel_styles(self.plan)

    @property
    def styles(self) -> dict[str, "ParallelStyle"]:
        return self.build_styles()

    def describe(self) -> str:
        """What the plan is, as ``plangen init`` names its seed."""
        cls = self.class_name
        if self.source == "synthesized":
            proof = (
                "numerically proven for the class"
                if self.proven
                else "not numerically proven: check it with plangen verify --run"
            )
            return f"the plan synthesized from the module tree of {cls} ({proof})"
        if self.source == "hf":
            proof = "" if self.proven else "; not numerically proven: check it with plangen verify --run"
            return f"the Hugging Face plan of {cls} (its _tp_plan, translated to torch styles{proof})"
        if self.source == "custom":
            return "the custom plan"
        return f"the {self.source} plan for {cls}"

    def why_not(self, source: str) -> Optional[str]:
        """Why ``source`` (of higher priority) was not used, if it was considered."""
        return next((p.why for p in self.passed_over if p.source == source), None)


class NoPlanError(PlanError):
    """No plan of any source fits the model; the message says what to do instead."""

    def __init__(self, message: str, passed_over: tuple[PassedOver, ...] = ()) -> None:
        super().__init__(message)
        self.passed_over = passed_over


def _chosen(cls: str, source: PlanSource, reason: str, passed: list[PassedOver], **kwargs: Any) -> ChosenPlan:
    return ChosenPlan(source, reason, cls, passed_over=tuple(passed), **kwargs)


def choose_plan(
    model: "nn.Module",
    sequence_parallel: bool = False,
    custom_parallel_plan: Optional["PlanLike"] = None,
    *,
    allow_unproven: bool = False,
    variant: str = "optimized",
) -> ChosenPlan:
    """The plan ``model`` gets at TP > 1, by priority, with the source and the reason.

    ``allow_unproven``: fall back to a Hugging Face plan, then a synthesized plan, that the sweep has
    not proven (``plangen init`` seeds editable files; the runtime never applies one unasked: a
    Hugging Face plan that failed the sweep is refused with the failing tensor and the way out).
    ``variant``: ``optimized`` or ``stable`` (:mod:`plangen.plans.variants`: no cross-rank sums in
    the forward), applied to the chosen plan's data; refused for a custom plan (applied as written).
    A hand-written plan without a sequence-parallel variant raises its own ``ValueError`` (final, as
    the class has a plan); with no plan at all, :class:`NoPlanError` says why each source failed.
    """
    check_variant(variant)
    chosen = _choose_plan(model, sequence_parallel, custom_parallel_plan, allow_unproven)
    if variant == DEFAULT_VARIANT:
        return chosen
    if chosen.plan is None:
        raise VariantError(
            f"the {variant} variant applies to plangen's plans, not to a custom plan: pass it as written"
        )
    return replace(chosen, plan=build_plan_variant(chosen.plan, variant), reason=f"{chosen.reason} ({variant} variant)")


def _choose_plan(
    model: "nn.Module",
    sequence_parallel: bool,
    custom_parallel_plan: Optional["PlanLike"],
    allow_unproven: bool,
) -> ChosenPlan:
    from plangen.plans import HAND_WRITTEN
    from plangen.plans.proven import code_digest, hf_check, is_proven, load_proven, proof_for, unproven_code_message

    cls = type(model).__name__
    if custom_parallel_plan is not None:
        from plangen.plan.source import load_custom_plan

        styles = load_custom_plan(custom_parallel_plan)
        what = custom_parallel_plan if isinstance(custom_parallel_plan, str) else type(custom_parallel_plan).__name__
        return _chosen(cls, "custom", f"custom_parallel_plan given ({what})", [], custom_styles=styles)
    passed: list[PassedOver] = [PassedOver("custom", "no custom_parallel_plan given")]

    code = code_digest(model)  # proofs hold for the installed model code, not for the class name
    builder = HAND_WRITTEN.get(cls)
    if builder is not None:
        plan = builder(model, sequence_parallel)
        # Hand-written plans know their class's code: applied on other code, with a warning; never
        # where the check ran on this very code and failed (another release's model code it does not fit).
        record = proof_for(cls, code)
        failure = hand_written_failure(record, sequence_parallel)
        if failure is not None and not allow_unproven:
            raise NoPlanError(
                f"the hand-written plan for {cls} failed its numerical check on the installed model code: {failure};"
                f" pass a custom_parallel_plan of your own (plangen init {cls}, then plangen verify --run)"
                + (" or sequence_parallel=False" if sequence_parallel and record.get("tp") is True else "")
                + ", or use TP=1",
                (*passed, PassedOver("hand-written", failure)),
            )
        proven = record is not None and failure is None
        if record is None and not allow_unproven:
            warnings.warn(
                f"the hand-written plan for {cls} is {unproven_code_message(cls)}", UnprovenCodeWarning, stacklevel=3
            )
        return _chosen(cls, "hand-written", f"hand-written plan registered for {cls}", passed, plan=plan, proven=proven)
    passed.append(PassedOver("hand-written", f"no hand-written plan for {cls}"))

    # Synthesis reads the forward source of every module: only where it can be used.
    proven = is_proven(cls, sequence_parallel, code)
    synthesized, synthesis_error = _synthesize(model, sequence_parallel) if proven or allow_unproven else (None, "")
    if synthesized is not None and proven:
        reason = f"plan synthesized from the module tree of {cls} (numerically proven for the class)"
        return _chosen(cls, "synthesized", reason, passed, plan=synthesized, proven=True)
    if not synthesis_error and proof_for(cls, code) is None and load_proven().get(cls):
        # Proven on another release's code of the class: what to run to prove it on this one.
        synthesis_error = f"the synthesized plan of {cls} is {unproven_code_message(cls)}"
    passed.append(
        PassedOver("synthesized", synthesis_error or f"the synthesized plan of {cls} is not numerically proven")
    )

    hf: Optional[Plan] = None
    if sequence_parallel:
        hf_error = "Hugging Face plans have no sequence parallel"
    else:
        from plangen.plans.hf_plan import build_hf_plan

        try:
            hf = build_hf_plan(model)
        except ValueError as err:
            hf_error = str(err)
        else:
            hf_proven, hf_error = hf_check(cls, code)
            if hf_proven:
                reason = f"no custom, hand-written or proven synthesized plan for {cls}: using its Hugging Face plan"
                return _chosen(cls, "hf", reason, passed, plan=hf, proven=True)
            hf_error = f"its Hugging Face plan is not used unproven: {hf_error}"
    passed.append(PassedOver("hf", hf_error))
    if allow_unproven and not sequence_parallel and hf is not None:
        reason = f"the Hugging Face plan of {cls} (not numerically proven)"
        return _chosen(cls, "hf", reason, passed, plan=hf, proven=False)

    if allow_unproven and synthesized is not None:
        reason = f"plan synthesized from the module tree of {cls} (not numerically proven)"
        return _chosen(cls, "synthesized", reason, passed, plan=synthesized, proven=False)
    raise NoPlanError(
        _no_plan_message(cls, sequence_parallel, allow_unproven, hf_error, synthesis_error), tuple(passed)
    )


def hand_written_failure(record: dict | None, sequence_parallel: bool) -> str | None:
    """Why a hand-written plan's record for the installed code says it fails (with SP, where
    ``sequence_parallel``), else None (no record: never checked on this code)."""
    if not isinstance(record, dict) or record.get("plan") != "hand-written":
        return None
    failed = record.get("tp") is not True or (sequence_parallel and record.get("sp") is False)
    if not failed:
        return None
    import transformers

    return f"{record.get('error') or 'differs from the unsharded model'} (transformers {transformers.__version__})"


def _synthesize(model: "nn.Module", sequence_parallel: bool) -> tuple[Optional[Plan], str]:
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    try:
        return build_synthesized_plan(model, sequence_parallel), ""
    except ValueError as err:  # this instance's structure has no (SP) synthesized plan
        return None, str(err)


def _no_plan_message(cls: str, sequence_parallel: bool, seeding: bool, hf_error: str, synthesis_error: str) -> str:
    hf_error = hf_error.rstrip(".")
    if seeding:  # plangen init: the user is already writing a custom plan
        return f"no plan for {cls}: {hf_error}; {synthesis_error}"
    from plangen.plans.proven import PROVE_COMMAND

    if PROVE_COMMAND in synthesis_error:  # a synthesized plan, proven on other code or never
        return (
            f"no plan for {cls} proven on the installed model code at TP>1: {synthesis_error}; or pass a "
            f"custom_parallel_plan (plangen init {cls}), or use TP=1"
        )
    if sequence_parallel:
        return (
            f"sequence_parallel=True but {cls} has no hand-written or proven synthesized plan "
            "and Hugging Face plans have no sequence parallel: pass a custom_parallel_plan "
            f"(plangen init {cls} --sequence-parallel) or sequence_parallel=False"
        )
    unproven_hf = "is not used unproven" in hf_error
    opt_in = (
        "; to use it anyway, pass custom_parallel_plan=plangen.plans.hf_plan.get_hf_tp_plan(model)"
        if unproven_hf
        else ""
    )
    return (
        f"no plan for {cls} at TP>1: write a custom plan with `plangen init {cls}` and pass "
        "it as custom_parallel_plan (the class has no hand-written plan, no proven synthesized plan and no "
        f"usable Hugging Face plan: {hf_error}){opt_in}, or use TP=1"
    )

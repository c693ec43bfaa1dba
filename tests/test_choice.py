"""One plan choice (plangen.plans.choice.choose_plan): the priority, its vocabulary, and that the
runtime, ``plangen init``, ``plangen cost`` and ``plangen list`` all give the same answer."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel

from conftest import set_proofs
from plangen.plan import Plan
from plangen.plans.choice import NO_PLAN, SOURCES, ChosenPlan, NoPlanError, choose_plan


def meta(spec: str):
    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.model.resolve import resolve_model

    resolved = resolve_model(spec)
    return build_catalog_model(Architecture(resolved.model_class.__name__, spec))


def test_sources_are_in_priority_order_and_match_the_plan_data_vocabulary():
    import typing

    from plangen.plan import PlanSource

    assert SOURCES == ("custom", "hand-written", "synthesized", "hf")
    assert set(typing.get_args(PlanSource)) == set(SOURCES)
    assert NO_PLAN not in SOURCES


@pytest.mark.parametrize(
    "spec, sp, source, proven",
    [
        ("llama", True, "hand-written", True),
        ("qwen3", False, "hand-written", True),
        ("olmo", True, "synthesized", True),  # proven.json: TP and SP passed
        ("phi3", True, "hand-written", True),  # fused q|k|v re-laid out for TP (plangen.styles.fused)
        ("olmo", False, "hf", True),  # recorded here as a proven Hugging Face plan, its synthesized one unproven
    ],
)
def test_priority(spec, sp, source, proven, monkeypatch):
    if source == "hf":  # no class of this transformers has only a proven Hugging Face plan: record one
        set_proofs(monkeypatch, {"OlmoForCausalLM": {"plan": "hf", "tp": True, "sp": None, "error": None}})
    chosen = choose_plan(meta(spec), sp)
    assert (chosen.source, chosen.proven) == (source, proven)
    assert isinstance(chosen.plan, Plan) and chosen.plan.source == source
    assert chosen.build_styles().keys() == {e.pattern for e in chosen.plan.entries}
    # Every source of higher priority is accounted for, in order.
    assert [p.source for p in chosen.passed_over] == list(SOURCES[: SOURCES.index(source)])


def test_custom_plan_wins_and_keeps_its_styles():
    styles = {"model.layers.*.mlp.up_proj": ColwiseParallel()}
    chosen = choose_plan(meta("llama"), True, styles)
    assert chosen.source == "custom" and chosen.plan is None and chosen.passed_over == ()
    assert chosen.build_styles() == styles and chosen.describe() == "the custom plan"


def test_no_plan_says_why_each_source_was_passed_over():
    with pytest.raises(NoPlanError) as info:
        choose_plan(meta("xlnet"), False)
    passed = {p.source: p.why for p in info.value.passed_over}
    assert list(passed) == list(SOURCES)
    assert "not recognised" in passed["synthesized"] or "not numerically proven" in passed["synthesized"]
    assert "no Hugging Face tensor-parallel plan" in passed["hf"]
    assert str(info.value).startswith("no plan for XLNetLMHeadModel at TP>1: write a custom plan with `plangen init")


def test_an_unproven_synthesized_plan_only_seeds_a_file(monkeypatch):
    # OPT: synthesized, no Hugging Face plan; without a sweep record its plan is unproven.
    set_proofs(monkeypatch, {})
    with pytest.raises(NoPlanError):
        choose_plan(meta("opt"), False)
    seed = choose_plan(meta("opt"), False, allow_unproven=True)
    assert (seed.source, seed.proven) == ("synthesized", False)
    assert "not numerically proven" in seed.describe()


def test_a_hand_written_plan_without_sp_variant_is_final(monkeypatch):
    """A class with a hand-written plan never falls back to a lesser source when SP is asked for."""
    from plangen.plans import HAND_WRITTEN

    original = HAND_WRITTEN["LlamaForCausalLM"]

    def without_sp(model, sequence_parallel):
        if sequence_parallel:
            raise ValueError("LlamaForCausalLM: no sequence-parallel variant")
        return original(model, sequence_parallel)

    monkeypatch.setitem(HAND_WRITTEN, "LlamaForCausalLM", without_sp)
    with pytest.raises(ValueError, match="no sequence-parallel variant"):
        choose_plan(meta("llama"), True)
    assert choose_plan(meta("llama"), False).source == "hand-written"


@pytest.mark.parametrize("spec", ["llama", "olmo", "phi3", "gpt2", "ctrl", "xlm"])
def test_runtime_init_cost_and_list_agree(spec, monkeypatch):
    """The four users of the plan choice name the same source for the same class."""
    from plangen.commands.catalog import Architecture, build_row
    from plangen.cost.choices import resolve_plan_choice
    from plangen.cost.settings import CostError
    from plangen.commands.init import build_seed_plan
    from plangen.output.errors import InitError
    from plangen.plans.proven import load_proven

    model = meta(spec)
    try:
        runtime = choose_plan(model, False).source
    except NoPlanError:
        runtime = NO_PLAN
    row = build_row(Architecture(type(model).__name__, spec), load_proven())
    assert row.plan == runtime
    try:
        assert resolve_plan_choice("default", model, False).name == runtime
    except CostError:
        assert runtime == NO_PLAN
    try:
        seed, _ = build_seed_plan(model, False)
    except InitError:
        assert runtime == NO_PLAN
    else:
        # init may start from an unproven synthesized plan where the runtime has none.
        assert seed.source == runtime or (runtime == NO_PLAN and seed.source == "synthesized")


def test_chosen_plan_is_plain_data():
    chosen = choose_plan(meta("llama"), False)
    assert isinstance(chosen, ChosenPlan)
    assert chosen.describe() == "the hand-written plan for LlamaForCausalLM"
    assert chosen == choose_plan(meta("llama"), False)  # pure: same model, same answer
    assert not any(isinstance(p, torch.nn.Parameter) for p in vars(chosen).values())


@pytest.mark.parametrize(
    "spec, failing",
    # Wrong logits, silently: Gemma 3n's Hugging Face plan, as the sweep recorded it before its
    # synthesized plan was proven (Apertus-1.5's HF plan, wrong gradients, was refused here until
    # its synthesized one was: test_apertus_gets_its_proven_synthesized_plan_not_the_wrong_hf_one).
    [("gemma3n_text", "logits differs")],
)
def test_a_hugging_face_plan_that_failed_the_sweep_is_refused_with_the_reason_and_the_way_out(
    spec, failing, monkeypatch
):
    model = meta(spec)
    record = {
        "plan": "none",
        "tp": False,
        "sp": False,
        "error": "tp: tp2 rank 0: RuntimeError: shapes",
        "hf": {"tp": False, "error": "tp: tp2 rank 0: logits differs by 1.2e-01"},
    }
    set_proofs(monkeypatch, {type(model).__name__: record})
    with pytest.raises(NoPlanError) as info:
        choose_plan(model, False)
    message = str(info.value)
    assert failing in message and "is not used unproven" in message
    assert "custom_parallel_plan=plangen.plans.hf_plan.get_hf_tp_plan(model)" in message and "plangen init" in message
    assert "\n" not in message
    # plangen init may still start from it, saying it is unproven.
    seed = choose_plan(model, False, allow_unproven=True)
    assert not seed.proven and "not numerically proven" in seed.describe()


def test_apertus_gets_its_proven_synthesized_plan_not_the_wrong_hf_one():
    chosen = choose_plan(meta("apertus1p5_text"), False)
    assert chosen.source == "synthesized" and chosen.proven


def test_hugging_face_plans_are_used_only_where_the_sweep_proved_them(monkeypatch):
    records = set_proofs(monkeypatch, {})  # no records: nothing proven
    with pytest.raises(NoPlanError, match="not checked by the sweep"):
        choose_plan(meta("granite"), False)
    records["GraniteForCausalLM"] = {"plan": "hf", "tp": True, "sp": None, "error": None}
    assert choose_plan(meta("granite"), False).source == "hf"


def test_the_code_digest_follows_the_installed_modeling_source(monkeypatch):
    import plangen.plans.proven as P

    llama, qwen3 = meta("llama"), meta("qwen3")
    before = P.code_digest(llama)
    assert before == P.code_digest(meta("llama")) and before != P.code_digest(qwen3)
    changed = "transformers.models.llama.modeling_llama"
    real = P._source_digest
    monkeypatch.setattr(P, "_source_digest", lambda name: "edited" if name == changed else real(name))
    assert P.code_digest(llama) != before  # its modeling file changed: another code
    assert P.code_digest(qwen3) == P.code_digest(meta("qwen3"))  # Qwen3's file did not


def test_a_hand_written_plan_on_unproven_code_is_applied_with_a_warning_naming_plangen_prove(monkeypatch):
    import plangen.plans.proven as P
    from plangen.plans.choice import UnprovenCodeWarning

    model = meta("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnprovenCodeWarning)
        assert choose_plan(model, False).proven  # the shipped proof is for the installed code: no warning
    monkeypatch.setattr(P, "_source_digest", lambda name: "another release")
    with pytest.warns(UnprovenCodeWarning, match="proven only on other model code .*`plangen prove LlamaForCausalLM`"):
        chosen = choose_plan(model, False)
    assert (chosen.source, chosen.proven) == ("hand-written", False)


def test_a_hand_written_plan_that_failed_on_the_installed_code_is_refused(monkeypatch):
    """As transformers 5.25's LongCat-Flash's was before its fix: the hand-written plan's logits off
    by 1.3e-2 in the sweep on that code. A record of a failure on the installed code refuses the plan (with SP only, where only
    SP failed), naming the failure; no record still applies it with a warning (the test above)."""
    from plangen.plans.choice import NoPlanError, UnprovenCodeWarning

    model = meta("llama")
    failed = {"plan": "hand-written", "tp": False, "sp": False, "error": "tp: tp2 rank 0: logits differs by 1.3e-02"}
    set_proofs(monkeypatch, {"LlamaForCausalLM": failed})
    with pytest.raises(
        NoPlanError,
        match=r"failed its numerical check on the installed model code: tp: tp2 rank 0: logits"
        r" differs by 1.3e-02 \(transformers .*plangen init LlamaForCausalLM",
    ):
        choose_plan(model, False)
    set_proofs(monkeypatch, {"LlamaForCausalLM": {**failed, "tp": True, "error": "sp: flatten refused"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnprovenCodeWarning)
        assert choose_plan(model, False).proven
    with pytest.raises(NoPlanError, match="sp: flatten refused .* or sequence_parallel=False, or use TP=1"):
        choose_plan(model, True)

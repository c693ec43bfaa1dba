"""A model's Hugging Face TP plan: collected as transformers resolves it, turned into plangen data."""

from __future__ import annotations

from fnmatch import fnmatch

import pytest
import torch
import transformers
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from transformers import AutoConfig

from plangen.plans.hf_plan import build_hf_plan, collect_hf_tp_plan, compose_hf_tp_plan, get_hf_tp_plan, guess_group
from plangen.styles import AllReduceParamGrads, UnsupportedStyleError
from plangen.stack.transformers_compat import hf_parallel_utils, plan_composes_head_and_embedding

SMALL = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
)

# class name, model type, config kwargs, prefix of the language model's rules
MODELS = {
    "llama": ("LlamaForCausalLM", "llama", SMALL, "model."),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", SMALL, "model."),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", SMALL, "model."),
    "gemma3-vlm": (
        "Gemma3ForConditionalGeneration",
        "gemma3",
        dict(text_config=SMALL, vision_config=VISION),
        "model.language_model.",
    ),
    "qwen2-vl": (
        "Qwen2VLForConditionalGeneration",
        "qwen2_vl",
        dict(text_config=SMALL, vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2)),
        "model.language_model.",
    ),
    "llava": (
        "LlavaForConditionalGeneration",
        "llava",
        dict(text_config=dict(model_type="llama", **SMALL), vision_config=VISION),
        "model.language_model.",
    ),
    "mistral3": (
        "Mistral3ForConditionalGeneration",
        "mistral3",
        dict(text_config=dict(model_type="mistral", **SMALL), vision_config=dict(VISION, head_dim=8)),
        "model.language_model.",
    ),
}


def build_meta(class_name: str, model_type: str, **config_kwargs) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **config_kwargs)
    with torch.device("meta"):
        return getattr(transformers, class_name)._from_config(config)


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {key: build_meta(cls, model_type, **kwargs) for key, (cls, model_type, kwargs, _) in MODELS.items()}


def generic_module_names(model: torch.nn.Module) -> set[str]:
    replace_layer_number_by_wildcard = hf_parallel_utils().replace_layer_number_by_wildcard
    return {replace_layer_number_by_wildcard(name) for name, _ in model.named_modules()}


def modules_transformers_shards(model: torch.nn.Module) -> dict[str, str]:
    """{module name: style} of what the installed transformers' own TP (tp_size=2) hooks."""
    if hasattr(model, "_resolve_parallel_plans"):  # 5.24.0 on: the plan expanded per module
        from transformers.distributed.configuration_utils import DistributedConfig

        expanded, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=2))
        module_names = {name for name, _ in model.named_modules()}
        return {name: style for name, style in expanded.items() if name in module_names}
    # 5.5.x-5.8.x: distribute_model looks each module's name up in the plan
    from transformers.integrations.tensor_parallel import _get_parameter_tp_plan

    styles = {name: _get_parameter_tp_plan(name, model.tp_plan, is_weight=False) for name, _ in model.named_modules()}
    return {name: style for name, style in styles.items() if style is not None}


def matches(pattern: str, name: str) -> bool:
    """parallelize_module's matching: one fnmatch per dotted atom."""
    atoms, pattern_atoms = name.split("."), pattern.split(".")
    return len(atoms) == len(pattern_atoms) and all(fnmatch(a, p) for a, p in zip(atoms, pattern_atoms))


@pytest.mark.parametrize("key", MODELS)
def test_collected_plan_is_transformers_own(models, key):
    model = models[key]
    assert collect_hf_tp_plan(model) == model.tp_plan
    # the mirror of post_init's composition agrees with what post_init stored
    assert compose_hf_tp_plan(model) == model.tp_plan


@pytest.mark.parametrize("key", MODELS)
def test_prefixes_and_every_key_names_a_module(models, key):
    model = models[key]
    prefix = MODELS[key][3]
    plan = collect_hf_tp_plan(model)
    if plan_composes_head_and_embedding():  # transformers' post_init adds both (5.24.0 on)
        assert plan["lm_head"] == "colwise_gather_output"
        assert plan[f"{prefix}embed_tokens"] == "embedding_rowwise"
    else:  # 5.5.x-5.8.x leave both whole
        assert "lm_head" not in plan and f"{prefix}embed_tokens" not in plan
    assert plan[f"{prefix}layers.*.self_attn.q_proj"] == "colwise"
    assert plan[f"{prefix}layers.*.mlp.down_proj"] == "rowwise"
    assert all(k == "lm_head" or k.startswith(prefix) for k in plan)
    names = generic_module_names(model)
    assert not set(plan) - names, f"rules matching no module: {sorted(set(plan) - names)}"


@pytest.mark.parametrize("key", ["llama", "qwen3", "gemma3-vlm"])
def test_patterns_hit_exactly_the_modules_transformers_shards(models, key):
    model = models[key]
    module_names = {name for name, _ in model.named_modules()}
    sharded_modules = modules_transformers_shards(model)
    plan = collect_hf_tp_plan(model)
    hit = {name: [plan[p] for p in plan if matches(p, name)] for name in module_names}
    assert {name: styles[0] for name, styles in hit.items() if styles} == sharded_modules
    assert all(len(styles) <= 1 for styles in hit.values())


def test_qwen3_translation(models):
    styles = get_hf_tp_plan(models["qwen3"])
    assert all(isinstance(style, ParallelStyle) for style in styles.values())
    if plan_composes_head_and_embedding():
        lm_head = styles["lm_head"]
        assert isinstance(lm_head, ColwiseParallel) and lm_head.output_layouts == (Replicate(),)
        embed = styles["model.embed_tokens"]
        assert isinstance(embed, RowwiseParallel) and embed.input_layouts == (Replicate(),)
    else:  # what transformers 5.5.x-5.8.x's own TP does: both whole
        assert "lm_head" not in styles and "model.embed_tokens" not in styles
    assert isinstance(styles["model.layers.*.self_attn.q_norm"], AllReduceParamGrads)
    assert isinstance(styles["model.layers.*.self_attn.o_proj"], RowwiseParallel)


def test_plan_data(models):
    plan = build_hf_plan(models["gemma3-vlm"])
    assert plan.source == "hf" and not plan.sequence_parallel
    groups = {e.pattern: e.group for e in plan.entries}
    assert groups["model.language_model.layers.*.self_attn.q_proj"] == "attention"
    assert groups["model.language_model.layers.*.self_attn.q_norm"] == "attention"
    assert groups["model.language_model.layers.*.mlp.up_proj"] == "mlp"
    if plan_composes_head_and_embedding():
        assert groups["lm_head"] == "output"
        assert groups["model.language_model.embed_tokens"] == "embeddings"
        entry = next(e for e in plan.entries if e.pattern == "lm_head")
        assert entry.style == "ColwiseParallel" and "colwise_gather_output" in entry.why
    assert plan.patterns() == list(collect_hf_tp_plan(models["gemma3-vlm"]))


@pytest.mark.parametrize(
    ("pattern", "group"),
    [
        ("model.norm", "norms"),
        ("model.layers.*.post_attention_layernorm", "norms"),
        ("model.layers.*.self_attn.k_norm", "attention"),
        ("model.layers.*.feed_forward.w1", "mlp"),
        ("model.rotary_emb", "other"),
    ],
)
def test_guess_group(pattern, group):
    assert guess_group(pattern) == group


def test_model_without_a_plan():
    model = build_meta("GPT2LMHeadModel", "gpt2", n_embd=16, n_layer=1, n_head=2, vocab_size=64)
    with pytest.raises(ValueError, match="pass a custom_parallel_plan or use TP=1") as info:
        get_hf_tp_plan(model)
    assert "GPT2LMHeadModel" in str(info.value) and "\n" not in str(info.value)


def test_moe_plan_is_refused_by_name():
    model = build_meta(
        "Qwen3MoeForCausalLM", "qwen3_moe", moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2, **SMALL
    )
    if "model.layers.*.mlp.experts" not in model.tp_plan:  # 5.25.0's plan leaves the experts out: as a user sets it
        model.tp_plan = {**model.tp_plan, "model.layers.*.mlp.experts": "moe_tp_experts"}
    with pytest.raises(UnsupportedStyleError) as info:
        build_hf_plan(model)
    assert info.value.style == "moe_tp_experts"
    assert info.value.module_name == "model.layers.*.mlp.experts"
    message = str(info.value)  # one line that names the way out: plangen's own experts style and plans
    assert "\n" not in message
    assert "plangen splits the experts with its own ExpertsParallel instead" in message
    assert "hand-written or synthesized plan (plangen list), or plangen init to write one" in message


@pytest.mark.parametrize(
    "style", ["moe_tp_experts", "moe_identity_expert", "grouped_gemm", "ep_dispatch_experts", "ep_router"]
)
def test_every_moe_style_is_refused_naming_plangens_experts_style(style):
    from plangen.styles import resolve_hf_style

    with pytest.raises(UnsupportedStyleError) as info:
        resolve_hf_style(style, "model.layers.*.mlp.experts")
    assert "ExpertsParallel" in str(info.value) and "plangen init" in str(info.value), str(info.value)


def test_rule_on_a_parameter_is_refused():
    model = build_meta(*MODELS["llama"][:2], **MODELS["llama"][2])
    model.tp_plan = {"lm_head": "colwise_gather_output", "model.layers.*.mlp.up_proj.weight": "colwise"}
    with pytest.raises(UnsupportedStyleError, match="names a parameter") as info:
        build_hf_plan(model)
    assert info.value.module_name == "model.layers.*.mlp.up_proj.weight"


def test_plan_composed_without_post_init(models):
    # A wrapper that is not a PreTrainedModel holds no composed plan: the children's are collected.
    wrapper = torch.nn.Module()
    wrapper.inner = models["llama"]
    plan = collect_hf_tp_plan(wrapper)
    assert plan == {f"inner.{k}": v for k, v in models["llama"].tp_plan.items()}

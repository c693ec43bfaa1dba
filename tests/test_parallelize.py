"""The runtime without processes: plan priority, plan loading, checks before any collective."""

from __future__ import annotations

import inspect

import json
import re

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from transformers import AutoConfig, AutoModelForCausalLM

import plangen.parallelize as P
from conftest import DATA, set_proofs
from plangen.plan.source import PlanLoadError, load_custom_plan
from plangen.stack.transformers_compat import layer_kind
from tiny_configs import TINY


def meta_model(name: str):
    kwargs = dict(TINY[name])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def meta_from_file(name: str):
    d = json.loads((DATA / "model-configs" / f"{name}.json").read_text())
    config = AutoConfig.for_model(d.pop("model_type"), **{k: v for k, v in d.items() if k != "architectures"})
    config.num_hidden_layers = 2
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


# --- NeMo RL surface -------------------------------------------------------------------------


def test_nemo_rl_names_are_kept_as_aliases():
    assert P._parallelize_model is P.parallelize_model
    assert P.PARALLIZE_FUNCTIONS is P.PARALLELIZE_FUNCTIONS
    import transformers

    for cls in (
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
    ):
        assert getattr(transformers, cls) in P.PARALLELIZE_FUNCTIONS
    for name in (
        "RotaryEmbedParallel",
        "to_local_if_dtensor",
        "clip_grad_by_total_norm_",
        "get_grad_norm",
        "get_hf_tp_plan",
        "translate_parallel_style",
    ):
        assert callable(getattr(P, name))


def test_optimized_plan_function_returns_styles_for_every_module_it_names():
    model = meta_model("qwen3")
    plan = P.PARALLELIZE_FUNCTIONS[type(model)](model, True)
    assert all(isinstance(s, ParallelStyle) for s in plan.values())
    assert P.find_unmatched_keys(model, plan) == []
    assert "model.layers.*.self_attn.q_norm" in plan


# --- priority ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "custom_plans.llama_gathered_logits",  # dotted path to a dict
        "custom_plans.qwen3_plan_function",  # dotted path to a function
        "tests/custom_plans.py:qwen3_plan_function",  # file path with a name
    ],
)
def test_custom_plan_wins_over_optimized(spec):
    model = meta_model("qwen3")
    resolved = P.choose_plan(model, False, spec)
    assert resolved.source == "custom" and spec in resolved.reason
    assert resolved.styles.keys() == load_custom_plan(spec).keys()


def test_custom_plan_as_dict_and_callable():
    plan = {"model.layers.*.mlp.up_proj": ColwiseParallel()}
    model = meta_model("llama")
    assert P.choose_plan(model, False, plan).styles == plan
    assert P.choose_plan(model, False, lambda: plan).styles == plan


def test_generated_style_module_path_uses_its_custom_parallel_plan(tmp_path, monkeypatch):
    (tmp_path / "myplans").mkdir()
    (tmp_path / "myplans" / "__init__.py").write_text("")
    (tmp_path / "myplans" / "llama_plan.py").write_text(
        "from torch.distributed.tensor.parallel import ColwiseParallel\n"
        "custom_parallel_plan = {'model.layers.*.mlp.up_proj': ColwiseParallel()}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    styles = load_custom_plan("myplans.llama_plan")
    assert list(styles) == ["model.layers.*.mlp.up_proj"]
    assert load_custom_plan("myplans.llama_plan.custom_parallel_plan").keys() == styles.keys()
    assert load_custom_plan(str(tmp_path / "myplans" / "llama_plan.py")).keys() == styles.keys()


def test_optimized_plan_wins_over_hf():
    resolved = P.choose_plan(meta_model("llama"), True, None)
    assert resolved.source == "hand-written" and "LlamaForCausalLM" in resolved.reason


def test_hf_plan_without_optimized_plan_refuses_sequence_parallel(monkeypatch):
    # OLMo recorded with only its Hugging Face plan proven (no class of this transformers is).
    from plangen.commands.catalog import Architecture, build_catalog_model

    set_proofs(monkeypatch, {"OlmoForCausalLM": {"plan": "hf", "tp": True, "sp": None, "error": None}})
    model = build_catalog_model(Architecture("OlmoForCausalLM", "olmo"))
    with pytest.raises(
        P.PlanError, match="sequence_parallel=True but OlmoForCausalLM has no hand-written or proven synthesized plan"
    ):
        P.choose_plan(model, True, None)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("custom_plans.no_such_plan", "custom_plans has no attribute 'no_such_plan'"),
        ("no_such_package.plan", "not an importable dotted path"),
        ("missing_file.py", "no such plan file"),
        ("custom_plans", "defines no custom_parallel_plan"),
    ],
)
def test_bad_custom_plan_paths_are_one_line_errors(spec, message):
    with pytest.raises(PlanLoadError, match=message) as err:
        load_custom_plan(spec)
    assert "\n" not in str(err.value)


def test_plan_values_must_be_styles_and_functions_take_no_arguments():
    with pytest.raises(
        PlanLoadError, match=r"plan\['lm_head'\] is a str, not a ParallelStyle .*translate_parallel_style"
    ):
        load_custom_plan({"lm_head": "colwise"})
    with pytest.raises(PlanLoadError, match="must take no arguments, this one needs model"):
        load_custom_plan(lambda model: {})
    with pytest.raises(PlanLoadError, match="expected a dict of ParallelStyle, got list"):
        load_custom_plan(lambda: [])


# --- checks before any collective -------------------------------------------------------------


def test_unmatched_plan_key_is_an_error_naming_it():
    plan = {"model.layers.*.self_attn.qkv_proj": ColwiseParallel(), "model.layers.*.mlp.up_proj": ColwiseParallel()}
    with pytest.raises(
        P.PlanError, match=r"match no module of LlamaForCausalLM: model\.layers\.\*\.self_attn\.qkv_proj \("
    ):
        P.check_plan_fits(meta_model("llama"), plan, 2)


@pytest.mark.parametrize(
    "config, tp, message",
    [
        # The hand-written plans replicate KV heads where TP exceeds them: the limit is the query heads'.
        (
            "qwen2.5-1.5b",
            3,
            "num_key_value_heads=2 neither divides nor is divisible by the TP size 3: the largest legal TP size for Qwen2ForCausalLM is 2 (2 without KV head replication)",
        ),
        (
            "gemma-3-1b",
            8,
            "num_attention_heads=4 is not divisible by the TP size 8: the largest legal TP size for Gemma3ForCausalLM is 4 (1 without KV head replication)",
        ),
        (
            "qwen2.5-7b",
            8,
            "num_attention_heads=28 is not divisible by the TP size 8: the largest legal TP size for Qwen2ForCausalLM is 4",
        ),
    ],
)
def test_heads_not_divisible_names_the_largest_legal_tp_size(config, tp, message):
    model = meta_from_file(config)
    styles = P.PARALLELIZE_FUNCTIONS[type(model)](model, False)
    with pytest.raises(P.PlanError, match=re.escape(message)):
        P.check_plan_fits(model, styles, tp)


@pytest.mark.parametrize(
    "config, tp", [("gemma-3-1b", 2), ("gemma-3-1b", 4), ("qwen2.5-1.5b", 4), ("qwen3-30b-a3b", 8)]
)
def test_hand_written_plans_take_tp_sizes_above_the_kv_heads(config, tp):
    model = meta_from_file(config)
    styles = P.PARALLELIZE_FUNCTIONS[type(model)](model, False)
    P.check_plan_fits(model, styles, tp)
    # A plan whose k/v projections are plain ColwiseParallel is refused, naming both limits.
    plain = {k: ColwiseParallel() if k.endswith(("k_proj", "v_proj")) else v for k, v in styles.items()}
    with pytest.raises(P.PlanError, match=r"with KV heads replicated by KVHeadsColwiseParallel on k_proj/v_proj\)$"):
        P.check_plan_fits(model, plain, tp)


def test_largest_legal_tp_size():
    assert P.largest_legal_tp_size(32, 8) == 8
    assert P.largest_legal_tp_size(12, 2, limit=8) == 2
    assert P.largest_legal_tp_size(28, 4, limit=8) == 4
    assert P.largest_legal_tp_size(4, 1, replicate_kv=True) == 4
    assert P.largest_legal_tp_size(12, 2, limit=8, replicate_kv=True) == 6
    assert P.largest_legal_tp_size(32, 4, limit=16, replicate_kv=True) == 16
    assert P.largest_legal_tp_size(12, 8, limit=8, replicate_kv=True) == 4  # 8 KV heads: TP 6 neither


def test_bad_plan_fails_before_any_collective(fake_pg):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 8), mesh_dim_names=("dp", "tp"))
    model = meta_from_file("gemma-3-1b")  # 4 query heads: TP 8 is not legal
    with CommDebugMode() as comm:
        with pytest.raises(P.PlanError, match="largest legal TP size for Gemma3ForCausalLM is 4"):
            P.parallelize_model(model, mesh["dp"], mesh["tp"], torch.float32)
    assert comm.get_total_counts() == 0
    # Nothing was converted: the failure left the model as it was.
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())


# --- tied embeddings ----------------------------------------------------------------------------


def test_tied_head_sharded_alone_gets_its_embedding_sharded_too():
    model = meta_model("llama-tied")
    styles = P.resolve_tied_styles(
        model, {"lm_head": ColwiseParallel(output_layouts=torch.distributed.tensor.Replicate())}
    )
    assert isinstance(styles["model.embed_tokens"], RowwiseParallel)
    untied = meta_model("llama")
    assert "model.embed_tokens" not in P.resolve_tied_styles(untied, {"lm_head": ColwiseParallel()})


def test_transformer_layers_found_in_multimodal_classes():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
    )
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(config)
    names = sorted(type(m).__name__ for m in P.find_transformer_layers(model))
    assert names.count("Gemma3DecoderLayer") == 2
    assert names.count("SiglipEncoderLayer") == 3
    llama = meta_model("llama")
    assert P.find_transformer_layers(llama) == list(llama.model.layers)


# --- gradient norm and clipping (single process: plain tensors) -------------------------------


def test_clip_scales_low_precision_gradients_in_place():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    p.grad = torch.full((4,), 2.0, dtype=torch.bfloat16)
    P.clip_grad_by_total_norm_([p], max_grad_norm=1.0, total_norm=4.0)
    # NeMo RL's version scales a float32 copy and leaves a bf16 gradient unchanged.
    assert torch.allclose(p.grad.float(), torch.full((4,), 0.5), atol=1e-2)


# --- sequence parallel input checks, hybrid plans -----------------------------------------------


def test_sequence_length_not_divisible_by_tp_is_a_clear_error(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh

    from tiny_configs import build_tiny

    model = build_tiny("llama")
    mesh = DeviceMesh("cpu", torch.arange(2))
    resolved = P.choose_plan(model, True)
    P.apply_tp(model, mesh, resolved.styles)
    P.apply_sequence_length_check(model, 2)
    with pytest.raises(ValueError, match="sequence length 7 is not divisible by the TP size 2; pad the batch"):
        model(input_ids=torch.zeros(1, 7, dtype=torch.long))


def test_nemotron_h_plan_shards_mlp_attention_and_mamba2_mixers():
    from torch.distributed.tensor import Shard

    model = meta_model("nemotron_h")
    plan = P.PARALLELIZE_FUNCTIONS[type(model)](model, False)
    assert P.find_unmatched_keys(model, plan) == []
    sharded = {n for key in plan for n in P.find_matching_modules(model, key)}
    assert "model.layers.3.mixer.up_proj" in sharded and "model.layers.2.mixer.q_proj" in sharded
    # The MoE block: experts split on the expert dim, the shared expert column/row-parallel, the router whole.
    assert {"model.layers.1.mixer.experts", "model.layers.1.mixer.shared_experts.up_proj"} <= sharded
    assert "model.layers.1.mixer.gate" not in sharded
    # The Mamba2 mixer split by heads: its own style (in_proj, conv1d, A_log/D/dt_bias), its gated norm, out_proj.
    assert {"model.layers.0.mixer", "model.layers.0.mixer.norm", "model.layers.0.mixer.out_proj"} <= sharded
    assert type(plan["model.layers.0.mixer"]).__name__ == "Mamba2MixerParallel"
    # SP: the Mamba mixer gathers the sequence itself; out_proj reduce-scatters back to it.
    sp_plan = P.PARALLELIZE_FUNCTIONS[type(model)](model, True)
    assert P.find_unmatched_keys(model, sp_plan) == []
    assert type(sp_plan["model.layers.0.mixer"]).__name__ == "Mamba2MixerParallel"
    assert sp_plan["model.layers.0.mixer"].input_layouts == Shard(1)


def test_packed_projections_refuse_fsdp_sharding():
    from plangen.styles import PackedColwiseParallel

    styles = {"model.layers.*.mlp.up_proj": PackedColwiseParallel(split_factor=2)}
    with pytest.raises(
        P.PlanError, match=r"packed \(fused\) projections model\.layers\.\*\.mlp\.up_proj cannot be sharded by FSDP2"
    ):
        P.check_packed_without_fsdp(meta_model("llama"), styles, 2)
    P.check_packed_without_fsdp(meta_model("llama"), styles, 1)


def test_nemotron_h_checkpoints_only_mlp_and_mamba_blocks(fake_pg, monkeypatch):
    from torch.distributed.device_mesh import DeviceMesh

    from tiny_configs import build_tiny

    model = build_tiny("nemotron_h")
    checkpointed = []
    monkeypatch.setattr(P, "apply_activation_checkpointing", lambda layers: checkpointed.extend(layers))
    mesh = DeviceMesh("cpu", torch.arange(1))
    P.parallelize_model(model, mesh, mesh, torch.float32, activation_checkpointing=True)
    # not attention, not MoE (the kinds' names as the installed release spells them)
    assert [layer_kind(layer.block_type) for layer in checkpointed] == ["linear_attention", "mlp"]


@pytest.mark.parametrize(
    "custom, expected",
    [
        (None, "plangen: using the hand-written plan: hand-written plan registered for LlamaForCausalLM"),
        (
            "custom_plans.llama_gathered_logits",
            "plangen: using the custom plan: custom_parallel_plan given (custom_plans.llama_gathered_logits)",
        ),
    ],
)
def test_the_chosen_plan_and_its_reason_are_logged(fake_pg, caplog, custom, expected):
    import logging

    from torch.distributed.device_mesh import DeviceMesh

    from tiny_configs import build_tiny

    mesh = DeviceMesh("cpu", torch.arange(2).view(1, 2), mesh_dim_names=("dp", "tp"))
    with caplog.at_level(logging.INFO, logger="plangen"):
        P.parallelize_model(build_tiny("llama"), mesh["dp"], mesh["tp"], torch.float32, custom_parallel_plan=custom)
    assert expected in caplog.messages


def test_checkpointed_layers_leave_the_kv_cache_alone_in_training():
    """Backward replays a checkpointed layer; with the KV cache in its call the replay would write the
    layer's keys and values into the cache a second time (16 positions after a step of 8), and the
    cache, kept by the replay's arguments, would hold them until backward ends (docs/cost.md). Under
    training the layers get no cache (as transformers' own checkpointing does it), the gradients are
    the uncheckpointed model's; without gradients (generation in train mode) the cache fills."""
    from transformers import DynamicCache

    from plangen.model.module_tree import find_transformer_layers
    from tiny_configs import build_tiny

    plain, checkpointed = build_tiny("llama").train(), build_tiny("llama").train()
    P.apply_activation_checkpointing(find_transformer_layers(checkpointed))
    ids = torch.randint(0, 100, (2, 8))
    plain(input_ids=ids, use_cache=False).logits.sum().backward()
    cache = DynamicCache(config=checkpointed.config)
    # The cache's keyword: ``cache`` from transformers 5.24.0, ``past_key_values`` before.
    keyword = "cache" if "cache" in inspect.signature(type(checkpointed).forward).parameters else "past_key_values"
    checkpointed(input_ids=ids, use_cache=True, **{keyword: cache}).logits.sum().backward()
    assert cache.get_seq_length() == 0
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=name)
    with torch.no_grad():
        checkpointed(input_ids=ids, use_cache=True, **{keyword: cache})
    assert cache.get_seq_length() == 8


def test_a_dict_the_layers_fill_for_each_other_reaches_them_whole_under_fsdp2(fake_pg):
    """FSDP2's input cast rebuilds every dict it is handed: transformers 5.8.1's Gemma 3n hands each layer
    one dict (shared_kv_states) that a layer fills and a later one reads, so each filled a copy and the
    first KV-sharing layer failed (KeyError: 2). parallelize_model's layers get the caller's dict."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from plangen.runtime.fsdp_inputs import keep_filled_inputs

    class Filler(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.index, self.linear = index, torch.nn.Linear(4, 4)

        def forward(self, hidden, shared):
            shared[self.index] = hidden.detach()
            return self.linear(hidden) + (shared[self.index - 1].sum() if self.index else 0)

    mesh = DeviceMesh("cpu", list(range(dist.get_world_size())))
    for mend in (False, True):
        layers = [Filler(i) for i in range(2)]
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))  # as plangen's
            if mend:
                keep_filled_inputs(layer)
        shared: dict = {}
        hidden = torch.randn(2, 4)
        if not mend:  # FSDP2 alone: the first layer filled a copy
            with pytest.raises(KeyError):
                layers[1](layers[0](hidden, shared=shared), shared=shared)
            continue
        layers[1](layers[0](hidden, shared=shared), shared=shared)
        assert sorted(shared) == [0, 1]

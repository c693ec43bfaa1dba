"""NeMo RL's `nemo_rl.models.dtensor.parallelize` names from `plangen.parallelize`, and how NeMo RL
resolves `policy.dtensor_cfg.custom_parallel_plan` for a plan written by `plangen init`."""

from __future__ import annotations

import importlib
import inspect
import json
from types import FunctionType
from unittest.mock import MagicMock

import pytest
import torch
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module
from transformers import AutoConfig, AutoModelForCausalLM

import plangen.parallelize as P
from conftest import DATA
from plangen.model.module_tree import find_unmatched_keys

_EMPTY = inspect.Parameter.empty
_LAYERS = ("model", "dp_mesh", "tp_mesh", "param_dtype")
_FLAGS = (
    ("sequence_parallel", False),
    ("activation_checkpointing", False),
    ("cpu_offload", False),
    ("custom_parallel_plan", None),
)

# Every name of nemo_rl.models.dtensor.parallelize, with NeMo RL's parameters (name, default) in order.
# From its documented API (docs.nvidia.com/nemo/rl/latest/apidocs/nemo_rl/nemo_rl.models.dtensor.parallelize.html;
# 0.3.0's page adds get_logprobs_from_vocab_parallel_logits) and its source
# (github.com/NVIDIA-NeMo/RL nemo_rl/models/dtensor/parallelize.py at 02bee2a and 50b4eef, the
# latter adding SequenceParallelAllGatherActivation; ColwiseParallelWithGather and the
# transformers-5 `colwise_gather_output` style from the release copied in xuanduy04/ordures_v070@5cf8f07).
# Classes list their constructor's keyword parameters.
NEMO_RL_NAMES: dict[str, tuple[tuple[str, object], ...] | None] = {
    "RotaryEmbedParallel": (("sequence_dim", 1), ("use_local_output", False)),
    "ColwiseParallelWithGather": (("gather_output", False),),
    "SequenceParallelAllGatherActivation": (("sequence_dim", 1), ("use_local_output", False)),
    "_parallelize_gemma3": (("model", _EMPTY), ("sequence_parallel", False)),
    "_parallelize_llama": (("model", _EMPTY), ("sequence_parallel", False)),
    "_parallelize_qwen": (("model", _EMPTY), ("sequence_parallel", False)),
    "PARALLIZE_FUNCTIONS": None,  # data: {model class: plan function}
    "translate_parallel_style": (("style", _EMPTY),),
    "get_hf_tp_plan": (("model", _EMPTY),),
    "_parallelize_nm5_h": (*((n, _EMPTY) for n in _LAYERS), *_FLAGS),
    "_parallelize_model": (*((n, _EMPTY) for n in _LAYERS), *_FLAGS),
    "to_local_if_dtensor": (("tensor", _EMPTY),),
    "clip_grad_by_total_norm_": (("parameters", _EMPTY), ("max_grad_norm", _EMPTY), ("total_norm", _EMPTY)),
    "get_grad_norm": (
        ("parameters", _EMPTY),
        ("dp_cp_group", _EMPTY),
        ("tp_group", _EMPTY),
        ("norm_type", 2),
        ("dtype", torch.float32),
    ),
    "get_logprobs_from_vocab_parallel_logits": (
        ("vocab_parallel_logits", _EMPTY),
        ("input_ids", _EMPTY),
        ("seq_index", None),
    ),
}
NEMO_RL_PLAN_CLASSES = {  # PARALLIZE_FUNCTIONS' keys and values in NeMo RL
    "Qwen2ForCausalLM": "_parallelize_qwen",
    "Qwen3ForCausalLM": "_parallelize_qwen",
    "LlamaForCausalLM": "_parallelize_llama",
    "Gemma3ForCausalLM": "_parallelize_gemma3",
    "Gemma3ForConditionalGeneration": "_parallelize_gemma3",
}


@pytest.mark.parametrize("name", sorted(NEMO_RL_NAMES))
def test_every_nemo_rl_name_imports_from_plangen_with_nemo_rls_parameters(name):
    exec(f"from plangen.parallelize import {name}", {})  # the way NeMo RL code imports it
    assert name in P.__all__
    expected = NEMO_RL_NAMES[name]
    if expected is None:
        return
    parameters = inspect.signature(getattr(P, name)).parameters
    if inspect.isclass(getattr(P, name)):  # keyword arguments, plus any plangen adds
        assert {n: parameters[n].default for n, _ in expected} == dict(expected)
        return
    # NeMo RL's parameters first, in its order and with its defaults; plangen may add optional ones.
    actual = [(p.name, p.default) for p in parameters.values()]
    assert actual[: len(expected)] == list(expected)
    assert all(p.default is not _EMPTY for p in list(parameters.values())[len(expected) :])


def test_plan_functions_return_a_dict_of_styles_and_runtimes_an_fsdp_module():
    hints = {n: inspect.signature(getattr(P, n)).return_annotation for n in NEMO_RL_NAMES if n.startswith("_par")}
    assert hints["_parallelize_llama"] == hints["_parallelize_qwen"] == hints["_parallelize_gemma3"]
    assert hints["_parallelize_llama"] == "dict[str, ParallelStyle]"
    assert hints["_parallelize_nm5_h"] == hints["_parallelize_model"] == "FSDPModule"


def test_parallize_functions_is_keyed_by_nemo_rls_classes():
    import transformers

    for class_name in NEMO_RL_PLAN_CLASSES:
        assert getattr(transformers, class_name) in P.PARALLIZE_FUNCTIONS, class_name


def test_nm5_h_runs_plangens_runtime_with_nemotron_hs_hand_written_plan(fake_pg, caplog):
    import logging

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from tiny_configs import build_tiny

    mesh = DeviceMesh("cpu", torch.arange(2).view(1, 2), mesh_dim_names=("dp", "tp"))
    model = build_tiny("nemotron_h")
    with caplog.at_level(logging.INFO, logger="plangen"):
        result = P._parallelize_nm5_h(model, mesh["dp"], mesh["tp"], torch.float32)
    assert isinstance(result, FSDPModule)
    assert "using the hand-written plan" in caplog.text
    # After FSDP2 over DP, TP-sharded weights span the (dp, tp) mesh, the Mamba2 mixer's (split by heads) too.
    from plangen.stack.transformers_compat import layer_kind

    mixers = {layer_kind(layer.block_type): layer.mixer for layer in model.model.layers}  # 5.5/5.8: "mamba"
    assert isinstance(mixers["mlp"].up_proj.weight, DTensor) and mixers["mlp"].up_proj.weight.device_mesh.ndim == 2
    assert mixers["linear_attention"].in_proj.weight.device_mesh.ndim == 2


def test_nm5_h_refuses_another_class():
    with pytest.raises(TypeError, match="NemotronHForCausalLM"):
        P._parallelize_nm5_h(torch.nn.Linear(2, 2), None, None, torch.float32)


# --- the plans, applied NeMo RL's way (mock styles, parallelize_module) ----------------------------


def meta_model(config_name: str, layers: int = 2):
    d = json.loads((DATA / "model-configs" / f"{config_name}.json").read_text())
    config = AutoConfig.for_model(d.pop("model_type"), **{k: v for k, v in d.items() if k != "architectures"})
    config.num_hidden_layers = layers
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def meta_gemma3_conditional():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = json.loads((DATA / "model-configs" / "gemma-3-1b.json").read_text())
    text = {k: v for k, v in text.items() if k not in ("architectures", "model_type")} | {"num_hidden_layers": 2}
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    with torch.device("meta"):
        return Gemma3ForConditionalGeneration(
            Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
        )


MODELS = {
    "gemma-3-1b": ("_parallelize_gemma3", lambda: meta_model("gemma-3-1b")),
    "gemma-3-conditional": ("_parallelize_gemma3", meta_gemma3_conditional),
    "qwen3-0.6b": ("_parallelize_qwen", lambda: meta_model("qwen3-0.6b")),
    "qwen2.5-1.5b": ("_parallelize_qwen", lambda: meta_model("qwen2.5-1.5b")),
    "llama-3.2-1b": ("_parallelize_llama", lambda: meta_model("llama-3.2-1b")),
}


def _apply_with_mock_styles(model, plan) -> set[str]:
    # NeMo RL's tests/unit/models/dtensor/test_parallelize.py: every key must be applied.
    applied: set[str] = set()

    class MockParallelStyle(ParallelStyle):
        def __init__(self, key):
            self.key = key

        def _apply(self, module, device_mesh):
            applied.add(self.key)
            return module

    mesh = MagicMock()
    mesh.ndim = 1
    parallelize_module(model, mesh, {key: MockParallelStyle(key) for key in plan})
    return applied


@pytest.fixture(scope="module")
def built():
    return {name: make() for name, (_, make) in MODELS.items()}


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_key_of_each_plan_is_applied(built, name, sequence_parallel):
    model = built[name]
    plan = getattr(P, MODELS[name][0])(model, sequence_parallel=sequence_parallel)
    assert plan and all(isinstance(style, ParallelStyle) for style in plan.values())
    assert find_unmatched_keys(model, plan) == []
    assert _apply_with_mock_styles(model, plan) == set(plan)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_plan_is_the_one_plangens_runtime_applies(built, name, sequence_parallel):
    from plangen.plans.choice import choose_plan

    model = built[name]
    plan = getattr(P, MODELS[name][0])(model, sequence_parallel)
    chosen = choose_plan(model, sequence_parallel)
    assert chosen.source == "hand-written"
    assert {k: repr(v) for k, v in plan.items()} == {
        k: repr(v) for k, v in P.resolve_tied_styles(model, chosen.build_styles()).items()
    }
    registry = P.PARALLIZE_FUNCTIONS[type(model)](model, sequence_parallel)
    assert set(registry) == set(plan)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("name", ["gemma-3-1b", "gemma-3-conditional", "qwen3-0.6b"])
def test_per_head_norms_get_their_gradient_summed_with_sp_on_or_off(built, name, sequence_parallel):
    from plangen.styles import ReplicatedWithGradAllReduce

    plan = getattr(P, MODELS[name][0])(built[name], sequence_parallel)
    norms = {k: v for k, v in plan.items() if k.endswith(("q_norm", "k_norm"))}
    assert len(norms) == 2 and all(isinstance(v, ReplicatedWithGradAllReduce) for v in norms.values())


@pytest.mark.parametrize("name", ["gemma-3-1b", "qwen3-0.6b", "llama-3.2-1b"])
def test_tied_embedding_and_head_are_both_sharded_on_the_vocabulary(built, name):
    from plangen.model.module_tree import tied_embeddings
    from plangen.plans.checks import covering_style

    model = built[name]
    emb, head = tied_embeddings(model)
    plan = getattr(P, MODELS[name][0])(model)
    assert covering_style(model, plan, emb) is not None and covering_style(model, plan, head) is not None


def test_qwen2_plan_names_no_per_head_norm(built):
    # NeMo RL's Qwen SP plan names q_norm/k_norm for Qwen2 too, which has none (its own test skips Qwen2).
    assert not [k for k in P._parallelize_qwen(built["qwen2.5-1.5b"], True) if k.endswith(("q_norm", "k_norm"))]


# --- styles and helpers -------------------------------------------------------------------------


@pytest.fixture
def tp2(fake_pg):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", [0, 1])


def test_colwise_parallel_with_gather_hands_on_the_whole_output_local(tp2):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    gathered = P.ColwiseParallelWithGather(gather_output=True, output_layouts=Shard(-1), use_local_output=False)
    assert gathered.output_layouts == (Replicate(),) and gathered.use_local_output and gathered.gather_output
    plain = P.ColwiseParallelWithGather()
    assert plain.output_layouts == (Shard(-1),) and not plain.gather_output
    holder = torch.nn.Module()
    holder.head = torch.nn.Linear(8, 16)
    parallelize_module(holder, tp2, {"head": gathered})
    assert holder.head.weight.placements == (Shard(0),)
    out = holder.head(torch.randn(3, 8))
    assert not isinstance(out, DTensor) and out.shape == (3, 16)


def test_sequence_parallel_all_gather_activation_gathers_the_sequence(tp2):
    from torch.distributed.tensor import DTensor

    holder = torch.nn.Module()
    holder.norm = torch.nn.LayerNorm(8)
    parallelize_module(holder, tp2, {"norm": P.SequenceParallelAllGatherActivation(use_local_output=True)})
    out = holder.norm(torch.randn(1, 3, 8))  # this rank's 3 positions of 6
    assert not isinstance(out, DTensor) and out.shape == (1, 6, 8)


def test_logprobs_from_plain_logits_are_the_next_token_log_softmax():
    torch.manual_seed(0)
    logits, ids = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(P.get_logprobs_from_vocab_parallel_logits(logits, ids), expected)
    with pytest.raises(NotImplementedError, match="context parallel"):
        P.get_logprobs_from_vocab_parallel_logits(logits, ids, seq_index=torch.arange(5))


# --- `custom_parallel_plan` as NeMo RL resolves it -----------------------------------------------
# Each resolver below re-states, in a few lines, code read in the source named beside it.


def resolve_automodel(tp_shard_plan):
    """NeMo RL's DTensor v2 worker (nemo_rl/models/automodel/setup.py) passes
    dtensor_cfg.custom_parallel_plan as FSDP2Manager(custom_tp_plan=...); NeMo Automodel's
    nemo_automodel/components/distributed/parallelizer.py `_get_parallel_plan` resolves it:
    a dict as is, else import_class_from_path (rsplit, import_module, getattr), calling a function."""
    if isinstance(tp_shard_plan, dict):
        return tp_shard_plan
    try:
        module_name, attribute = tp_shard_plan.rsplit(".", 1)
        plan = getattr(importlib.import_module(module_name), attribute)
        if isinstance(plan, FunctionType):
            plan = plan()
        assert isinstance(plan, dict), f"Parallel plan must be a dictionary, got {type(plan)}"
    except Exception as e:
        raise ValueError(f"Custom parallel plan '{tp_shard_plan}' is not valid. Error: {e}") from e
    return plan


def _hydra_locate(path):
    """hydra/_internal/utils.py `_locate`: import the longest module prefix, getattr the rest."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


def hydra_get_class(path):
    """hydra/utils.py `get_class`: whatever the path locates, unless it is not a class."""
    obj = _hydra_locate(path)
    if not isinstance(obj, type):
        raise ValueError(f"Located non-class of type '{type(obj).__name__}' while loading '{path}'")
    return obj


def _resolve_v1(custom_parallel_plan, loader):
    # nemo_rl/models/dtensor/parallelize.py `_parallelize_model` (the DTensor v1 worker's path).
    if isinstance(custom_parallel_plan, dict):
        return custom_parallel_plan
    try:
        plan = loader(custom_parallel_plan)
        if isinstance(plan, FunctionType):
            plan = plan()
        assert isinstance(plan, dict)
    except:  # noqa: E722 - NeMo RL's bare except, re-raised as its ValueError
        raise ValueError(f"Your custom parallel plan is `{custom_parallel_plan}` which is not valid.")
    return plan


def resolve_v1_hydra(custom_parallel_plan):
    """Releases whose `_parallelize_model` loads with hydra.utils.get_class (xuanduy04/ordures_v070@5cf8f07)."""
    return _resolve_v1(custom_parallel_plan, hydra_get_class)


def resolve_v1_import_class_from_path(custom_parallel_plan):
    """Releases whose `_parallelize_model` loads with nemo_rl.models.policy.utils.import_class_from_path
    (rsplit, import_module, getattr; NVIDIA-NeMo/RL@02bee2a, @50b4eef)."""
    return _resolve_v1(custom_parallel_plan, resolve_automodel)


def resolve_plangen(custom_parallel_plan):
    """plangen's `_parallelize_model` (plangen.plans.choice.choose_plan -> plan_source.load_custom_plan)."""
    from plangen.plan.source import load_custom_plan

    return load_custom_plan(custom_parallel_plan)


RESOLVERS = {
    "automodel (NeMo RL v2 worker)": resolve_automodel,
    "NeMo RL v1, hydra get_class": resolve_v1_hydra,
    "NeMo RL v1, import_class_from_path": resolve_v1_import_class_from_path,
    "plangen _parallelize_model": resolve_plangen,
}
# Which form of custom_parallel_plan each path accepts (docs/nemo-rl.md has the same table).
WORKS = {
    "dict path": {"automodel (NeMo RL v2 worker)", "NeMo RL v1, import_class_from_path", "plangen _parallelize_model"},
    "function path": {
        "automodel (NeMo RL v2 worker)",
        "NeMo RL v1, import_class_from_path",
        "plangen _parallelize_model",
    },
    "module path": {"plangen _parallelize_model"},
    "file path": {"plangen _parallelize_model"},
    "dict object": set(RESOLVERS),
}


@pytest.fixture(scope="module")
def generated_package(tmp_path_factory):
    """`plangen init` for Llama 3.2 1B into a package `generated` (the README's yaml path), plus a
    module with the same plan behind a zero-argument function."""
    from typer.testing import CliRunner

    from plangen.commands.cli import app

    root = tmp_path_factory.mktemp("trainer")
    (root / "generated").mkdir()
    (root / "generated" / "__init__.py").write_text("")
    out = root / "generated" / "llama_plan.py"
    result = CliRunner().invoke(app, ["init", str(DATA / "model-configs" / "llama-3.2-1b.json"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    (root / "generated" / "llama_plan_fn.py").write_text(
        "from generated.llama_plan import custom_parallel_plan as _plan\n\n\n"
        "def custom_parallel_plan():\n    return dict(_plan)\n"
    )
    return root


@pytest.fixture
def forms(generated_package, monkeypatch):
    monkeypatch.syspath_prepend(str(generated_package))
    from generated.llama_plan import custom_parallel_plan

    return {
        "dict path": "generated.llama_plan.custom_parallel_plan",  # the README's form
        "function path": "generated.llama_plan_fn.custom_parallel_plan",
        "module path": "generated.llama_plan",
        "file path": str(generated_package / "generated" / "llama_plan.py"),
        "dict object": custom_parallel_plan,
    }


@pytest.mark.parametrize("resolver", sorted(RESOLVERS))
@pytest.mark.parametrize("form", sorted(WORKS))
def test_which_custom_parallel_plan_form_each_path_accepts(forms, form, resolver):
    from generated.llama_plan import custom_parallel_plan

    if resolver in WORKS[form]:
        plan = RESOLVERS[resolver](forms[form])
        assert {k: repr(v) for k, v in plan.items()} == {k: repr(v) for k, v in custom_parallel_plan.items()}
    else:
        with pytest.raises(ValueError):
            RESOLVERS[resolver](forms[form])


def test_hydra_get_class_locates_the_plan_but_refuses_it_as_not_a_class(forms):
    with pytest.raises(ValueError, match="Located non-class of type 'dict'"):
        hydra_get_class(forms["dict path"])
    with pytest.raises(ValueError, match="Located non-class of type 'function'"):
        hydra_get_class(forms["function path"])


def test_the_generated_plan_fits_the_model_it_was_made_for(forms):
    from generated.llama_plan import custom_parallel_plan

    model = meta_model("llama-3.2-1b")
    assert find_unmatched_keys(model, custom_parallel_plan) == []
    assert _apply_with_mock_styles(model, custom_parallel_plan) == set(custom_parallel_plan)

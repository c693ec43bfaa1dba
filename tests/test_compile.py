"""torch.compile block by block (``parallelize_model(compile=True)``): compiled against eager.

Every case runs the same plan eagerly and compiled (tests/distributed/compile_cases.py): logits, loss
and every gradient within 1e-5 in float32, no graph break, at least one compiled graph, and the same
collectives, by name and count, forward and backward (with activation checkpointing, eager's
recomputing whole layers, as a compiled forward is recomputed: docs/compile.md). Compiling costs seconds of CPU per case: the
default run compiles the one case that broke (Llama without sequence parallel: the embedding's
all-reduce entered the first block still in flight), the sweep of every plan kind is ``slow``:

    .venv/bin/pytest -q -n 0 -m slow tests/test_compile.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import cases_read_by, launched, slow_unless

# transformers records router logits with hooks dynamo cannot trace (plangen.runtime.compile.RECORDED_OUTPUTS):
# the MoE cases train without them, as a compiled run must.
NO_ROUTER_LOGITS = {"config": {"output_router_logits": False}}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CASES = {
    "tp2": [
        {"name": "llama", "model": "llama"},  # hand-written dense, SP off
        {"name": "llama-sp", "model": "llama", "sp": True},  # hand-written dense, SP on
        {"name": "phi3", "model": "phi3"},  # fused qkv_proj / gate_up_proj
        {"name": "gemma3-1kv", "model": "gemma3-1kv"},  # one KV head replicated over TP; scaled tied embedding
        {"name": "qwen3", "model": "qwen3"},  # per-head q/k norms
        {"name": "olmo2-sp", "model": "olmo2", "sp": True},  # norms over the whole projection, sharded
        {"name": "qwen3_moe", "model": "qwen3_moe", **NO_ROUTER_LOGITS},  # experts split on the expert dim
        {"name": "qwen3_moe-sp", "model": "qwen3_moe", "sp": True, **NO_ROUTER_LOGITS},
        {"name": "mixtral-3-experts", "model": "mixtral-3-experts", **NO_ROUTER_LOGITS},  # each expert split
        {"name": "qwen2_moe", "model": "qwen2_moe", **NO_ROUTER_LOGITS},  # shared expert
        {"name": "deepseek_v3", "model": "deepseek_v3", **NO_ROUTER_LOGITS},  # MLA
        {"name": "nemotron_h", "model": "nemotron_h"},  # Mamba2 mixers by heads; one block class, four mixers
        {"name": "mamba", "model": "mamba", "plan_kind": "synthesized", "attn": "eager"},  # Mamba1 mixers by channels
        {"name": "qwen3_5-linear", "model": "qwen3_5-linear", "plan_kind": "synthesized"},  # gated delta net
        {"name": "llama-lora", "model": "llama", "lora": LORA_TARGETS},
        {"name": "llama-stable", "model": "llama", "variant": "stable"},
        {"name": "llama-ac", "model": "llama", "ac": True},  # activation checkpointing: compiled forwards
        {"name": "llama-sp-ac", "model": "llama", "sp": True, "ac": True},
        {"name": "qwen3_moe-ac", "model": "qwen3_moe", "ac": True, **NO_ROUTER_LOGITS},
    ],
    "dp2tp2": [  # hand-written plans under FSDP2 too
        {"name": "llama", "model": "llama"},
        {"name": "llama-sp", "model": "llama", "sp": True},
        {"name": "phi3", "model": "phi3"},
        {"name": "qwen3_moe", "model": "qwen3_moe", **NO_ROUTER_LOGITS},
        {"name": "llama-ac", "model": "llama", "ac": True},
        {"name": "llama-sp-ac", "model": "llama", "sp": True, "ac": True},
        {"name": "qwen3_moe-ac", "model": "qwen3_moe", "ac": True, **NO_ROUTER_LOGITS},
    ],
}
DEFAULT = {"tp2/llama"}
IDS = [f"{mesh}/{case['name']}" for mesh, cases in CASES.items() for case in cases]


def LAUNCH(items) -> tuple:
    return (
        "tests/distributed/compile_cases.py:run_compile_cases",
        4,
        cases_read_by(items, sys.modules[__name__], CASES),
        3000,
    )


@pytest.fixture(scope="module")
def results(request):
    return launched(request)[0]


@pytest.mark.parametrize("case_id", slow_unless(IDS, DEFAULT))
def test_compiled_blocks_match_eager_with_the_same_collectives(results, case_id):
    result = results[case_id]
    assert "error" not in result, result.get("trace", result)
    assert result["graph_breaks"] == 0
    assert result["graphs"] >= 1  # something compiled
    assert result["missing_grads"] == [] and result["grads"] > 0
    assert result["logits"] <= 1e-5 and result["loss"] <= 1e-5
    assert result["grad"] <= 1e-5, result["worst_grad"]
    collectives = result["collectives"]
    # With activation checkpointing, against eager recomputing whole layers, as compiled layers must
    # (tests/distributed/compile_cases.py); eager's early stop saves each layer's last collective.
    if not result["layers_in_pieces"]:
        assert collectives["compiled"] == collectives.get("eager-whole", collectives["eager"])
        return
    # Layers compiled around eager experts (transformers 5.5/5.8, docs/compile.md): the same as eager,
    # and with checkpointing between eager's early stop and whole recomputation (the eager MoE block
    # ends the layer, so its early stop still saves the layer's last collective).
    assert collectives["compiled"][0] == collectives["eager"][0]
    low, high = collectives["eager"][1], collectives.get("eager-whole", collectives["eager"])[1]
    for kind in set(low) | set(high) | set(collectives["compiled"][1]):
        assert low.get(kind, 0) <= collectives["compiled"][1].get(kind, 0) <= high.get(kind, 0), (kind, collectives)


# --- without a launch ---------------------------------------------------------------------------


def test_waiting_for_an_async_collective_keeps_the_gradient():
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    from plangen.runtime.compile import wait_async

    class Pending(torch.autograd.Function):  # as DTensor's to_local hands on an async result: a view of it
        @staticmethod
        def forward(ctx, x):
            result = AsyncCollectiveTensor(x * 2)
            return result.view_as(result)

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    leaf = torch.randn(3, requires_grad=True)
    pending = Pending.apply(leaf)
    assert isinstance(pending, AsyncCollectiveTensor)
    waited = wait_async((pending, 1))
    assert type(waited[0]) is torch.Tensor and waited[1] == 1
    waited[0].sum().backward()
    assert torch.equal(leaf.grad, torch.full((3,), 2.0))
    plain = torch.ones(2)
    assert wait_async(plain) is plain and wait_async({"a": plain})["a"] is plain


def test_recorded_router_logits_leave_the_layers_eager():
    from transformers import AutoConfig, AutoModelForCausalLM

    from plangen.runtime.compile import apply_compile, find_compile_blocker
    from tiny_configs import TINY

    kwargs = dict(TINY["qwen3_moe"])
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))
    assert "output_router_logits" in find_compile_blocker(model)
    assert apply_compile(model, list(model.model.layers)) == []
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    model.config.output_router_logits = False
    assert find_compile_blocker(model) is None


def test_a_block_class_holding_different_mixers_compiles_its_children():
    """NemotronH's one block class holds a Mamba2 mixer, MoE, attention or an MLP under ``mixer``, with
    ``head_dim`` 16 or 8: compiled whole, the attention layer's recompile makes ``head_dim`` symbolic
    and inductor fails (docs/compile.md); its children compile instead. Other layers compile whole."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from plangen.runtime.compile import apply_compile, compile_units, eager_modules, mixed_children
    from tiny_configs import TINY

    def build(name):
        kwargs = dict(TINY[name])
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))

    nemotron = build("nemotron_h")
    blocks = list(nemotron.model.layers)
    assert len({type(block.mixer) for block in blocks}) > 1
    assert mixed_children(blocks) == {type(blocks[0]): ["mixer"]}
    units = apply_compile(nemotron, blocks)
    children = [child for block in blocks for child in block.children()]
    if not eager_modules(blocks):
        assert units == children
    else:  # transformers 5.5/5.8: the MoE mixer's experts stay eager, the pieces around them compile
        assert set(units) - set(children) and all(any(u in list(c.modules()) for c in children) for u in units)
    assert all(block._compiled_call_impl is None for block in blocks)
    # A child compiles whole (its call); a piece around eager experts compiles its forward (an instance attribute).
    assert all(unit._compiled_call_impl is not None if unit in children else "forward" in vars(unit) for unit in units)
    llama = build("llama")
    assert mixed_children(list(llama.model.layers)) == {}
    assert compile_units(list(llama.model.layers)) == list(llama.model.layers)
    # Qwen3-MoE's mlp is MoE or dense, with no int that differs: its layers compile whole, as measured.
    moe_layers = list(build("qwen3_moe").model.layers)
    assert len({type(layer.mlp) for layer in moe_layers}) > 1
    assert compile_units(moe_layers) == moe_layers or eager_modules(moe_layers)  # 5.5/5.8: around the experts


def test_a_checkpointed_layer_compiles_its_forward_and_recomputes_it():
    """Composable checkpointing's hooks stay eager around the compiled forward (compiled with the
    layer, they fail: docs/compile.md); backward's recomputation reruns the compiled forward: the
    same gradients as eager, and no layer's ``__call__`` compiled."""
    import copy

    from torch import nn

    from plangen.stack.torch_compat import composable_checkpoint
    from plangen.runtime.compile import apply_compile

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.tanh(self.proj(x))

    torch.manual_seed(0)
    eager = nn.Sequential(Layer(), Layer())
    compiled = copy.deepcopy(eager)
    for layer in compiled:
        composable_checkpoint(layer)
    assert apply_compile(compiled, list(compiled)) == list(compiled)
    assert all(layer._compiled_call_impl is None and "forward" in vars(layer) for layer in compiled)
    x = torch.randn(3, 8)
    eager(x).pow(2).sum().backward()
    compiled(x).pow(2).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_verify_compile_without_run_is_a_one_line_usage_error(tmp_path):
    from typer.testing import CliRunner

    from plangen.commands.cli import app

    plan = tmp_path / "plan.py"
    plan.write_text("custom_parallel_plan = {}\n")
    result = CliRunner().invoke(app, ["verify", "--compile", str(plan)])
    assert result.exit_code == 2
    assert result.stderr.strip() == "plangen: error: --compile runs the plans: add --run"


@pytest.mark.slow
def test_verify_run_compile_passes_a_hand_written_plan():
    """``plangen verify --run --compile``: the parity stage with the decoder layers compiled (~2.5 min)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    argv = [
        sys.executable,
        "-m",
        "plangen",
        "verify",
        "--run",
        "--compile",
        "--timeout",
        "500",
        "generated/llama_plan.py",
    ]
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "decoder layers compiled" in done.stderr

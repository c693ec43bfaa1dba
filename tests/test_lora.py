"""Plans on peft LoRA models (plangen.runtime.lora): keys translated once, adapters placed to match the base.

Single process: the translation is pure, and a fake process group runs TP=2 for the exact
collectives the adapters add. Numerics against the unsharded LoRA model: test_lora_distributed.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

from plangen.distributed.comm import CollectiveCounter
from plangen.runtime.lora import ReplicatedAdapter, find_lora_base, resolve_lora_styles, resolve_plan_model
from plangen.loss import vocab_parallel_cross_entropy
from plangen.plans.checks import PlanError
from plangen.plans.choice import choose_plan
from plangen.runtime.tensor_parallel import apply_tp
from tiny_configs import build_tiny

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYER0 = "base_model.model.model.layers.0"
BATCH, SEQ, RANK = 2, 8, 4


def lora_model(name: str = "llama", targets=("q_proj", "o_proj"), **config):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(build_tiny(name), peft.LoraConfig(r=RANK, target_modules=list(targets), **config))


def test_keys_for_the_base_model_land_on_base_layers_and_adapters():
    model = lora_model(targets=("q_proj", "o_proj"))
    plan = choose_plan(find_lora_base(model)[1], False).build_styles()
    resolved = resolve_lora_styles(model, plan, tp_size=2)
    layer = "base_model.model.model.layers.*"

    q = f"{layer}.self_attn.q_proj"
    assert resolved[f"{q}.base_layer"] is plan["model.layers.*.self_attn.q_proj"]
    gather = resolved[q]  # the wrapper hands both paths one replicated DTensor
    assert isinstance(gather, PrepareModuleInput) and gather.desired_input_layouts == (Replicate(),)
    assert not gather.use_local_output
    assert type(resolved[f"{q}.lora_A.*"]) is ReplicatedAdapter
    lora_b = resolved[f"{q}.lora_B.*"]
    assert type(lora_b) is ColwiseParallel and lora_b.output_layouts == (Shard(-1),) and lora_b.use_local_output

    o = f"{layer}.self_attn.o_proj"
    assert o not in resolved  # nothing to prepare: both paths take the same feature shard
    assert resolved[f"{o}.base_layer"] is plan["model.layers.*.self_attn.o_proj"]
    lora_a = resolved[f"{o}.lora_A.*"]
    assert type(lora_a) is RowwiseParallel and lora_a.input_layouts == (Shard(-1),)
    assert lora_a.output_layouts == (Replicate(),) and not lora_a.use_local_output
    lora_b = resolved[f"{o}.lora_B.*"]
    assert type(lora_b) is ReplicatedAdapter and lora_b.use_local_output

    # Modules without LoRA keep their style, under the peft prefix; nothing else is added.
    assert resolved[f"{layer}.self_attn.k_proj"] is plan["model.layers.*.self_attn.k_proj"]
    assert type(resolved[f"{o}.lora_dropout.*"]).__name__ == "FeatureShardedDropout"  # the whole input's mask
    assert len(resolved) == len(plan) + 3 + 3  # q_proj: wrapper, base, A, B; o_proj: base, A, B, dropout


def test_sequence_parallel_row_adapters_return_what_the_base_returns():
    model = lora_model(targets=("down_proj",))
    plan = choose_plan(find_lora_base(model)[1], True).build_styles()
    resolved = resolve_lora_styles(model, plan, tp_size=2)
    down = "base_model.model.model.layers.*.mlp.down_proj"
    assert resolved[f"{down}.lora_A.*"].output_layouts == (
        Shard(1),
    )  # reduce-scatter [tokens, r], not [tokens, hidden]
    assert not resolved[f"{down}.lora_B.*"].use_local_output  # the base's output is a sequence-sharded DTensor


def test_keys_already_written_for_the_peft_model_are_kept_and_a_model_without_lora_is_unchanged():
    model = lora_model(targets=("q_proj",))
    key = f"{LAYER0}.self_attn.q_proj"
    assert f"{key}.base_layer" in resolve_lora_styles(model, {key: ColwiseParallel()}, tp_size=2)
    plain = build_tiny("llama")
    styles = {"model.layers.*.self_attn.q_proj": ColwiseParallel()}
    assert resolve_lora_styles(plain, styles, tp_size=2) == styles


def test_a_key_matching_wrapped_and_plain_modules_is_spelled_out_per_module():
    model = lora_model(targets=("q_proj",), layers_to_transform=[0])  # layer 1's q_proj stays nn.Linear
    style = ColwiseParallel()
    resolved = resolve_lora_styles(model, {"model.layers.*.self_attn.q_proj": style}, tp_size=2)
    assert resolved["base_model.model.model.layers.0.self_attn.q_proj.base_layer"] is style
    assert resolved["base_model.model.model.layers.1.self_attn.q_proj"] is style
    assert "base_model.model.model.layers.1.self_attn.q_proj.base_layer" not in resolved


@pytest.mark.parametrize(
    "key, style, message",
    [
        (f"{LAYER0}.self_attn.q_proj.base_layer", ColwiseParallel(), "selects the inside of a LoRA layer"),
        ("model.layers.*.self_attn.q_proj.lora_A.default", ColwiseParallel(), "selects the inside of a LoRA layer"),
        ("model.layers.*.self_attn.q_proj", SequenceParallel(), "SequenceParallel cannot be placed"),
    ],
)
def test_keys_that_hit_lora_layers_wrongly_are_refused(key, style, message):
    model = lora_model(targets=("q_proj",))
    with pytest.raises(PlanError, match=message):
        resolve_lora_styles(model, {key: style}, tp_size=2)


def test_lora_on_replicated_kv_heads_is_refused():
    # One KV head at TP 2: the base k/v rows are sliced per rank (plangen.styles.kv_heads); lora_B cannot follow.
    model = lora_model("qwen3-1kv", targets=("v_proj",))
    plan = choose_plan(find_lora_base(model)[1], False).build_styles()
    with pytest.raises(PlanError, match=r"KV heads \(1\) are replicated over TP size 2"):
        resolve_lora_styles(model, plan, tp_size=2)
    assert resolve_lora_styles(model, plan, tp_size=1)  # TP 1 slices nothing


@pytest.mark.parametrize("name", ["granite-1kv", "llama"])
def test_the_plan_is_chosen_for_the_model_without_lora(name):
    """Synthesis reads nn.Linear children and forward sources: on the LoRA layers it finds another
    plan than the sweep proved (or none), so the plan is chosen on the model without LoRA."""
    bare = choose_plan(build_tiny(name), False)
    model = lora_model(name, targets=("q_proj", "o_proj"))
    view = resolve_plan_model(model)
    assert view.device.type == "meta" and not any("lora" in n for n, _ in view.named_modules())
    chosen = choose_plan(view, False)
    assert (chosen.source, repr(chosen.build_styles())) == (bare.source, repr(bare.build_styles()))
    if name == "granite-1kv":  # read on the LoRA layers, the tree gives another plan than the one proven
        on_lora = choose_plan(find_lora_base(model)[1], False)
        assert repr(on_lora.build_styles()) != repr(bare.build_styles())


@pytest.fixture
def mesh(fake_pg):
    return DeviceMesh("cpu", torch.arange(2))


def _step(model, mesh, sequence_parallel: bool):
    apply_tp(model, mesh, choose_plan(find_lora_base(model)[1], sequence_parallel).build_styles())
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with CollectiveCounter() as forward:
        logits = model(input_ids=ids).logits
    loss = vocab_parallel_cross_entropy(logits, ids)
    with CollectiveCounter() as backward:
        loss.backward()
    return Counter(forward.records), Counter(backward.records)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_adapters_add_one_rank_wide_collective_per_row_parallel_layer(mesh, sequence_parallel):
    """Forward: the two row-parallel adapters per layer reduce [tokens, r] (the base's collectives are
    [tokens, hidden]); column-parallel adapters add none. Backward: base and frozen weights add
    nothing; column adapters' lora_A gradients stay Partial for FSDP2 to all-reduce (r x in)."""
    base_forward, _ = _step(build_tiny("llama").train(), mesh, sequence_parallel)
    model = lora_model(targets=ALL_LINEAR).train()
    forward, backward = _step(model, mesh, sequence_parallel)
    layers, fp32 = 2, 4
    added = forward - base_forward
    assert not base_forward - forward
    if sequence_parallel:  # reduce-scatter to the sequence shard, all-gathered back in backward
        assert added == {("reduce_scatter_tensor", BATCH * SEQ // 2 * RANK * fp32): 2 * layers}
        hidden = BATCH * SEQ * 32 * fp32
        assert backward == {
            ("reduce_scatter_tensor", hidden // 2): 2 * layers,  # the blocks' input gradients, as without LoRA
            ("all_gather_into_tensor", hidden): 2 * layers,
            ("all_gather_into_tensor", BATCH * SEQ * RANK * fp32): 2 * layers,
        }
    else:
        assert added == {("all_reduce", BATCH * SEQ * RANK * fp32): 2 * layers}
        assert backward == {("all_reduce", BATCH * SEQ * 32 * fp32): 2 * layers}
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert sorted(grads) == sorted(n for n, p in model.named_parameters() if "lora_" in n)
    for proj in ("self_attn.q_proj", "mlp.up_proj"):
        assert grads[f"{LAYER0}.{proj}.lora_A.default.weight"].placements == (Partial(),)
        assert grads[f"{LAYER0}.{proj}.lora_B.default.weight"].placements == (Shard(0),)


def test_apply_tp_keeps_frozen_weights_frozen(mesh):
    """torch's SequenceParallel replaces each norm weight by a new, trainable Parameter."""
    model = build_tiny("qwen3").requires_grad_(False)  # SP norms and per-head norms (ReplicatedWithGradAllReduce)
    apply_tp(model, mesh, choose_plan(model, True).build_styles())
    assert isinstance(model.model.norm.weight, DTensor)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == []

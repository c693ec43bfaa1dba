"""Inkling's MoE block: its router over routed and shared experts, and SharedExpertsParallel (shared
experts packed as 3-D weights applied by bmm): what is recognised, what is sharded, what is refused.

Numerics (logits, every gradient, the gradient norm, AdamW steps, the full state dict at DP 2 x TP 2)
are in tests/test_synthesized_distributed.py (the inkling_text cases) and the sweep; collective
counts in tests/test_comm_counts.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard

from plangen.styles.shared_experts import SharedExpertsParallel, packed_shared_shape
from tiny_configs import build_tiny


def _moe_block():
    model = build_tiny("inkling")
    block = model.model.layers[1].mlp
    for param in block.shared_experts.parameters():  # torch.empty in the constructor
        nn.init.normal_(param, std=0.3)
    return block


def _config():
    from transformers import AutoConfig

    from tiny_configs import TINY

    return AutoConfig.for_model("inkling_text", **{k: v for k, v in TINY["inkling"].items() if k != "model_type"})


def test_each_rank_holds_a_slice_of_every_shared_experts_intermediate(fake_pg):
    shared = _moe_block().shared_experts
    assert packed_shared_shape(shared) == (2, 16, 32)
    whole = {n: p.detach().clone() for n, p in shared.named_parameters()}
    SharedExpertsParallel(output_layouts=Partial())._apply(shared, DeviceMesh("cpu", torch.arange(2)))
    for name, dim in (("gate_proj", 1), ("up_proj", 1), ("down_proj", 2)):
        param = getattr(shared, name)
        assert isinstance(param, DTensor) and param.placements == (Shard(dim),)
        # rank 0 of 2: intermediate channels 0-7 of each of the 2 shared experts
        assert torch.equal(param.to_local(), whole[name].narrow(dim, 0, 8)), name


def test_the_ranks_partial_outputs_and_scale_gradients_sum_to_the_whole_ones(fake_pg):
    """Each rank runs the model's own forward on its slices: the two ranks' outputs sum to the
    unsharded output, and so do the per-token scales' gradients (which the style sums over TP)."""
    shared = _moe_block().shared_experts
    hidden = torch.randn(2, 3, 32)
    gammas = torch.rand(6, 2, requires_grad=True)
    expected = shared(hidden, gammas=gammas)
    expected.sum().backward()
    whole_grad, gammas.grad = gammas.grad.clone(), None
    parts = []
    for rank in range(2):
        part = type(shared)(_config())
        for name, dim in (("gate_proj", 1), ("up_proj", 1), ("down_proj", 2)):
            getattr(part, name).data = getattr(shared, name).detach().narrow(dim, rank * 8, 8).clone()
        parts.append(part(hidden, gammas=gammas))
    torch.testing.assert_close(parts[0] + parts[1], expected, rtol=1e-6, atol=1e-6)
    (parts[0] + parts[1]).sum().backward()
    torch.testing.assert_close(gammas.grad, whole_grad, rtol=1e-6, atol=1e-6)
    # Sharded on the fake rank 0: the style's forward is rank 0's part.
    SharedExpertsParallel(output_layouts=Partial())._apply(shared, DeviceMesh("cpu", torch.arange(2)))
    torch.testing.assert_close(shared(hidden, gammas=gammas), parts[0], rtol=0, atol=0)
    assert all(isinstance(p, DTensor) for p in shared.parameters())  # put back after the forward


def test_an_intermediate_the_tp_size_does_not_divide_and_other_modules_are_refused_in_one_line(fake_pg):
    shared = _moe_block().shared_experts
    with pytest.raises(ValueError, match=r"intermediate width 16 does not divide by the TP size 3") as error:
        SharedExpertsParallel()._apply(shared, DeviceMesh("cpu", torch.arange(3)))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="SharedExpertsParallel applies to shared experts of 3-D gate_proj"):
        SharedExpertsParallel()._apply(nn.Linear(4, 4), DeviceMesh("cpu", torch.arange(2)))


def test_the_router_over_routed_and_shared_experts_is_recognised_and_stays_whole():
    """The router's weight is [8 routed + 2 shared, H] beside a learned global_scale: it is the
    block's router (whole on every rank), the routed experts split by ExpertsParallel and the shared
    ones by SharedExpertsParallel, both leaving partial sums the block reduces once, and their input
    gradients too (MoeBlockParallel: one all-reduce for both, the router's share counted once)."""
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    model = build_tiny("inkling")
    assert tuple(model.model.layers[1].mlp.gate.weight.shape) == (10, 32)
    plan = build_synthesized_plan(model, sequence_parallel=False)
    styles = {e.pattern: (e.style, e.kwargs) for e in plan.entries}
    partial = {"output_layouts": Partial(), "sum_input_grad": False}
    assert styles["model.layers.*.mlp.experts"] == ("ExpertsParallel", partial)
    assert styles["model.layers.*.mlp.shared_experts"] == ("SharedExpertsParallel", partial)
    assert styles["model.layers.1.mlp"][0] == "MoeBlockParallel" and styles["model.layers.1.mlp"][1]["router"] == "gate"
    assert styles["model.layers.1.mlp"][1]["output_layouts"] == (Partial(),)
    kept = {r.pattern: r.why for r in plan.replicated}
    assert kept["model.layers.*.mlp.gate"] == "the router sees every token on every rank: routing stays exact"


def test_a_router_with_more_rows_than_the_experts_and_the_shared_ones_is_not_one():
    from plangen.plans.families.moe_parts import is_router, packed_shared_children, router_rows

    block = _moe_block()
    shared = packed_shared_children(block, 32)
    assert shared == ("shared_experts",) and router_rows(block, 8, shared) == {8, 10}
    assert is_router(block.gate, {8, 10}, {32})
    assert not is_router(nn.Linear(32, 11, bias=False), {8, 10}, {32})


def test_the_file_init_writes_is_clean_and_verify_names_the_largest_tp_size_and_the_misfit(tmp_path):
    """Inkling at its default size: the file `plangen init` writes is clean at TP 2 and gives the
    shared experts' shard shape; at TP 2048 the shared experts' intermediate (3072) does not divide
    (PG204, naming TP 8, which the full-attention layers' 8 KV heads allow); the style on the router is PG203."""
    from plangen.check import VerifyOptions, verify_plan_files
    from plangen.commands.init import init_plan

    path = init_plan("inkling_text", tmp_path / "inkling_plan.py").path
    source = path.read_text()
    line = next(i for i, text in enumerate(source.splitlines(), 1) if '"model.layers.*.mlp.shared_experts"' in text)
    assert "66 × InklingSharedExperts [2, 3072, 6144] → local [2, 1536, 6144] at TP=2" in source
    assert verify_plan_files([path], VerifyOptions(tp_size=2)).diagnostics == []
    at_2048 = verify_plan_files([path], VerifyOptions(tp_size=2048)).diagnostics
    conv = next(i for i, text in enumerate(source.splitlines(), 1) if '"model.layers.*.self_attn.k_sconv"' in text)
    assert [d.code for d in at_2048 if d.line == conv] == ["PG204"]  # 1024 channels of 8 KV heads at full attention
    assert "conv channels" in next(d.message for d in at_2048 if d.line == conv)
    found = [d for d in at_2048 if d.line == line]
    assert [d.code for d in found] == ["PG204"]
    assert "each shared expert's intermediate width=3072" in found[0].message
    assert "the largest legal TP size for this plan is 8" in found[0].message  # 8 KV heads (full attention)
    path.write_text(source.replace('"model.layers.*.mlp.shared_experts"', '"model.layers.*.mlp.gate"'))
    found = verify_plan_files([path], VerifyOptions(tp_size=2)).diagnostics
    assert ("PG203", line) in [(d.code, d.line) for d in found]

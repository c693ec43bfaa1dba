"""FlatExpertsParallel (DBRX's experts of flat [E * ffn, H] weights): what it shards and what it refuses.

Numerics (logits, every gradient, grad norms, AdamW steps, full state dicts at DP 2 x TP 2, SP off
and on) are in tests/test_parallelize_distributed.py (the dbrx cases) and the sweep; collective
counts in tests/test_comm_counts.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard
from transformers import AutoConfig, AutoModelForCausalLM

from plangen.styles.flat_experts import FlatExpertsParallel, flat_expert_shape
from plangen.plans.choice import choose_plan
from plangen.runtime.tensor_parallel import apply_tp
from conftest import stack_cannot_run
from tiny_configs import TINY

# DBRX where the installed transformers cannot run its own DBRX (5.8.x): every test here skips.
pytestmark = pytest.mark.skipif(bool(stack_cannot_run("dbrx")), reason=stack_cannot_run("dbrx") or "")


def _dbrx(**ffn):
    kwargs = dict(TINY["dbrx"])
    kwargs["ffn_config"] = {**kwargs["ffn_config"], **ffn}
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def test_each_rank_holds_whole_experts_of_every_flat_weight(fake_pg):
    model = _dbrx()
    experts = model.transformer.blocks[0].ffn.experts
    assert flat_expert_shape(experts) == (4, 16, 32)
    whole = {n: p.detach().clone() for n, p in experts.mlp.named_parameters()}
    FlatExpertsParallel(output_layouts=Partial())._apply(experts, DeviceMesh("cpu", torch.arange(2)))
    for name, param in experts.mlp.named_parameters():
        assert isinstance(param, DTensor) and param.placements == (Shard(0),)
        # rank 0 of 2: experts 0 and 1, rows [0, 2 * ffn) of the flat weight
        assert torch.equal(param.to_local(), whole[name][: 2 * 16])
    assert experts.num_experts == 4  # global ids: the style's loop picks this rank's experts


def test_the_dbrx_plan_shards_the_flat_experts_and_the_attention(fake_pg):
    model = _dbrx()
    chosen = choose_plan(model, sequence_parallel=True)
    assert chosen.source == "hand-written"
    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), chosen.build_styles())
    sharded = {n for n, p in model.named_parameters() if isinstance(p, DTensor) and p.placements[0].is_shard()}
    whole = {n for n, _ in model.named_parameters()} - sharded
    # Left whole: the norms and the routers (every rank routes every token).
    assert all(n.endswith(("norm_1.weight", "norm_2.weight", "norm_f.weight", "router.layer.weight")) for n in whole), (
        whole
    )


def test_experts_the_tp_size_does_not_divide_split_each_experts_ffn_rows(fake_pg):
    """3 experts at TP 2: every rank holds its half of every expert's ffn rows, contiguous after the
    re-layout ([e_0 r; e_1 r; e_2 r]), a plain Shard(0) of each flat weight; the ids stay global."""
    experts = _dbrx(moe_num_experts=3).transformer.blocks[0].ffn.experts
    whole = {n: p.detach().clone() for n, p in experts.mlp.named_parameters()}
    FlatExpertsParallel(output_layouts=Partial())._apply(experts, DeviceMesh("cpu", torch.arange(2)))
    assert experts._plangen_expert_layout == "intermediate" and experts.num_experts == 3
    for name, param in experts.mlp.named_parameters():
        assert isinstance(param, DTensor) and param.placements == (Shard(0),)
        # rank 0 of 2: rows [0, 8) of each expert's 16
        expected = whole[name].view(3, 16, 32)[:, :8].reshape(24, 32)
        assert torch.equal(param.to_local(), expected), name


def test_the_ffn_split_sums_to_the_unsharded_experts(fake_pg):
    """Each rank's slice of every expert gives a partial output; the two ranks' partials (rank 1's
    computed by applying rank 0's style to the other half) add up to the unsharded experts' output."""
    from plangen.styles.flat_experts import _expert_rows_by_rank, _local_experts_forward

    experts = _dbrx(moe_num_experts=3).transformer.blocks[0].ffn.experts
    hidden, index = torch.randn(2, 5, 32), torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]] * 2)
    weights = torch.rand(10, 2)
    expected = experts(hidden, index, weights)
    order = _expert_rows_by_rank(3, 16, 2)
    relaid = {n: p.detach().index_select(0, order) for n, p in experts.mlp.named_parameters()}
    parts = []
    for rank in range(2):
        for name, value in relaid.items():
            experts.mlp._parameters[name] = nn.Parameter(value[rank * 24 : (rank + 1) * 24])
        parts.append(_local_experts_forward(experts.mlp, hidden, index, weights, 3, 8, 32, 0, 3))
    torch.testing.assert_close(parts[0] + parts[1], expected)


def test_neither_layout_is_refused_in_one_line_naming_the_largest_tp_size(fake_pg):
    experts = _dbrx(moe_num_experts=6, ffn_hidden_size=18).transformer.blocks[0].ffn.experts
    with pytest.raises(
        ValueError,
        match=r"6 experts do not divide by the TP size 4, nor does each expert's ffn width 18"
        r" \(the other layout\) \(largest legal TP size: 3\)",
    ) as error:
        FlatExpertsParallel()._apply(experts, DeviceMesh("cpu", torch.arange(4)))
    assert "\n" not in str(error.value)


def test_a_module_without_flat_experts_is_refused(fake_pg):
    with pytest.raises(ValueError, match="FlatExpertsParallel applies to experts with num_experts"):
        FlatExpertsParallel()._apply(nn.Linear(4, 4), DeviceMesh("cpu", torch.arange(2)))


def test_a_rank_whose_experts_get_no_route_still_reaches_every_gradient(fake_pg):
    """Every route to the other rank's experts: this rank's output is zero, but its backward still
    reaches the hidden states' and routing weights' gradient all-reduces (the other ranks wait in
    them) and gives the weights a (zero) gradient (FSDP2 reduce-scatters the same ones on every DP rank)."""
    experts = _dbrx().transformer.blocks[0].ffn.experts
    FlatExpertsParallel()._apply(experts, DeviceMesh("cpu", torch.arange(2)))  # rank 0: experts 0 and 1
    hidden = torch.randn(2, 3, 32, requires_grad=True)
    weights = torch.rand(6, 2, requires_grad=True)
    index = torch.tensor([[2, 3]] * 6)
    output = experts(hidden, index, weights)
    assert torch.equal(output, torch.zeros(2, 3, 32))
    output.sum().backward()
    assert torch.equal(hidden.grad, torch.zeros_like(hidden)) and torch.equal(weights.grad, torch.zeros_like(weights))
    for name, param in experts.mlp.named_parameters():
        assert param.grad is not None and not param.grad.to_local().any(), name


def test_verify_takes_tp_sizes_that_split_the_experts_ffn_and_refuses_other_modules(tmp_path):
    """DBRX's default config: 4 experts of ffn 10752, 16 query heads and one KV head. At TP 8 the
    experts no longer divide but each expert's ffn does: verify is clean (it said PG204 before the
    ffn split); the style on a module without flat experts is PG203."""
    from pathlib import Path

    from plangen.check import VerifyOptions, verify_plan_files

    source = (Path(__file__).resolve().parents[1] / "generated" / "dbrx_plan.py").read_text()
    experts_line = next(
        i for i, line in enumerate(source.splitlines(), 1) if '"transformer.blocks.*.ffn.experts"' in line
    )
    path = tmp_path / "dbrx_plan.py"
    path.write_text(source)
    assert verify_plan_files([path], VerifyOptions(tp_size=2)).diagnostics == []
    assert verify_plan_files([path], VerifyOptions(tp_size=8)).diagnostics == []
    path.write_text(source.replace('"transformer.blocks.*.ffn.experts"', '"transformer.blocks.*.ffn.router"'))
    found = verify_plan_files([path], VerifyOptions(tp_size=2)).diagnostics
    assert ("PG203", experts_line) in [(d.code, d.line) for d in found]


def test_verify_names_the_largest_tp_size_where_neither_layout_fits():
    """6 experts of ffn 18 at TP 4: neither whole experts nor each expert's ffn split fits: PG204 at
    the experts' entry, in the style's own words (the largest legal TP size, 3)."""
    from plangen.check.model_plan import ModelPlan
    from plangen.check.rules.model.shapes import DivisibilityRule

    model = _dbrx(moe_num_experts=6, ffn_hidden_size=18)
    styles = {"transformer.blocks.*.ffn.experts": FlatExpertsParallel(output_layouts=Partial())}
    plan = ModelPlan(model=model, tp_size=4, sequence_parallel=False, written=styles, styles=styles)
    found = list(DivisibilityRule().check(plan))
    assert [(f.code, f.key) for f in found] == [("PG204", "transformer.blocks.*.ffn.experts")]
    assert "nor does each expert's ffn width 18 (the other layout) (largest legal TP size: 3)" in found[0].message
    plan = ModelPlan(model=model, tp_size=3, sequence_parallel=False, written=styles, styles=styles)
    assert list(DivisibilityRule().check(plan)) == []  # 3 divides the experts (and the ffn)

"""What differs between transformers releases (plangen/stack/transformers_compat.py), each difference
reproduced on the pinned release by a tiny stand-in of the other release's module shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial

from plangen.stack import transformers_compat
from plangen.styles import experts as moe_styles
from plangen.styles.experts import ExpertsParallel


class _KernelRows(torch.autograd.Function):
    """A grouped matmul as the grouped_mm kernel runs it: rows past the last group (the sentinel
    routes, sorted to the tail) are written neither in forward nor in backward; their
    uninitialised memory stands here as 1e30."""

    @staticmethod
    def forward(ctx, x, weight, valid):  # type: ignore[override]
        ctx.save_for_backward(x, weight, valid)
        out = torch.bmm(x.unsqueeze(1), weight).squeeze(1)
        return torch.where(valid[:, None], out, torch.full_like(out, 1e30))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, weight, valid = ctx.saved_tensors
        grad_x = torch.bmm(grad.unsqueeze(1), weight.transpose(1, 2)).squeeze(1)
        grad_w = (x.unsqueeze(2) * grad.unsqueeze(1)) * valid[:, None, None]
        return torch.where(valid[:, None], grad_x, torch.full_like(grad_x, 1e30)), grad_w, None


class GroupedMm58Experts(nn.Module):
    """gpt-oss's biased experts ([E, H, 2I] transposed, interleaved gate/up) as transformers 5.8.x's
    grouped_mm runs them: sentinel rows masked before the up projection and after the weighting,
    none between, so the down projection's input gradient at those rows is garbage and the
    per-row gathered ``gate_up_proj_bias`` sums it."""

    def __init__(self, experts: int = 4, hidden: int = 6, inter: int = 5) -> None:
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, hidden, 2 * inter) * 0.3)
        self.gate_up_proj_bias = nn.Parameter(torch.randn(experts, 2 * inter) * 0.3)
        self.down_proj = nn.Parameter(torch.randn(experts, inter, hidden) * 0.3)
        self.down_proj_bias = nn.Parameter(torch.randn(experts, hidden) * 0.3)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        k = top_k_index.shape[-1]
        ids, weights = top_k_index.reshape(-1), top_k_weights.reshape(-1)
        valid = ids < self.num_experts
        x = hidden_states.repeat_interleave(k, 0).masked_fill(~valid[:, None], 0.0)  # pre-mask
        ids = ids.clamp(max=self.num_experts - 1)
        gate_up = _KernelRows.apply(x, self.gate_up_proj[ids], valid) + self.gate_up_proj_bias[ids]
        gated = F.silu(gate_up[..., ::2]) * gate_up[..., 1::2]
        out = _KernelRows.apply(gated, self.down_proj[ids], valid) + self.down_proj_bias[ids]
        out = (out * weights[:, None]).masked_fill(~valid[:, None], 0.0)  # post-mask
        return out.view(-1, k, out.shape[-1]).sum(1)


def _routes(tokens: int = 12, experts: int = 4, k: int = 2):
    torch.manual_seed(1)
    hidden = torch.randn(tokens, 6)
    index = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k)
    return hidden, index, weights


def test_experts_on_a_release_that_mishandles_sentinels_run_this_ranks_routes_alone(fake_pg, monkeypatch):
    """5.8.x: gpt-oss's ``gate_up_proj_bias`` gradient was silently wrong at TP 2 (the sentinel
    routes' garbage input gradient summed into it). The style now never hands the experts a
    sentinel there: rank 0's gradients are exactly the unsharded experts' on rank 0's routes."""
    monkeypatch.setattr(moe_styles, "experts_take_sentinels", lambda: False)
    torch.manual_seed(0)
    whole = GroupedMm58Experts()
    sharded = GroupedMm58Experts()
    sharded.load_state_dict(whole.state_dict())
    ExpertsParallel(output_layouts=Partial())._apply(sharded, DeviceMesh("cpu", torch.arange(2)))
    hidden, index, weights = _routes()

    ours = index < 2  # rank 0 of 2 holds experts 0 and 1
    expected = whole(hidden, index, weights * ours)
    expected.square().sum().backward()
    got = sharded(hidden, index, weights)
    got.square().sum().backward()

    torch.testing.assert_close(got, expected)
    for name, param in sharded.named_parameters():
        torch.testing.assert_close(param.grad.to_local(), getattr(whole, name).grad[:2], msg=name)


def test_the_pinned_release_takes_sentinels():
    """5.24.0 on: the experts interface knows expert parallelism (the sentinel path, unchanged)."""
    import transformers

    assert transformers_compat.experts_take_sentinels() == ("_is_expert_parallel" in _moe_source()), (
        transformers.__version__
    )


def _moe_source() -> str:
    import inspect

    from transformers.integrations import moe

    return inspect.getsource(moe)


@pytest.mark.parametrize(
    "kinds", [["mamba", "attention", "mlp", "moe"], ["linear_attention", "full_attention", "mlp", "moe"]]
)
def test_layer_kinds_read_either_releases_spelling(kinds):
    class Config:
        layers_block_type = kinds

    assert transformers_compat.layer_kinds(Config()) == ["linear_attention", "full_attention", "mlp", "moe"]


def test_installed_layer_kinds_follow_the_config_class_default():
    class Legacy:  # 5.5.x-5.8.x NemotronHConfig: its default spells the older names
        def __init__(self):
            self.layers_block_type = ["mamba", "moe", "attention", "mlp"]

    class Newer:
        def __init__(self):
            self.layers_block_type = ["linear_attention", "moe", "full_attention", "mlp"]

    kinds = ["linear_attention", "full_attention", "mlp"]
    assert transformers_compat.installed_layer_kinds(Legacy, kinds) == ["mamba", "attention", "mlp"]
    assert transformers_compat.installed_layer_kinds(Newer, kinds) == kinds


@pytest.mark.parametrize(
    ("name", "legacy"),
    [
        ("nemotron_h", ["mamba", "moe", "attention", "mlp"]),
        ("zamba2", ["mamba", "hybrid", "mamba", "hybrid"]),
    ],
)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_hybrid_plans_are_the_same_under_the_older_layer_kind_names(name, legacy, sequence_parallel):
    """5.5.x and 5.8.x name NemotronH's and Zamba2's Mamba and attention layers ``mamba`` and
    ``attention``: their plans dropped those entries (NemotronH 92 % sharded, Zamba2 25.5 %)."""
    from plangen.plans.choice import choose_plan
    from tiny_configs import build_tiny

    model = build_tiny(name)
    newer = choose_plan(model, sequence_parallel).plan
    model.config.layers_block_type = legacy  # as the older release's config holds them
    older = choose_plan(model, sequence_parallel).plan
    assert older.entries == newer.entries and older.replicated == newer.replicated


def test_nemotron_h_checkpoints_mamba_blocks_under_the_older_name():
    from plangen.plans.hybrid import checkpoint_nemotron_h_block

    block = nn.Module()
    for kind, checkpointed in (
        ("mamba", True),
        ("linear_attention", True),
        ("attention", False),
        ("mlp", True),
        ("moe", False),
    ):
        block.block_type = kind
        assert checkpoint_nemotron_h_block(block) is checkpointed, kind


def test_a_failure_over_what_the_installed_transformers_lacks_is_a_skip_with_the_reason():
    """5.5.x/5.8.x lack model types the tests name (zaya, inkling_text, dots3_note, ...) and internals
    (transformers.distributed.parallel_utils): conftest reports those as skips, checked against the
    installed transformers, so a real failure over a class it has is never hidden."""
    from absent import absent_from_transformers

    assert "has no model no_such_model" in absent_from_transformers(
        ValueError("Unrecognized model identifier: no_such_model.")
    )
    assert absent_from_transformers(ValueError("Unrecognized model identifier: llama.")) is None  # it has llama
    missing = ModuleNotFoundError("No module named 'transformers.no_such'", name="transformers.no_such")
    try:
        raise RuntimeError("while building the case") from missing
    except RuntimeError as error:
        assert "has no module transformers.no_such" in absent_from_transformers(error)
    import transformers

    try:
        transformers.no_such_function  # noqa: B018
    except AttributeError as error:
        assert absent_from_transformers(error) is not None
    assert absent_from_transformers(AssertionError("unknown model spec 'llama'")) is None
    # 5.5.x's NemotronH validation: the kinds it allows, then the ones given; the reason names the rejected ones.
    rejected = ValueError(
        "The `layer_types` entries must be in ('full_attention', 'mamba', 'attention', 'moe') but got "
        "['mamba', 'moe', 'attention', 'mlp']"
    )
    try:
        raise RuntimeError("Class validation error for validator 'validate_layer_type'") from rejected
    except RuntimeError as error:
        assert absent_from_transformers(error).endswith(
            "has no layers of kind mlp (its config validation rejects them)"
        )
    allowed = ValueError("The `layer_types` entries must be in ('mamba', 'moe') but got ['mamba', 'moe']")
    assert absent_from_transformers(allowed) is None


def test_only_the_installed_nemotron_h_without_mlp_layers_skips_the_cases_that_have_them():
    """The tests' NemotronH configs and the generated files (5.24.0's default) have MLP layers;
    5.5.x's NemotronH has none: those cases are skipped there by that reason, the bare model type
    (the installed default) never is, and on a release with MLP layers nothing is skipped."""
    from conftest import nemotron_h_lacks_mlp_layers, stack_cannot_run

    import transformers

    reason = nemotron_h_lacks_mlp_layers()
    kinds = transformers_compat.installed_layer_kinds(transformers.NemotronHConfig, ["mlp", "full_attention"])
    try:
        transformers.NemotronHConfig(layers_block_type=kinds)
    except Exception:  # noqa: BLE001 - the strict dataclass's validation error
        builds = False
    else:
        builds = True
    assert (reason is None) == builds
    assert stack_cannot_run("nemotron_h") is None
    for case in ("dp2tp2/nemotron_h-1g", "generated/nemotron_h_sp_plan.py"):
        assert stack_cannot_run(case) == reason


class _ClampingExperts(nn.Module):
    """5.8.x's batched_mm in miniature: ``top_k_index.reshape(-1).clamp_(...)``, in place on the caller's."""

    has_gate, is_transposed = True, False

    def __init__(self) -> None:
        super().__init__()
        self.num_experts = 4
        self.gate_up_proj = nn.Parameter(torch.randn(4, 6, 6))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        ids = top_k_index.reshape(-1)
        ids.clamp_(0, self.num_experts - 1)
        k = top_k_index.shape[-1]
        picked = torch.bmm(self.gate_up_proj[ids], hidden_states.repeat_interleave(k, 0).unsqueeze(-1)).squeeze(-1)
        return (picked * top_k_weights.reshape(-1, 1)).view(-1, k, 6).sum(1)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(6, 4)
        self.experts = _ClampingExperts()

    def forward(self, x):
        weights, index = torch.topk(self.gate(x).softmax(-1), 2)  # topk's backward reads index
        return self.experts(x, index, weights)


def test_the_step_measurement_survives_batched_mm_clamping_the_routers_indices(monkeypatch):
    """5.8.x: synthesized MoE plans' cost measurement (batched_mm on CPU) failed its backward with an
    in-place modification error, unsharded too: the experts clamp the router's topk indices in place."""
    monkeypatch.setattr(transformers_compat, "batched_mm_clamps_index_in_place", lambda: True)
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(5, 6)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        block(x).sum().backward()
    transformers_compat.guard_routing_index(block)
    block(x).sum().backward()
    assert block.gate.weight.grad is not None


def test_mamba2_mixers_conv1d_states_this_ranks_channels(fake_pg):
    """NemotronH's mixer before 5.24 calls its ``conv1d`` (5.24 reads its weight): with the whole
    channel count left in ``groups`` the forward failed (PG215 on 5.8.x, "Given groups=160")."""
    from plangen.plans.choice import choose_plan
    from plangen.runtime.tensor_parallel import apply_tp
    from tiny_configs import build_tiny

    model = build_tiny("nemotron_h")
    apply_tp(model, DeviceMesh("cpu", torch.arange(2)), choose_plan(model, False).build_styles())
    mixers = [m for m in model.modules() if hasattr(m, "conv1d") and hasattr(m, "in_proj")]
    assert mixers
    for mixer in mixers:
        conv, local = mixer.conv1d, mixer.conv1d.weight.to_local().shape[0]
        assert conv.groups == conv.in_channels == conv.out_channels == local == mixer.conv_dim


def test_a_router_read_by_its_weight_has_its_input_counted_once(monkeypatch):
    """5.8's DeepSeek-V2 MoE block computes ``F.linear(x.float(), self.gate.weight.float())`` and
    never calls its router: the count-once goes on every F.linear on that weight (or a conversion of
    it) inside the block's forward, and on nothing else (the experts' own linears)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import plangen.styles.tp_sums as tp_sums
    from plangen.stack.transformers_compat import reads_child_weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.expert = nn.Linear(4, 3, bias=False), nn.Linear(4, 4)

        def forward(self, x):
            logits = F.linear(x.type(torch.float32), self.gate.weight.type(torch.float32))
            return self.expert(x) * logits.sum(-1, keepdim=True)

    class Calling(Block):
        def forward(self, x):
            return self.expert(x) * self.gate(x).sum(-1, keepdim=True)

    assert reads_child_weight(Block(), "gate") and not reads_child_weight(Calling(), "gate")
    counted = []
    monkeypatch.setattr(tp_sums, "grad_once", lambda t, mesh: counted.append(tuple(t.shape)) or t * 1)
    block = Block()
    tp_sums.count_once_where_weight_is_read(block, lambda: block.gate.weight, mesh=None)
    x = torch.randn(2, 4, requires_grad=True)
    block(x).sum().backward()
    assert counted == [(2, 4)]  # the router's input, once; not the expert's
    block(x)
    assert counted == [(2, 4), (2, 4)]  # the mode ended with the forward, and came back with the next
    torch.nn.functional.linear(x, block.gate.weight)
    assert len(counted) == 2  # outside the block's forward: nothing


class _TopK(nn.Module):
    """A router returning (logits, weights, index), as LongCat-Flash's does."""

    def __init__(self, hidden: int, experts: int, k: int) -> None:
        super().__init__()
        self.classifier, self.k = nn.Linear(hidden, experts, bias=False), k

    def forward(self, x):
        logits = self.classifier(x)
        weights, index = logits.softmax(-1).topk(self.k, dim=-1)
        return logits, weights, index


class IdentityRoutes525(nn.Module):
    """LongCat-Flash's MoE block as transformers 5.25.0 writes it, its identity part (the experts'
    share is ExpertsParallel's, tested apart): the router picks real and zero-compute experts, and the
    block computes the identity routes' output itself (5.24.0: its experts module does)."""

    def __init__(self, hidden: int = 6, routed: int = 4, zero: int = 2, k: int = 2) -> None:
        super().__init__()
        self.num_routed_experts, self.zero_expert_num = routed, zero
        self.router = _TopK(hidden, routed + zero, k)

    def forward(self, hidden_states):
        _, topk_weights, topk_indices = self.router(hidden_states)
        if self.zero_expert_num:
            identity_mask = topk_indices >= self.num_routed_experts
            identity_weights = topk_weights.masked_fill(~identity_mask, 0.0).sum(dim=-1, keepdim=True)
            identity_output = hidden_states * identity_weights
        return identity_output


def test_a_block_that_computes_its_identity_experts_gets_their_share_per_rank():
    """5.25.0's LongCat-Flash computes its zero-compute experts in the MoE block, beside its experts
    (5.24.0: inside them): the block's output is a partial sum over TP, so each rank hands on 1/tp of
    the identity routes' weights (the plan's logits were off by 1.3e-2 at TP 2 summing them TP times),
    their gradient whole (the replicated router's, exact with no collective)."""
    from plangen.styles.moe_blocks import _share_identity_routes

    torch.manual_seed(0)
    whole, shared = IdentityRoutes525(), IdentityRoutes525()
    shared.load_state_dict(whole.state_dict())
    assert transformers_compat.block_identity_experts(shared) == 2
    _share_identity_routes(shared, shared.router, 2)
    x = torch.randn(16, 6)
    expected = whole(x)
    assert expected.abs().sum() > 0  # some routes went to the identity experts
    got = shared(x)
    torch.testing.assert_close(got * 2, expected)  # rank 0's share; rank 1's is the same: their sum, the whole
    c = torch.randn_like(expected)
    (expected * c).sum().backward()
    (got * c).sum().backward()  # each rank's share takes the whole sum's output gradient
    torch.testing.assert_close(shared.router.classifier.weight.grad, whole.router.classifier.weight.grad)


def test_the_installed_longcat_block_says_where_it_computes_its_identity_experts():
    """Read from the installed model code: 5.25.0's block computes them (its experts hold the real
    ones only), 5.24.0's experts module does (an ``identity_expert`` child, ExpertsParallel's share)."""
    from tiny_configs import build_tiny

    block = build_tiny("longcat_flash").model.layers[0].mlp
    inside = isinstance(getattr(block.experts, "identity_expert", None), nn.Module)
    assert transformers_compat.block_identity_experts(block) == (0 if inside else 2)
    assert moe_styles.identity_expert_count(block.experts) == (2 if inside else 0)


@pytest.mark.window  # compiling costs ~15 CPU-s: the compatibility run's, where the releases differ
def test_moe_layers_compile_on_the_installed_release(monkeypatch):
    """A Qwen3-MoE compiled by apply_compile, against eager: logits and every gradient. Where the installed
    transformers traces its grouped_mm fallback's Python backward (5.5.x, 5.8.x: GuardOnDataDependentSymNode,
    docs/compile.md), the experts stay eager and the rest of each layer compiles around them; on the pinned
    release the layers compile whole. The other release's case is reproduced here by saying its backward
    is not opaque: the units then leave the experts out, and the compiled model still matches."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    from plangen.runtime.compile import apply_compile, compile_units
    from tiny_configs import TINY

    kwargs = dict(TINY["qwen3_moe"], output_router_logits=False)  # a dense layer and a MoE layer
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))
    layers = list(model.model.layers)
    experts = [m for m in model.modules() if transformers_compat.uses_experts_interface(m)]
    assert experts and all(m.config._experts_implementation == "grouped_mm" for m in experts)
    opaque = transformers_compat.grouped_mm_backward_is_opaque()
    assert (
        compile_units(layers) == layers
        if opaque
        else all(e not in list(u.modules()) for u in compile_units(layers) for e in experts)
    )
    monkeypatch.setattr(transformers_compat, "grouped_mm_backward_is_opaque", lambda: False)
    units = compile_units(layers)
    moe = next(layer for layer in layers if any(e in list(layer.modules()) for e in experts))
    assert moe not in units and moe.self_attn in units and moe.mlp.gate in units
    assert not any(e in list(u.modules()) for u in units for e in experts)
    eager = copy.deepcopy(model)
    assert apply_compile(model, layers) == units
    assert all(e._compiled_call_impl is None for e in experts)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    outputs = [m(input_ids=ids).logits for m in (model, eager)]
    for out in outputs:
        out.float().pow(2).mean().backward()
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-5)
    grads = dict(eager.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=0, atol=1e-5, msg=name)

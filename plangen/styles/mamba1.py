"""Mamba (v1) mixers over TP: the intermediate channels split across ranks, Megatron-style.

transformers' Mamba1 mixer (``MambaMixer``, ``FalconMambaMixer``, ``JambaMambaMixer``) computes::

    x, gate = in_proj(h).chunk(2)               # [2 x intermediate]: x then the gate
    x       = silu(depthwise conv1d(x))         # per channel
    dt, B, C = split(x_proj(x), [dt_rank, state, state])   # reads every channel
    (dt, B, C = norms of each, Jamba, FalconMamba)
    dt      = dt_proj.weight @ dt (+ dt_proj.bias in the scan)  # back to every channel
    y       = scan(x, dt, A = -exp(A_log), B, C, D, gate)       # per channel
    out     = out_proj(y)

Everything but ``x_proj`` and the small ``dt``/``B``/``C`` path is independent per channel, so each
rank holds ``intermediate / tp`` channels: its slice of ``in_proj``'s x and of its gate (the packed
weight re-laid out and shown in Hugging Face's layout by :class:`~plangen.styles.fused.FusedColwiseParallel`'s
hooks, so FSDP2 and full state dicts see Hugging Face's tensor), of ``conv1d``, ``dt_proj``,
``A_log`` and ``D``; ``x_proj`` is row-parallel (its partial ``[dt_rank + 2 state]`` output summed
over TP: one small all-reduce of B·S·(dt_rank + 2·state)); ``out_proj`` is row-parallel in a plan
entry of its own (``RowwiseParallel``: one all-reduce, or a reduce-scatter under SP).

Why one style on the mixer and local tensors inside: the forward reads ``conv1d.weight``,
``dt_proj.weight``/``bias``, ``A_log`` and ``D`` directly (not through their modules), and applies
the attention mask to the block input before ``in_proj``, so no module style of torch's can put
DTensors there. During the mixer's forward those parameters (and ``in_proj``'s, ``x_proj``'s) are
swapped for their local shards and put back after; ``to_local``'s backward hands each gradient to
the sharded DTensor, which FSDP2 then reduces over DP like any TP shard.

The gradients, exactly: the block input enters whole (an all-gather of the sequence under SP) as a
local tensor whose gradient, a partial sum over the ranks' channels, is summed once (all-reduce, or
reduce-scatter under SP). ``dt``, ``B`` and ``C`` are whole on every rank after the all-reduce, but
each rank uses them for its own channels only, so their gradient is partial too and is summed over
TP where they enter the per-channel part: at ``x_proj``'s output, or, where norms with weights sit
in between (Jamba's ``dt_layernorm``, ``b_layernorm``, ``c_layernorm``), at those norms' outputs so
that their weights' gradients are whole on every rank (``grad_reduced``).

transformers' fused kernel (``mamba_inner_fn``, from ``mamba_ssm`` or the hub, which Mamba and
FalconMamba call in training without a cache) computes ``x_proj`` and ``out_proj`` inside one
kernel, past both sums: during the mixer's forward its own ``training`` flag reads False (its
forward reads it for that choice only; the mixer has no dropout), so it takes the unfused path,
whose kernels (``causal_conv1d_fn``, ``selective_scan_fn``) are per channel and take the local
shards as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from plangen.styles.fused import FusedColwiseParallel
from plangen.styles.tp_sums import SumOverMesh, all_reduce_grad
from plangen.plan.style_facts import MIXER, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

# transformers' names of a Mamba1 mixer's parts (every Mamba1 mixer in transformers 5.x).
IN_PROJ, CONV, X_PROJ, DT_PROJ, OUT_PROJ = "in_proj", "conv1d", "x_proj", "dt_proj", "out_proj"
CHANNEL_PARAMETERS = ("A_log", "D")  # the mixer's own, one row per intermediate channel
# The mixer's integer attributes that count every channel (cache and scan shapes read them).
CHANNEL_ATTRIBUTES = ("intermediate_size",)


def mamba1_parts_problem(mixer: nn.Module) -> str | None:
    """Why ``mixer`` is not a Mamba1 mixer this style can split by channels (None: it is)."""
    parts = {n: getattr(mixer, n, None) for n in (IN_PROJ, CONV, X_PROJ, DT_PROJ, OUT_PROJ)}
    missing = [n for n, m in parts.items() if not isinstance(m, nn.Conv1d if n == CONV else nn.Linear)]
    if missing:
        return (
            f"no nn.Linear/nn.Conv1d {', '.join(missing)} (a Mamba1 mixer's in_proj, conv1d, x_proj, dt_proj, out_proj)"
        )
    own = dict(mixer.named_parameters(recurse=False))
    if set(own) != set(CHANNEL_PARAMETERS):
        return f"own parameters {sorted(own)}, not a Mamba1 mixer's A_log and D"
    conv, x_proj, dt_proj = parts[CONV], parts[X_PROJ], parts[DT_PROJ]
    width = conv.in_channels
    shapes_ok = (
        conv.out_channels == width
        and conv.groups == width
        and parts[IN_PROJ].out_features == 2 * width
        and x_proj.in_features == width
        and dt_proj.out_features == width
        and parts[OUT_PROJ].in_features == width
        and own["A_log"].dim() == 2
        and own["A_log"].shape[0] == width
        and tuple(own["D"].shape) == (width,)
    )
    if not shapes_ok:
        return f"its parts are not all {width} channels wide (a depthwise conv1d, in_proj 2x, x_proj in, dt_proj out, A_log, D)"
    if x_proj.bias is not None:
        return "x_proj has a bias, which a row-parallel x_proj inside the mixer would add once per rank"
    return None


class Mamba1MixerParallel(PlangenStyle):
    """A Mamba1 mixer's channels split over TP (see the module docstring); ``out_proj`` is left to
    its own ``RowwiseParallel`` entry.

    ``input_layouts``: the block input's layout as the layer hands it (``Replicate()``, or
    ``Shard(1)`` under sequence parallel: gathered here, its gradient reduce-scattered).
    ``grad_reduced``: the children whose outputs enter the per-channel computation and whose
    gradient is summed over TP there (``("x_proj",)``; the norms after it where they have weights).
    The mixer takes its hidden state as ``hidden_states=`` or as its first positional argument.
    """

    # A Mamba1 mixer split by channels: its own A_log/D, in_proj, conv1d, x_proj (row), dt_proj.
    facts = StyleFacts(
        "other",
        shard_dim={MIXER: 0},
        lays_out_children={"in_proj": "colwise", "conv1d": "colwise", "dt_proj": "colwise", "x_proj": "rowwise"},
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        problem = mamba1_parts_problem(module)
        if problem is None:
            return None
        return (
            f"`{type(self).__name__}` splits a Mamba1 mixer by its channels, but {type(module).__name__} has {problem}"
        )

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        if not isinstance(getattr(module, "conv1d", None), nn.Conv1d):
            return super().required_dims(module, tp)
        return [("intermediate channels", module.conv1d.in_channels, 1)]  # local channels, plain tensors

    def __init__(self, *, input_layouts: Placement | None = None, grad_reduced: tuple[str, ...] = (X_PROJ,)) -> None:
        super().__init__()
        self.input_layouts = input_layouts if input_layouts is not None else Replicate()
        self.grad_reduced = tuple(grad_reduced)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        problem = mamba1_parts_problem(module)
        if problem is not None:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__}: {problem}")
        unknown = [n for n in self.grad_reduced if not isinstance(getattr(module, n, None), nn.Module)]
        if unknown:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__} has no child {unknown[0]} (grad_reduced)")
        tp = device_mesh.size()
        width = getattr(module, CONV).in_channels
        if width % tp:
            raise ValueError(
                f"{type(self).__name__}: {type(module).__name__} has {width} channels, which TP size {tp} does not divide"
            )
        _shard_parameters(module, device_mesh)
        _localise_attributes(module, width, tp)
        _install_local_forward(module, device_mesh, self.input_layouts)
        # The forward all-reduce of x_proj's partial output first, then the gradient sums.
        getattr(module, X_PROJ).register_forward_hook(
            lambda mod, args, out: SumOverMesh.apply(out, device_mesh.get_group())
        )
        for name in self.grad_reduced:
            getattr(module, name).register_forward_hook(lambda mod, args, out: all_reduce_grad(out, device_mesh))
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(input_layouts={self.input_layouts}, grad_reduced={self.grad_reduced})"


def _distribute(module: nn.Module, name: str, device_mesh: DeviceMesh, placement: Placement) -> None:
    param = module._parameters[name]
    if param is None:
        return
    sharded = distribute_tensor(param.data, device_mesh, [placement], src_data_rank=None)
    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


def _shard_parameters(module: nn.Module, device_mesh: DeviceMesh) -> None:
    # in_proj packs [x; gate]: each rank's rows are its slice of both, in Hugging Face's layout outside.
    FusedColwiseParallel(part_sizes=(1, 1))._partition_linear_fn(IN_PROJ, getattr(module, IN_PROJ), device_mesh)
    conv = getattr(module, CONV)
    for name in ("weight", "bias"):
        _distribute(conv, name, device_mesh, Shard(0))
    _distribute(getattr(module, X_PROJ), "weight", device_mesh, Shard(1))
    for name in ("weight", "bias"):
        _distribute(getattr(module, DT_PROJ), name, device_mesh, Shard(0))
    for name in CHANNEL_PARAMETERS:
        _distribute(module, name, device_mesh, Shard(0))


def _localise_attributes(module: nn.Module, width: int, tp: int) -> None:
    """The channel counts the forward, its cache and conv1d's own forward read: this rank's."""
    local = width // tp
    conv = getattr(module, CONV)
    conv.in_channels = conv.out_channels = conv.groups = local
    getattr(module, DT_PROJ).out_features = local
    getattr(module, X_PROJ).in_features = local
    getattr(module, IN_PROJ).out_features = 2 * local
    for name in CHANNEL_ATTRIBUTES:
        if getattr(module, name, None) == width:
            setattr(module, name, local)


def _local_owners(module: nn.Module) -> list[nn.Module]:
    return [module, *(getattr(module, n) for n in (IN_PROJ, CONV, X_PROJ, DT_PROJ))]


def _install_local_forward(module: nn.Module, device_mesh: DeviceMesh, input_layout: Placement) -> None:
    training: list[bool] = []

    def whole_input(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, (input_layout,), run_check=False)
        if any(not p.is_replicate() for p in x.placements):
            x = x.redistribute(device_mesh, (Replicate(),))
        # Each rank's gradient covers its channels: summed once (all-reduce, or reduce-scatter under SP).
        return x.to_local(grad_placements=(Partial(),))

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "hidden_states" in kwargs:
            kwargs = {**kwargs, "hidden_states": whole_input(kwargs["hidden_states"])}
        elif args:
            args = (whole_input(args[0]), *args[1:])
        else:
            raise ValueError(f"Mamba1MixerParallel: {type(mod).__name__} was called without its hidden state")
        training.append(mod.training)
        mod.training = False  # the unfused path: mamba_inner_fn would run x_proj and out_proj unsummed
        for owner in _local_owners(mod):
            params.local_views(owner)
        return args, kwargs

    def put_back(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if training:
            mod.training = training.pop()

    run_on_local_tensors(module, swap_in, put_back)

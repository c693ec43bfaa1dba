"""RWKV-4's mixers (transformers' ``RwkvSelfAttention``, ``RwkvFeedForward``) split over TP by channels.

Time mixing computes, per layer::

    k, v, r = key(mix_k(h)), value(mix_v(h)), sigmoid(receptance(mix_r(h)))   # hidden -> attention_hidden
    wkv     = WKV(time_decay, time_first, k, v)                                # per channel, over time
    out     = output(r * wkv)                                                  # attention_hidden -> hidden

where ``mix_x(h) = h * time_mix_x + shift(h) * (1 - time_mix_x)`` acts on the whole input (``shift``:
the previous token). The WKV recurrence (``rwkv_linear_attention_cpu``, or the CUDA kernel, which
takes any channel count) never mixes channels, so each rank holds ``attention_hidden / tp`` of them:
its rows of ``key``, ``value``, ``receptance``, its slice of ``time_decay`` and ``time_first``;
``output`` is row-parallel in a plan entry of its own (one all-reduce). Channel mixing::

    out = sigmoid(receptance(mix_r(h))) * value(relu(key(mix_k(h))) ** 2)

``key`` column-parallel, ``value`` row-parallel: its partial sum is reduce-scattered onto the hidden
channels ``receptance`` (hidden -> hidden, split by its rows) computes on this rank; their product
is all-gathered. The receptance is an ninth of the layer's parameters: kept whole, a plan shards
92.7 % of RWKV-4's default size; split, 99.9 %.

Why one style per mixer (``RwkvTimeMixParallel``, ``RwkvChannelMixParallel``) and local tensors inside: the forward reads ``time_decay``, ``time_first``
and the ``time_mix_*`` itself, where no module style of torch's can put DTensors. During the
mixer's forward its sharded parameters (and its linears') are swapped for their local shards and
put back after, as :mod:`plangen.styles.mamba1` does.

The gradients, exactly: the mixer's input enters whole as a plain tensor whose gradient, a partial
sum over the ranks' channels along every path (each mix feeds only this rank's rows), is summed
once (all-reduce of B·S·H). The ``time_mix_*`` gradients are partial for the same reason: they are
stacked and summed by one small all-reduce (3·H or 2·H values) per mixer.

The recurrent state (``use_cache``, in eval): transformers allocates it ``[B, hidden, layers]``
for every rank; the time mixing's WKV parts (``state[2:]``) are handed to the mixer as this rank's
channel slice (views: its in-place writes land in the full tensor), the token-shift parts
(``state[:2]``) whole. Each rank's copy of the WKV state is right on its own channels only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Shard, distribute_tensor

from plangen.stack import torch_compat as compat
from plangen.styles.tp_sums import all_reduce_grad
from plangen.plan.style_facts import StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

TIME_MIX_LINEARS = ("key", "value", "receptance")  # hidden -> attention_hidden, split by rows
CHANNEL_PARAMETERS = ("time_decay", "time_first")  # one value per attention channel
TIME_MIXES = ("time_mix_key", "time_mix_value", "time_mix_receptance")
CHANNEL_MIXES = ("time_mix_key", "time_mix_receptance")


def rwkv_mixer_kind(module: nn.Module) -> str | None:
    """``"time"`` (RwkvSelfAttention's layout), ``"channel"`` (RwkvFeedForward's), else None."""
    linears = {n: c for n, c in module.named_children() if isinstance(c, nn.Linear)}
    own = set(dict(module.named_parameters(recurse=False)))
    if set(linears) == {*TIME_MIX_LINEARS, "output"} and own == {*CHANNEL_PARAMETERS, *TIME_MIXES}:
        return "time"
    if set(linears) == {"key", "value", "receptance"} and own == set(CHANNEL_MIXES):
        return "channel"
    return None


def rwkv_mixer_problem(module: nn.Module, tp: int) -> str | None:
    """Why ``module`` is not an RWKV-4 mixer these styles split over ``tp`` ranks (None: it is)."""
    kind = rwkv_mixer_kind(module)
    if kind is None:
        return "not an RWKV-4 time mixing (key, value, receptance, output, time_decay, time_first, time_mix_*) or channel mixing"
    if any(getattr(module, n).bias is not None for n in ("key", "value", "receptance")):
        return "a projection has a bias"
    width = module.key.out_features if kind == "time" else module.receptance.out_features
    if width % tp:
        return f"{width} channels, which TP size {tp} does not divide"
    return None


class _ReduceScatterLast(torch.autograd.Function):
    """Forward: partial sums reduce-scattered over the last dim (this rank's chunk); backward: all-gather."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group, size = group, dist.get_world_size(group)
        front = tensor.movedim(-1, 0).contiguous()
        out = front.new_empty((front.shape[0] // size, *front.shape[1:]))
        compat.reduce_scatter(out, front, group=group)
        return out.movedim(0, -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _gather_last(grad, ctx.group), None


class _GatherLast(torch.autograd.Function):
    """Forward: each rank's chunk of the last dim all-gathered; backward: this rank's chunk of the
    gradient, which is whole and the same on every rank (the residual stream's)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.rank, ctx.width = dist.get_rank(group), tensor.shape[-1]
        return _gather_last(tensor, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous(), None


def _gather_last(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    front = tensor.movedim(-1, 0).contiguous()
    out = front.new_empty((front.shape[0] * dist.get_world_size(group), *front.shape[1:]))
    compat.all_gather_into(out, front, group=group)
    return out.movedim(0, -1)


def _distribute(module: nn.Module, name: str, mesh: DeviceMesh, placement: Placement) -> None:
    param = module._parameters[name]
    sharded = distribute_tensor(param.data, mesh, [placement], src_data_rank=None)
    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


class _RwkvMixerParallel(PlangenStyle):
    """An RWKV-4 mixer split over TP by channels (see the module docstring). The mixer takes its
    hidden state as its first positional argument, as ``RwkvBlock`` passes it (no SP)."""

    kind = ""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        problem = rwkv_mixer_problem(module, device_mesh.size())
        kind = rwkv_mixer_kind(module)
        if problem is None and kind != self.kind:
            problem = f"an RWKV {kind} mixing module, not the {self.kind} mixing this style splits"
        if problem is not None:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__}: {problem}")
        group = device_mesh.get_group()
        if kind == "time":
            for name in TIME_MIX_LINEARS:
                _distribute(getattr(module, name), "weight", device_mesh, Shard(0))
            for name in CHANNEL_PARAMETERS:
                _distribute(module, name, device_mesh, Shard(0))
            owners, mixes = [module, *(getattr(module, n) for n in TIME_MIX_LINEARS)], TIME_MIXES
        else:
            for name, dim in (("key", 0), ("receptance", 0), ("value", 1)):
                _distribute(getattr(module, name), "weight", device_mesh, Shard(dim))
            owners, mixes = [getattr(module, n) for n in ("key", "receptance", "value")], CHANNEL_MIXES
            module.value.register_forward_hook(lambda mod, args, out: _ReduceScatterLast.apply(out, group))
        _install_local_forward(module, device_mesh, owners, mixes, kind)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RwkvTimeMixParallel(_RwkvMixerParallel):
    """RWKV-4's time mixing (``RwkvSelfAttention``) by channels; ``output`` is left to its own
    ``RowwiseParallel`` entry."""

    # An RWKV-4 mixer split by channels (plangen.styles.rwkv): time mixing's key/value/receptance
    # and time_decay/time_first, or channel mixing's key/receptance by rows and value by columns.
    facts = StyleFacts("other", lays_out_children={"key": "colwise", "value": "colwise", "receptance": "colwise"})

    kind = "time"


class RwkvChannelMixParallel(_RwkvMixerParallel):
    """RWKV-4's channel mixing (``RwkvFeedForward``) by channels, whole here: ``value``'s
    reduce-scatter onto the receptance's channels and the gated product's all-gather are the style's."""

    facts = StyleFacts("other", lays_out_children={"key": "colwise", "receptance": "colwise", "value": "rowwise"})

    kind = "channel"


def _install_local_forward(
    module: nn.Module, mesh: DeviceMesh, owners: list[nn.Module], mixes: tuple[str, ...], kind: str
) -> None:
    states: list[Any] = []
    group = mesh.get_group()
    rank = mesh.get_local_rank()

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not args or isinstance(args[0], DTensor):
            raise ValueError(f"{type(mod).__name__} takes its hidden state as a plain first argument")
        # Every path from the input runs through this rank's channels only: its gradient is summed once.
        args = (all_reduce_grad(args[0], mesh), *args[1:])
        for owner in owners:
            params.local_views(owner)
        # The mixes' gradients are partial sums too: stacked, one small all-reduce for all of them.
        summed = all_reduce_grad(torch.stack([mod._parameters[n] for n in mixes]), mesh)
        for index, name in enumerate(mixes):
            params.replace(mod, name, summed[index])
        state = kwargs.get("state")
        states.append(state)
        if kind == "time" and state is not None:
            width = mod.key.weight.shape[0]  # the local shard's rows: this rank's channels of the WKV state
            kwargs = {**kwargs, "state": [*state[:2], *(s.narrow(1, rank * width, width) for s in state[2:])]}
        return args, kwargs

    def put_back(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        state = states.pop() if states else None
        if not isinstance(output, tuple):
            return output
        out = _GatherLast.apply(output[0], group) if kind == "channel" else output[0]
        # The caller's state list (not the sliced views) goes on to the next mixer and layer.
        return (out, state if state is not None else output[1], *output[2:])

    run_on_local_tensors(module, swap_in, put_back)

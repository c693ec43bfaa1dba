"""Norms over a whole projection, sharded with its heads: their statistics reduced over TP.

OLMo-2/3, OLMoE, FlexOLMo and MiniMax-M2 normalise q and k over the whole projection, before the
heads are split (``q_norm = RMSNorm(num_heads * head_dim)`` applied to ``q_proj``'s output). Under
a column-parallel ``q_proj`` each TP rank holds only its heads' features, so the norm's own forward
would normalise over a slice, and a replicated norm would need the whole projection gathered.
:class:`ShardedNormParallel` instead shards the norm's weight (and bias) with the heads
(``Shard(0)``: the same contiguous split as the projection's output features) and runs the same
norm with its per-token statistics summed over TP:

* RMSNorm: the sum of squares, one all-reduce of B·S values in forward; in backward the gradient
  of that sum (each rank's outputs depend on every rank's features through it), one more;
* LayerNorm: the sum and the sum of squares together, one all-reduce of 2·B·S values each way.

BitNet's norms sit at the other end of a block, over the whole input of its row-parallel projection
(``o_proj(attn_sub_norm(attn_output))`` over all heads, ``down_proj(ffn_sub_norm(act(gate) * up))``
over the intermediate): each rank again holds a contiguous slice (its heads, or its part of
the intermediate), and the same style applies.

Every other gradient is local: the weight's (each rank owns its slice of it) and the input's
through the reduced statistics, so nothing else is reduced. The module's own forward is the spec:
:func:`resolve_norm_math` runs it once on random values and picks the formula it computes (RMS,
RMS with a ``1 + weight`` scale, LayerNorm), so a norm that computes anything else is refused
rather than silently changed. The parameters are plain ``Shard(0)`` DTensors, so FSDP2 shards them
further on dim 0 like any column-parallel weight, and full state dicts gather back Hugging Face's
layout. Arithmetic is in float32 whatever the input dtype (as OLMo-2's norm does), cast back after
the weight is applied.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from plangen.stack import torch_compat as compat
from plangen.styles.replicated import AllReduceParamGrads
from plangen.plan.style_facts import NORM, StyleFacts
from plangen.styles.base import PlangenStyle
from plangen.styles.tp_sums import SumOverTP

_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")


@dataclass(frozen=True)
class NormMath:
    """What a norm computes over its last dim: ``kind`` ``rms`` or ``layer``; ``offset``: the scale
    is ``1 + weight`` (Gemma's RMSNorm); ``eps`` added to the variance."""

    kind: str
    offset: bool
    eps: float


def normalize(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    math: NormMath,
    width: int,
    mesh: DeviceMesh | None,
) -> torch.Tensor:
    """The norm of ``x``'s last dim, a slice of ``width`` features; statistics summed over ``mesh``
    (None: ``x`` holds them all)."""
    x32 = x.float()
    sums = [x32.pow(2).sum(-1, keepdim=True)]
    if math.kind == "layer":
        sums.insert(0, x32.sum(-1, keepdim=True))
    stats = torch.cat(sums, dim=-1) if len(sums) > 1 else sums[0]
    if mesh is not None:
        stats = SumOverTP.apply(stats, mesh)
    if math.kind == "layer":
        mean = stats[..., :1] / width
        var = (stats[..., 1:] / width - mean.pow(2)).clamp_min(0)
        y = (x32 - mean) * torch.rsqrt(var + math.eps)
    else:
        y = x32 * torch.rsqrt(stats / width + math.eps)
    scale = weight.float() + 1 if math.offset else weight.float()
    y = y * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _norm_parameters(module: nn.Module) -> tuple[nn.Parameter, nn.Parameter | None]:
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if weight is None or weight.dim() != 1 or set(params) - {"weight", "bias"}:
        raise ValueError(
            f"{type(module).__name__} has no 1-D weight of its own (parameters: {', '.join(params) or 'none'})"
        )
    if any(True for child in module.children() for _ in child.parameters()):
        raise ValueError(f"{type(module).__name__} has submodules with parameters")
    bias = params.get("bias")
    if bias is not None and tuple(bias.shape) != tuple(weight.shape):
        raise ValueError(f"{type(module).__name__}'s bias {tuple(bias.shape)} is not one value per feature")
    return weight, bias


def resolve_norm_math(module: nn.Module) -> NormMath:
    """Which norm ``module`` computes over its last dim, found by running it once on random values.

    Raises ``ValueError`` naming why when it is none of RMSNorm, RMSNorm with ``1 + weight``, or
    LayerNorm with its own eps (a module on the meta device is probed on a CPU copy).
    """
    name = type(module).__name__
    weight, bias = _norm_parameters(module)
    eps = next((float(v) for a in _EPS_NAMES if isinstance(v := getattr(module, a, None), (float, int))), None)
    if eps is None:
        raise ValueError(f"{name} states no epsilon ({', '.join(_EPS_NAMES)})")
    width = weight.shape[0]
    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in probe.parameters(recurse=False):
            param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
        # Small values with an offset: eps and a subtracted mean both change the result.
        x = torch.randn(2, 3, width, generator=generator) * 1e-3 + 2e-3
        got = probe(x)
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            raise ValueError(f"{name} does not return a tensor of its input's shape")
        b = probe.bias if bias is not None else None
        # A bias is a LayerNorm's; without one, any of the three.
        candidates = [NormMath("layer", False, eps)]
        if b is None:
            candidates = [NormMath("rms", False, eps), NormMath("rms", True, eps), *candidates]
        for math in candidates:
            expected = normalize(x, probe.weight, b, math, width, None)
            if torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
                return math
    raise ValueError(
        f"{name} computes neither an RMSNorm nor a LayerNorm over its last dim with eps={eps}, so its"
        " statistics cannot be summed over TP"
    )


class ShardedNormParallel(PlangenStyle):
    """A norm over a whole column-parallel projection: weight ``Shard(0)``, statistics summed over TP.

    Takes this rank's slice of the projection's output (a local tensor, or a DTensor sharded on the
    last dim, returned the same way) and returns its slice of the normalised output. See the module
    docstring for the collectives and gradients.
    """

    # A norm over a whole column-parallel projection: sharded with the heads, statistics summed over TP.
    facts = StyleFacts("sharded_norm", shard_dim={NORM: 0})

    def fit_problem(self, module: nn.Module) -> str | None:
        try:
            resolve_norm_math(module)
        except ValueError as err:
            return f"`{type(self).__name__}` shards a norm over its last dim and sums its statistics over TP: {err}"
        return None

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        if not isinstance(getattr(module, "weight", None), nn.Parameter):
            return super().required_dims(module, tp)
        return [("normalized width", module.weight.shape[0], 1)]  # local slices of the projection's output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        math = resolve_norm_math(module)
        weight, _ = _norm_parameters(module)
        width, tp = weight.shape[0], device_mesh.size()
        if width % tp:
            raise ValueError(
                f"ShardedNormParallel: {type(module).__name__} of width {width} cannot be split evenly over TP size {tp}"
            )
        for name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(
                name,
                nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)]), requires_grad=param.requires_grad),
            )
        # An instance attribute: nn.Module.__call__ (and FSDP2's hooks around it) runs it as the forward.
        module.forward = partial(_sharded_forward, module, math, width, device_mesh)  # type: ignore[method-assign]
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _sharded_forward(module: nn.Module, math: NormMath, width: int, mesh: DeviceMesh, x: torch.Tensor) -> torch.Tensor:
    placements = None
    if isinstance(x, DTensor):
        placements = x.placements
        if not (len(placements) == 1 and placements[0].is_shard() and placements[0].dim in (-1, x.ndim - 1)):
            raise ValueError(f"ShardedNormParallel takes its input sharded on the last dim, not {placements}")
        x = x.to_local()
    weight = module.weight.to_local()
    bias = module.bias.to_local() if getattr(module, "bias", None) is not None else None
    if x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"ShardedNormParallel: the input's last dim is {x.shape[-1]}, this rank's slice of the norm is"
            f" {weight.shape[0]} wide: the projection before it must be column-parallel with a local output"
        )
    out = normalize(x, weight, bias, math, width, mesh)
    return out if placements is None else DTensor.from_local(out, mesh, placements, run_check=False)


class GatheredNormParallel(ShardedNormParallel):
    """The same contract as :class:`ShardedNormParallel` (this rank's slice of a column-parallel
    projection in, its slice of the normalised output out), computed without a cross-rank sum: the
    stable plan variant's (:mod:`plangen.plans.variants`).

    The slices are all-gathered (one all-gather of the projection's whole output), the module's own
    forward normalises the whole of it on every rank as one device does, and each rank keeps its
    slice. The weight stays whole on every TP rank (FSDP2 still shards it over DP, and the state dict
    is Hugging Face's); each rank's output covers its slice of it only, so its gradient is summed over
    TP, and the input gradient comes back reduce-scattered (the all-gather's backward).
    """

    # Its stable-variant twin: the same slices in and out, the whole norm computed on gathered input.
    facts = StyleFacts("sharded_norm", replicates=True)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        resolve_norm_math(module)  # the same norms as ShardedNormParallel, refused the same way
        weight, _ = _norm_parameters(module)
        tp = device_mesh.size()
        if weight.shape[0] % tp:
            raise ValueError(
                f"GatheredNormParallel: {type(module).__name__} of width {weight.shape[0]} cannot be split evenly over TP size {tp}"
            )
        AllReduceParamGrads()._apply(module, device_mesh)
        layout: dict[str, Any] = {}  # the input's placements, returned the same way

        def gather(mod: nn.Module, args: tuple) -> tuple:
            x, *rest = args
            if isinstance(x, DTensor):
                if not (
                    len(x.placements) == 1 and x.placements[0].is_shard() and x.placements[0].dim in (-1, x.ndim - 1)
                ):
                    raise ValueError(
                        f"GatheredNormParallel takes its input sharded on the last dim, not {x.placements}"
                    )
                layout["placements"] = x.placements
                x = x.to_local()
            else:
                layout["placements"] = None
            whole = compat.all_gather(x, x.ndim - 1, device_mesh)
            if whole.shape[-1] != weight.shape[0]:
                raise ValueError(
                    f"GatheredNormParallel: the gathered input is {whole.shape[-1]} wide, the norm {weight.shape[0]}:"
                    " the projection before it must be column-parallel with a local output"
                )
            return (whole, *rest)

        def take_slice(mod: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            width = output.shape[-1] // tp
            local = output.narrow(-1, device_mesh.get_local_rank() * width, width)
            placements = layout["placements"]
            return local if placements is None else DTensor.from_local(local, device_mesh, placements, run_check=False)

        module.register_forward_pre_hook(gather)
        module.register_forward_hook(take_slice)
        return module

"""Shared experts packed as 3-D weights and applied to every token by ``bmm`` (Inkling's
``InklingSharedExperts``), split over TP on each expert's intermediate dimension.

Inkling keeps its ``S`` shared experts as ``gate_proj`` / ``up_proj`` ``[S, I, H]`` and
``down_proj`` ``[S, H, I]`` in one module (no ``num_experts``, no routing: every token goes through
every shared expert), and scales each expert's activation per token by a weight the router computes
(``act(x·gateᵀ) * (x·upᵀ) * gamma``), then sums the ``S`` outputs. :class:`SharedExpertsParallel`
gives each rank a slice of every shared expert's intermediate (``Shard(1)`` of gate and up,
``Shard(2)`` of down): every step between the projections is per intermediate channel (the
activation, the product, the per-token scale), so each rank's output is a partial sum over ranks,
reduced with the routed experts' partial output by the MoE block's one all-reduce (or reduce-scatter).

Why the intermediate and not whole shared experts per rank (``Shard(0)``, as the routed experts):
the same bytes move either way (the partial output in the block's reduction, the input's and the
scales' gradients in backward), and the flops per rank are the same; but the expert split needs the
TP size to divide ``S`` (Inkling has 2, so TP 4 could not; the tiny checks' models have 1) and
would slice the per-token scales, while the intermediate (3072 at full size) divides by every TP
size up to 1024. Plain shards: FSDP2 composes with them and a full state dict is Hugging Face's.

In backward the gradients of every floating input (the hidden states and the per-token scales)
are partial for the same reason and are summed over TP (one all-reduce each), so the router that
computed the scales gets its exact gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Placement, Replicate, Shard, distribute_tensor

from plangen.styles.tp_sums import SumOverMesh, all_reduce_grad, replicated_local
from plangen.plan.style_facts import PARTIAL_SUM, REPLICATE, SHARED_EXPERTS, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

# The projections' names and the dim of each that the intermediate width lies on ([S, out, in]).
SHARED_PROJECTIONS = {"gate_proj": 1, "up_proj": 1, "down_proj": 2}


def packed_shared_shape(module: nn.Module) -> tuple[int, int, int] | None:
    """(shared experts, intermediate, hidden) of a packed shared-experts module: own parameters exactly
    ``gate_proj``, ``up_proj`` ``[S, I, H]`` and ``down_proj`` ``[S, H, I]``, nothing with parameters
    below it; else None."""
    params = dict(module.named_parameters(recurse=False))
    if set(params) != set(SHARED_PROJECTIONS) or any(p.dim() != 3 for p in params.values()):
        return None
    if any(True for c in module.children() for _ in c.parameters()):
        return None
    count, width, hidden = params["gate_proj"].shape
    if tuple(params["up_proj"].shape) != (count, width, hidden) or tuple(params["down_proj"].shape) != (
        count,
        hidden,
        width,
    ):
        return None
    return count, width, hidden


class SharedExpertsParallel(PlangenStyle):
    """Shard a packed shared-experts module over TP by each expert's intermediate (see the module
    docstring); the TP size must divide the intermediate width.

    ``output_layouts``: ``Replicate()`` sums the partial outputs here (one all-reduce); ``Partial()``
    returns the local partial sum for the MoE block's own style to reduce with the routed experts'.
    ``sum_input_grad=False``: the hidden states' (first argument's) gradient is left partial, for a
    block that reduces its branches' input gradients once (``MoeBlockParallel``); the per-token
    scales' is summed here.
    """

    # Inkling's shared experts of 3-D weights: each expert's intermediate (gate/up dim 1, down dim 2).
    facts = StyleFacts(
        "other", shard_dim={SHARED_EXPERTS: 1}, layout_defaults={"output_layouts": REPLICATE}, produces=PARTIAL_SUM
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        if packed_shared_shape(module) is None:
            return (
                f"`{type(self).__name__}` shards shared experts of 3-D gate_proj/up_proj [S, I, H] and down_proj"
                f" [S, H, I] (Inkling's), not {type(module).__name__}"
            )
        return None

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        shared = packed_shared_shape(module)
        if not shared:
            return super().required_dims(module, tp)
        return [("each shared expert's intermediate width", shared[1], 1)]  # local slices, plain tensors

    def __init__(self, *, output_layouts: Placement | None = None, sum_input_grad: bool = True) -> None:
        super().__init__()
        self.output_layouts = output_layouts if output_layouts is not None else Replicate()
        self.sum_input_grad = sum_input_grad
        if not isinstance(self.output_layouts, (Replicate, Partial)):
            raise ValueError(
                f"SharedExpertsParallel: output_layouts must be Replicate() or Partial(), got {self.output_layouts}"
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shape = packed_shared_shape(module)
        if shape is None:
            raise ValueError(
                "SharedExpertsParallel applies to shared experts of 3-D gate_proj, up_proj [S, I, H] and down_proj"
                f" [S, H, I]; {type(module).__name__} has none"
            )
        tp = device_mesh.size()
        if shape[1] % tp:
            raise ValueError(
                f"SharedExpertsParallel: the shared experts' intermediate width {shape[1]} does not divide by the"
                f" TP size {tp}"
            )
        for name, dim in SHARED_PROJECTIONS.items():
            param = module._parameters[name]
            sharded = distribute_tensor(param.data, device_mesh, [Shard(dim)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))

        def local_input(tensor: Any, summed: bool = True) -> Any:
            if not isinstance(tensor, torch.Tensor):
                return tensor
            tensor = replicated_local(tensor)
            # Each rank's gradient covers its slice of the intermediate only: summed over TP.
            if torch.is_grad_enabled() and tensor.is_floating_point() and summed:
                tensor = all_reduce_grad(tensor, device_mesh)
            return tensor

        def prepare(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            args = tuple(local_input(a, i > 0 or self.sum_input_grad) for i, a in enumerate(args))
            kwargs = {k: local_input(v) for k, v in kwargs.items()}
            params.local_views(mod)
            return args, kwargs

        def finish(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if output is None or isinstance(self.output_layouts, Partial):  # None: the forward raised
                return output
            return SumOverMesh.apply(output, device_mesh.get_group())

        run_on_local_tensors(module, prepare, finish)
        return module

    def __repr__(self) -> str:
        summed = "" if self.sum_input_grad else ", sum_input_grad=False"
        return f"{type(self).__name__}(output_layouts={self.output_layouts}{summed})"


__all__ = ["SHARED_PROJECTIONS", "SharedExpertsParallel", "packed_shared_shape"]

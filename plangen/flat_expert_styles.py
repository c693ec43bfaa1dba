"""Experts kept as flat ``[E · ffn, H]`` weights (DBRX's ``DbrxExperts``), split over TP by whole experts.

DBRX does not pack its experts as transformers' 3-D ``gate_up_proj`` / ``down_proj``: a child
(``experts.mlp``, ``DbrxExpertGLU``) holds three 2-D weights ``w1``, ``v1``, ``w2`` of
``E · ffn`` rows, expert ``e`` being rows ``e · ffn`` to ``(e + 1) · ffn`` of each (``w1`` and
``v1`` are its gate and up projections as ``[ffn, H]``, ``w2`` its down projection stored
``[ffn, H]`` and applied as ``x @ w2``). The experts module loops over the experts the routes hit
and calls the child with one expert's three slices.

:class:`FlatExpertsParallel` gives each TP rank ``E / tp`` whole experts: a plain ``Shard(0)`` of
each flat weight is exactly that (rank ``r`` holds experts ``r · E/tp`` to ``(r + 1) · E/tp - 1``),
so FSDP2 composes with it like any column-parallel weight and a full state dict is the Hugging
Face weights. The rest is :class:`plangen.moe_styles.ExpertsParallel`'s layout: every rank holds
every token (the router runs replicated), computes the routes to its own experts, and leaves a
partial sum; the hidden states' and routing weights' gradients are summed over TP in backward.

Why the experts module's loop is plangen's here: ``ExpertsParallel`` masks other ranks' routes to
the sentinel id ``E / tp``, which transformers' experts skip, but ``DbrxExperts`` loops over every
hit id including the sentinel (its ``one_hot`` counts ``E + 1`` classes) and would index past its
experts. The style's forward is that loop over this rank's experts only, with the global expert
ids (no sentinel, ``num_experts`` untouched); each expert is still computed by the model's own
``DbrxExpertGLU`` forward, called with this rank's slices of the weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.tp_sums import SumOverMesh, all_reduce_grad, replicated_local

# DBRX's names: the child holding the flat weights, and the weights (gate, up, down).
FLAT_CHILD, FLAT_WEIGHTS = "mlp", ("w1", "v1", "w2")


def flat_expert_shape(module: nn.Module) -> tuple[int, int, int] | None:
    """(experts, ffn, hidden) of a flat-experts module (its ``num_experts``, ``ffn_hidden_size``,
    ``hidden_size`` and a child ``mlp`` whose ``w1``, ``v1``, ``w2`` are ``[E · ffn, hidden]``), else None."""
    sizes = [getattr(module, n, None) for n in ("num_experts", "ffn_hidden_size", "hidden_size")]
    child = getattr(module, FLAT_CHILD, None)
    if not all(isinstance(s, int) and s > 0 for s in sizes) or not isinstance(child, nn.Module):
        return None
    experts, ffn, hidden = sizes
    params = dict(child.named_parameters(recurse=False))
    if set(params) != set(FLAT_WEIGHTS) or any(tuple(p.shape) != (experts * ffn, hidden) for p in params.values()):
        return None
    return experts, ffn, hidden


def largest_tp_dividing(count: int, tp_size: int) -> int:
    """The largest TP size up to ``tp_size`` that divides ``count``."""
    return max(t for t in range(1, tp_size + 1) if count % t == 0)


class FlatExpertsParallel(ParallelStyle):
    """Shard a flat-experts module (``DbrxExperts``) over TP: ``E / tp`` whole experts per rank
    (see the module docstring); the TP size must divide the expert count.

    ``output_layouts``: ``Replicate()`` sums the partial outputs here (one all-reduce); ``Partial()``
    returns the local partial sum for the MoE block's own style to reduce (or reduce-scatter under SP).
    """

    def __init__(self, *, output_layouts: Placement | None = None) -> None:
        super().__init__()
        self.output_layouts = output_layouts if output_layouts is not None else Replicate()
        if not isinstance(self.output_layouts, (Replicate, Partial)):
            raise ValueError(f"FlatExpertsParallel: output_layouts must be Replicate() or Partial(), got {self.output_layouts}")

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shape = flat_expert_shape(module)
        if shape is None:
            raise ValueError(
                f"FlatExpertsParallel applies to experts with num_experts, ffn_hidden_size, hidden_size and a child"
                f" {FLAT_CHILD!r} of flat [E * ffn, hidden] weights {', '.join(FLAT_WEIGHTS)}; {type(module).__name__} has none"
            )
        experts, ffn, hidden = shape
        tp = device_mesh.size()
        if experts % tp:
            raise ValueError(
                f"FlatExpertsParallel: {experts} experts do not divide by the TP size {tp} (largest legal TP size:"
                f" {largest_tp_dividing(experts, tp)}); each expert's ffn split is not implemented for flat weights"
            )
        child = getattr(module, FLAT_CHILD)
        for name in FLAT_WEIGHTS:
            param = child._parameters[name]
            sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
            child.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        local = experts // tp
        first = device_mesh.get_local_rank() * local
        reduce_here = not isinstance(self.output_layouts, Partial)

        def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
            hidden_states, top_k_index, top_k_weights = (replicated_local(t) for t in (hidden_states, top_k_index, top_k_weights))
            if torch.is_grad_enabled():  # each rank's gradient covers its own experts' routes only
                hidden_states = all_reduce_grad(hidden_states, device_mesh)
                top_k_weights = all_reduce_grad(top_k_weights, device_mesh)
            output = _local_experts_forward(
                child, hidden_states, top_k_index, top_k_weights, experts, ffn, hidden, first, local
            )
            return SumOverMesh.apply(output, device_mesh.get_group()) if reduce_here else output

        module.forward = forward  # the instance's: hooks on the module still run around it
        module._plangen_expert_layout = "experts"
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(output_layouts={self.output_layouts})"


def _local_experts_forward(
    child: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor, experts: int, ffn: int, hidden: int, first: int, local: int,
) -> torch.Tensor:
    """``DbrxExperts.forward`` over experts ``first`` to ``first + local - 1`` only: this rank's
    share of the output (the other ranks' routes contribute nothing here)."""
    batch = hidden_states.shape[0]
    hidden_states = hidden_states.reshape(-1, hidden)
    output = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=experts).permute(2, 1, 0)[first:first + local]
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist()
        routes = [(expert, *torch.where(mask[expert])) for expert in hit]  # (local id, top-k slots, tokens)
    weights = [_param_local(child._parameters[n]).view(local, ffn, hidden) for n in FLAT_WEIGHTS]
    if not routes:
        # No route to this rank's experts: expert 0 on no tokens, so that the backward still reaches the
        # inputs' gradient all-reduces (every rank must join them) and the weights (FSDP2 reduce-scatters
        # the same gradients on every DP rank), with zeros.
        nothing = top_k_index.new_zeros(0)
        routes = [(0, nothing, nothing)]
    for expert, route, token in routes:
        states = child(hidden_states[token], *(w[expert] for w in weights))
        states = states.view(-1, hidden) * top_k_weights[token, route, None]
        output.index_add_(0, token, states)
    return output.view(batch, -1, hidden)


def _param_local(param: Any) -> torch.Tensor:
    # The TP shard (this rank's experts); FSDP2 has unsharded the parameter to it before the forward.
    return param.to_local() if isinstance(param, DTensor) else param

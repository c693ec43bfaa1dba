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
Face weights. The rest is :class:`plangen.styles.experts.ExpertsParallel`'s layout: every rank holds
every token (the router runs replicated), computes the routes to its own experts, and leaves a
partial sum; the hidden states' and routing weights' gradients are summed over TP in backward.

Why the experts module's loop is plangen's here: ``ExpertsParallel`` masks other ranks' routes to
the sentinel id ``E / tp``, which transformers' experts skip, but ``DbrxExperts`` loops over every
hit id including the sentinel (its ``one_hot`` counts ``E + 1`` classes) and would index past its
experts. The style's forward is that loop over this rank's experts only, with the global expert
ids (no sentinel, ``num_experts`` untouched); each expert is still computed by the model's own
``DbrxExpertGLU`` forward, called with this rank's slices of the weights.

Where the TP size does not divide the experts (3 experts at TP 2), each expert's ffn rows are split
instead, as :class:`plangen.styles.experts.ExpertsParallel` splits packed experts' intermediate
(:func:`plangen.styles.experts.choose_expert_layout` decides for both): ``w1`` / ``v1`` column-parallel
by ffn inside each expert block, ``w2`` row-parallel by the same rows. Rank ``r``'s rows of expert
``e`` are ``e · ffn + r · ffn/tp`` to ``e · ffn + (r + 1) · ffn/tp``, a strided layout of the flat
weight: each weight is re-laid out once so those rows are contiguous per rank (``[e_0 r_0; e_1 r_0;
...; e_0 r_1; ...]``, :func:`plangen.styles.fused.interleave_index` with one part per expert), then
a plain ``Shard(0)``, which FSDP2 composes with, and state-dict hooks show Hugging Face's layout
both ways, so a full state dict is the original weights. Every rank computes every route with its
slice of every expert; the partial sums and the gradients' all-reduces are the same as above.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from plangen.styles.experts import choose_expert_layout
from plangen.styles.tp_sums import SumOverMesh, all_reduce_grad, replicated_local
from plangen.plan.style_facts import FLAT_EXPERTS, PARTIAL_SUM, StyleFacts
from plangen.styles.base import PlangenStyle

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


def flat_expert_layout(module: nn.Module, tp_size: int) -> str:
    """``"experts"`` (whole experts per rank) or ``"intermediate"`` (each expert's ffn rows split),
    as :func:`plangen.styles.experts.choose_expert_layout` chooses for ``module``'s expert count."""
    shape = flat_expert_shape(module)
    return choose_expert_layout(shape[0] if shape else 0, tp_size)


def flat_expert_problem(module: nn.Module, tp_size: int) -> str | None:
    """Why :class:`FlatExpertsParallel` cannot split ``module`` at ``tp_size`` (one line), else None."""
    shape = flat_expert_shape(module)
    if shape is None or flat_expert_layout(module, tp_size) == "experts" or shape[1] % tp_size == 0:
        return None
    experts, ffn, _ = shape
    legal = max(t for t in range(1, tp_size + 1) if experts % t == 0 or ffn % t == 0)
    return (
        f"FlatExpertsParallel: {experts} experts do not divide by the TP size {tp_size}, nor does each expert's ffn"
        f" width {ffn} (the other layout) (largest legal TP size: {legal})"
    )


def flat_split_rows(module: nn.Module, tp_size: int) -> tuple[str, int]:
    """What each flat weight's rows are split by at ``tp_size`` and its size: the experts, or each expert's ffn."""
    experts, ffn, _ = flat_expert_shape(module) or (0, 0, 0)
    if flat_expert_layout(module, tp_size) == "experts":
        return "num_experts", experts
    return "each expert's ffn width", ffn


class FlatExpertsParallel(PlangenStyle):
    """Shard a flat-experts module (``DbrxExperts``) over TP: ``E / tp`` whole experts per rank where
    the TP size divides the expert count, else each expert's ffn rows split (see the module docstring).

    ``output_layouts``: ``Replicate()`` sums the partial outputs here (one all-reduce); ``Partial()``
    returns the local partial sum for the MoE block's own style to reduce (or reduce-scatter under SP).
    ``sum_input_grad=False``: the hidden states' gradient is left partial, for a block that reduces it
    once (:class:`plangen.styles.moe_blocks.MoeBlockParallel`), as ``ExpertsParallel``'s.
    """

    # DBRX's experts of flat [E * ffn, H] weights in a child: whole experts per rank (Shard(0) of each).
    facts = StyleFacts("other", shard_dim={FLAT_EXPERTS: 0}, produces=PARTIAL_SUM)

    def fit_problem(self, module: nn.Module) -> str | None:
        if flat_expert_shape(module) is None:
            return (
                f"`{type(self).__name__}` shards experts of flat [experts * ffn, hidden] weights in a child `mlp`"
                f" (DBRX's), not {type(module).__name__}"
            )
        return None

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        if not flat_expert_shape(module):
            return super().required_dims(module, tp)
        return [(*flat_split_rows(module, tp), 1)]  # whole experts per rank, else each expert's ffn rows

    def __init__(self, *, output_layouts: Placement | None = None, sum_input_grad: bool = True) -> None:
        super().__init__()
        self.output_layouts = output_layouts if output_layouts is not None else Replicate()
        self.sum_input_grad = sum_input_grad
        if not isinstance(self.output_layouts, (Replicate, Partial)):
            raise ValueError(
                f"FlatExpertsParallel: output_layouts must be Replicate() or Partial(), got {self.output_layouts}"
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shape = flat_expert_shape(module)
        if shape is None:
            raise ValueError(
                f"FlatExpertsParallel applies to experts with num_experts, ffn_hidden_size, hidden_size and a child"
                f" {FLAT_CHILD!r} of flat [E * ffn, hidden] weights {', '.join(FLAT_WEIGHTS)}; {type(module).__name__} has none"
            )
        experts, ffn, hidden = shape
        tp = device_mesh.size()
        problem = flat_expert_problem(module, tp)
        if problem is not None:
            raise ValueError(problem)
        layout = flat_expert_layout(module, tp)
        child = getattr(module, FLAT_CHILD)
        if layout == "experts":
            local, rows, first = experts // tp, ffn, device_mesh.get_local_rank() * (experts // tp)
        else:  # every expert, this rank's ffn rows of each
            local, rows, first = experts, ffn // tp, 0
        for name in FLAT_WEIGHTS:
            param = child._parameters[name]
            data = param.data
            if layout == "intermediate":
                data = data.index_select(0, _expert_rows_by_rank(experts, ffn, tp).to(data.device))
            sharded = distribute_tensor(data, device_mesh, [Shard(0)], src_data_rank=None)
            child.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        if layout == "intermediate":
            from plangen.styles.fused import install_layout_hooks

            install_layout_hooks(child, (1,) * experts, tp, {name: 0 for name in FLAT_WEIGHTS})
        reduce_here = not isinstance(self.output_layouts, Partial)

        def forward(
            hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
        ) -> torch.Tensor:
            hidden_states, top_k_index, top_k_weights = (
                replicated_local(t) for t in (hidden_states, top_k_index, top_k_weights)
            )
            if torch.is_grad_enabled():  # each rank's gradient covers its own experts' routes (or rows) only
                if self.sum_input_grad:
                    hidden_states = all_reduce_grad(hidden_states, device_mesh)
                top_k_weights = all_reduce_grad(top_k_weights, device_mesh)
            output = _local_experts_forward(
                child, hidden_states, top_k_index, top_k_weights, experts, rows, hidden, first, local
            )
            return SumOverMesh.apply(output, device_mesh.get_group()) if reduce_here else output

        module.forward = forward  # the instance's: hooks on the module still run around it
        module._plangen_expert_layout = layout
        return module

    def __repr__(self) -> str:
        summed = "" if self.sum_input_grad else ", sum_input_grad=False"
        return f"{type(self).__name__}(output_layouts={self.output_layouts}{summed})"


def _expert_rows_by_rank(experts: int, ffn: int, tp: int) -> torch.Tensor:
    # One part per expert, each split over TP: rank r's rows of every expert made contiguous.
    from plangen.styles.fused import interleave_index

    return interleave_index(experts * ffn, (1,) * experts, tp)


def _local_experts_forward(
    child: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    experts: int,
    ffn: int,
    hidden: int,
    first: int,
    local: int,
) -> torch.Tensor:
    """``DbrxExperts.forward`` over experts ``first`` to ``first + local - 1`` only, ``ffn`` rows of
    each (this rank's): this rank's share of the output (the other ranks' routes and rows contribute
    nothing here)."""
    batch = hidden_states.shape[0]
    hidden_states = hidden_states.reshape(-1, hidden)
    output = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=experts).permute(2, 1, 0)[first : first + local]
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

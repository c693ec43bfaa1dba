"""Mixture-of-experts styles: the experts split over the TP mesh on the expert dimension.

transformers 5.x keeps a MoE layer's experts as packed 3-D parameters (``gate_up_proj``
``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``, biases ``[E, ...]``) in one ``experts`` module called
with ``(hidden_states, top_k_index, top_k_weights)``. :class:`ExpertsParallel` gives each TP rank
``E / tp`` whole experts (``Shard(0)`` on every per-expert parameter):

* every rank holds every token (the router runs replicated), routes to another rank's expert are
  masked (local id ``E / tp``, the sentinel transformers' experts skip, and weight 0), so each rank
  computes exactly the (token, expert) pairs of its own experts;
* the outputs are partial sums over ranks, reduced like a row-parallel layer: one all-reduce of
  B·S·H per MoE layer (or a reduce-scatter under sequence parallel, by the block's output style);
* in backward the gradients of the shared inputs (the hidden states and the routing weights) are
  partial for the same reason and are summed over TP, so the router's gradient is exact.

Why the expert dimension and not each expert's intermediate dimension (transformers'
``moe_tp_experts`` + ``packed_colwise``): ``Shard(0)`` is a plain shard that FSDP2 composes with
like any column-parallel weight, so a full state dict gathers back in Hugging Face's layout; the
packed ``gate|up`` split needs strided shards that FSDP2 gathers back permuted. Both move the same
B·S·H per layer; the expert split launches E/tp small matmuls per rank instead of E thin ones.

Where the TP size does not divide the expert count (HunYuan-MoE-V1's one expert, or 3 experts at
TP 2), the same style splits each expert's intermediate dimension instead (the *intermediate*
layout; :func:`choose_expert_layout` is the one place that decides): ``gate_up_proj`` re-laid out
once as plangen's fused projections are (:mod:`plangen.styles.fused`: ``[gate_0; up_0; gate_1;
up_1]`` along the intermediate, then a plain ``Shard``, with state-dict hooks that show Hugging
Face's layout both ways, so FSDP2 composes with it and a full state dict is the original weights),
``down_proj`` sharded on its intermediate input. Every rank computes every route with its slice of
every expert; the outputs are partial sums over ranks reduced exactly as in the expert split, and
the gradients of the hidden states and routing weights are summed over TP the same way: the
collectives per MoE layer are the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from plangen.styles.tp_sums import SumOverMesh, all_reduce_grad, replicated_local
from plangen.stack import torch_compat as compat
from plangen.stack.transformers_compat import experts_take_sentinels
from plangen.plan.style_facts import EXPERTS, PARTIAL_SUM, REPLICATE, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

_INDEX_NAMES = ("top_k_index", "router_indices")
_WEIGHT_NAMES = ("top_k_weights", "routing_weights")


def expert_count(module: nn.Module) -> int | None:
    """How many experts ``module`` packs (its ``num_experts`` where its 3-D weights agree), else None.

    A router also knows ``num_experts`` and has an ``[experts, hidden]`` weight: only packed 3-D
    expert weights make an experts module.
    """
    count = getattr(module, "num_experts", None)
    if not isinstance(count, int):  # LongCat-Flash counts its real experts apart from its identity ones
        count = getattr(module, "num_routed_experts", None)
    if not isinstance(count, int) or count < 1:
        return None
    packed = [p for p in module.parameters(recurse=False) if p.dim() == 3 and p.shape[0] == count]
    return count if packed else None


EXPERT_LAYOUTS = ("experts", "intermediate")

# What a plan entry of ExpertsParallel says it does (hand-written and synthesized plans alike).
EXPERTS_PARALLEL_WHY = (
    "each rank holds E/tp whole experts where the TP size divides E, else a slice of every expert's "
    "intermediate, and computes the routes to them; partial sum out"
)
# What a branch whose sum_input_grad is off says (the block's MoeBlockParallel reduces the sum once).
INPUT_GRAD_LEFT_WHY = "its input's gradient left to the block's one reduction"


def choose_expert_layout(num_experts: int, tp_size: int, identity_experts: int = 0) -> str:
    """Which layout :class:`ExpertsParallel` gives ``num_experts`` experts at ``tp_size``: whole
    experts per rank where the TP size divides them (fewer, larger matmuls per rank; the measured
    cheaper one), else each expert's intermediate dimension split. The one place that chooses:
    the style, ``plangen verify`` and ``plangen init``'s shard shapes all ask it.

    ``identity_experts``: zero-compute experts beside the real ones (LongCat-Flash's, whose output
    is the routed input): always the intermediate split, where every rank computes every route and
    each rank's identity output is its 1/tp share of the sum (LongCat's ``gate_up_proj`` also packs
    rows for the identity experts that ``down_proj`` has not, so a split on the expert dim would
    give a rank different experts' halves)."""
    if identity_experts:
        return "intermediate"
    return "experts" if num_experts % tp_size == 0 else "intermediate"


def identity_expert_count(module: nn.Module) -> int:
    """How many zero-compute (identity) experts ``module`` routes to beside its packed ones."""
    count = getattr(module, "zero_expert_num", 0)
    has_identity = isinstance(getattr(module, _IDENTITY, None), nn.Module)
    return count if has_identity and isinstance(count, int) and count > 0 else 0


def expert_layout_of(module: nn.Module, tp_size: int) -> str:
    """:func:`choose_expert_layout` for a packed experts module."""
    return choose_expert_layout(expert_count(module) or 0, tp_size, identity_expert_count(module))


# transformers' names of a packed experts module's projections: the one packing [gate; up] along
# the intermediate, a non-gated one's up projection, the projection back to the hidden size.
_GATE_UP, _UP, _DOWN = "gate_up_proj", "up_proj", "down_proj"
_IDENTITY = "identity_expert"


def intermediate_split_dims(module: nn.Module, tp_size: int) -> dict[str, int]:
    """For the intermediate layout: each parameter of ``module`` and the dim its intermediate width
    lies on; ``ValueError`` (one line, naming both layouts and what stands in the way) where the TP
    size divides neither the experts nor this split."""
    problem = _intermediate_problem(module, tp_size)
    if problem is not None:
        raise ValueError(
            f"ExpertsParallel: {expert_count(module)} experts do not divide by the TP size {tp_size}, and each"
            f" expert's intermediate split (the other layout) does not fit: {problem}"
        )
    return _intermediate_dims(module)


def expert_layout_problem(module: nn.Module, tp_size: int) -> str | None:
    """Why :class:`ExpertsParallel` cannot split ``module`` at ``tp_size`` (one line), else None."""
    if expert_count(module) is None or expert_layout_of(module, tp_size) == "experts":
        return None
    try:
        intermediate_split_dims(module, tp_size)
    except ValueError as error:
        return str(error)
    return None


def _intermediate_dims(module: nn.Module) -> dict[str, int]:
    # [E, out, in] as stored (or [E, in, out] transposed): the intermediate is out of gate_up / up, in of down.
    transposed = bool(getattr(module, "is_transposed", False))
    dims = {n: (2 if transposed else 1) for n, _ in module.named_parameters(recurse=False) if n != _DOWN}
    dims[_DOWN] = 1 if transposed else 2
    return dims


def _intermediate_problem(module: nn.Module, tp_size: int) -> str | None:
    name = type(module).__name__
    params = dict(module.named_parameters(recurse=False))
    bad = [n for n, p in params.items() if p.dim() != 3 or n not in (_GATE_UP, _UP, _DOWN)]
    if bad or _DOWN not in params or (_GATE_UP in params) == (_UP in params):
        return (
            f"it takes {_GATE_UP} (or {_UP}) and {_DOWN}, 3-D and without biases; {name} has {', '.join(bad or params)}"
        )
    if getattr(module, "has_post_expert_norm", False):
        return f"{name} normalises each expert's output, which a partial sum cannot follow"
    if _GATE_UP in params and not _chunks_gate_up(module):
        return (
            f"{name} does not chunk {_GATE_UP}'s output into [gate; up] halves (its own gate function, or an"
            " interleaved layout)"
        )
    width = params[_DOWN].shape[_intermediate_dims(module)[_DOWN]]
    if width % tp_size:
        return f"their intermediate width {width} does not divide by it either"
    return None


def _chunks_gate_up(module: nn.Module) -> bool:
    """Whether the experts split ``gate_up_proj``'s output into [gate; up] halves: transformers'
    default gate function (its experts interface), or, for experts with a forward of their own and
    no gate function (LongCat-Flash), that forward's ``.chunk(2, dim=-1)`` (the sweep proves it)."""
    import inspect

    gate = getattr(type(module), "_apply_gate", None)
    if gate is None:
        try:
            return ".chunk(2, dim=-1)" in inspect.getsource(type(module).forward)
        except (OSError, TypeError):
            return False
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # an older transformers: no experts interface
        return False
    return gate is _default_apply_gate and getattr(module, "is_concatenated", True)


class ExpertsParallel(PlangenStyle):
    """Shard a packed experts module over TP: whole experts per rank where the TP size divides the
    expert count, else each expert's intermediate dimension (:func:`choose_expert_layout`; see the
    module docstring).

    ``output_layouts``: ``Replicate()`` sums the partial outputs here (one all-reduce) and returns a
    plain tensor; ``Partial()`` returns the local partial sum, for a block-level style that reduces
    it once together with other partial outputs (shared experts) or reduce-scatters it (SP).
    ``use_local_output=False`` (with ``Partial()``) returns it as a ``Partial`` DTensor instead, for
    experts the layer calls itself: whatever takes their output next redistributes it (Gemma 4's
    norm on it, ``SequenceParallel`` under SP: one reduce-scatter into the sequence shards).
    ``sum_input_grad=False``: the hidden states' gradient is left partial, for a block that reduces
    its branches' input gradients once (:class:`MoeBlockParallel`), or for a gather whose backward
    reduce-scatters it (Gemma 4's layer under SP: ``SharedInputGather``'s ``partial_readers``); the
    routing weights' is summed here.
    """

    # Whole experts per rank (the expert dim); outputs are partial sums over ranks.
    facts = StyleFacts(
        "experts", shard_dim={EXPERTS: 0}, layout_defaults={"output_layouts": REPLICATE}, produces=PARTIAL_SUM
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        if expert_count(module) is None:
            return (
                f"`{type(self).__name__}` shards a packed experts module (num_experts and [experts, ...] weights,"
                f" transformers 5.x), not {type(module).__name__}"
            )
        return None

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        count = expert_count(module)
        if not count:
            return super().required_dims(module, tp)
        if expert_layout_of(module, tp) == "experts" or expert_layout_problem(module, tp) is not None:
            return [("num_experts", count, 1)]  # whole experts per rank
        # Each expert's intermediate split (the TP size does not divide the experts): its width must divide.
        width = module.down_proj.shape[1 if getattr(module, "is_transposed", False) else 2]
        return [("each expert's intermediate width", width, 1)]

    def __init__(
        self, *, output_layouts: Placement | None = None, use_local_output: bool = True, sum_input_grad: bool = True
    ) -> None:
        super().__init__()
        self.output_layouts = output_layouts if output_layouts is not None else Replicate()
        self.use_local_output = use_local_output
        self.sum_input_grad = sum_input_grad
        if not isinstance(self.output_layouts, (Replicate, Partial)):
            raise ValueError(
                f"ExpertsParallel: output_layouts must be Replicate() or Partial(), got {self.output_layouts}"
            )
        if not use_local_output and not isinstance(self.output_layouts, Partial):
            raise ValueError("ExpertsParallel: use_local_output=False needs output_layouts=Partial()")

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        experts = expert_count(module)
        tp = device_mesh.size()
        if experts is None:
            raise ValueError(
                f"ExpertsParallel applies to an experts module with num_experts and per-expert packed weights; "
                f"{type(module).__name__} has none"
            )
        layout = expert_layout_of(module, tp)
        if layout == "intermediate":
            _shard_intermediate(module, device_mesh, intermediate_split_dims(module, tp))
            local = None  # every rank holds a slice of every expert: nothing to mask
            if identity_expert_count(module):
                _share_identity_output(getattr(module, _IDENTITY), tp)
        else:
            for name, param in list(module.named_parameters(recurse=False)):
                if param.dim() >= 1 and param.shape[0] == experts:
                    sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
                    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            local = experts // tp
            module.num_experts = local
            # transformers' experts (grouped_mm / batched_mm) mask sentinel routes only when told so.
            module._is_expert_parallel = True
        module._plangen_expert_layout = layout
        rank = device_mesh.get_local_rank()
        # Where the installed experts forwards mishandle the sentinel id (transformers_compat), the
        # experts run on this rank's routes alone, one per row, and the rows are scattered back.
        compact = local is not None and not experts_take_sentinels()
        routes: dict[str, Any] = {}

        def prepare(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            args, kwargs = list(args), dict(kwargs)
            hidden = replicated_local(args[0] if args else kwargs.pop("hidden_states"))
            index, index_at = _take(args, kwargs, 1, _INDEX_NAMES)
            weights, weights_at = _take(args, kwargs, 2, _WEIGHT_NAMES)
            index, weights = replicated_local(index), replicated_local(weights)
            if torch.is_grad_enabled():
                # Before the masking: each rank's gradient covers its own experts' routes only.
                if self.sum_input_grad:
                    hidden = all_reduce_grad(hidden, device_mesh)
                weights = all_reduce_grad(weights, device_mesh)
            if local is not None:
                off_rank = torch.div(index, local, rounding_mode="floor") != rank
                if compact:
                    hidden, index, weights = _own_routes(
                        hidden, index, weights, off_rank, local, device_mesh.size(), routes
                    )
                else:
                    index = torch.where(off_rank, torch.full_like(index, local), index % local)
                    weights = weights.masked_fill(off_rank, 0.0)
            params.local_views(mod)
            if args:
                args[0] = hidden
            else:
                kwargs["hidden_states"] = hidden
            _put(args, kwargs, index_at, index)
            _put(args, kwargs, weights_at, weights)
            return tuple(args), kwargs

        def finish(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if output is None:  # the forward raised: nothing to reduce
                return output
            if routes:
                output = _scatter_routes(output, routes)
            if isinstance(self.output_layouts, Partial):
                return (
                    output
                    if self.use_local_output
                    else DTensor.from_local(output, device_mesh, (Partial(),), run_check=False)
                )
            return SumOverMesh.apply(output, device_mesh.get_group())

        run_on_local_tensors(module, prepare, finish)
        return module

    def __repr__(self) -> str:
        local = "" if self.use_local_output else ", use_local_output=False"
        summed = "" if self.sum_input_grad else ", sum_input_grad=False"
        return f"{type(self).__name__}(output_layouts={self.output_layouts}{local}{summed})"


def _own_routes(
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    off_rank: torch.Tensor,
    local: int,
    ranks: int,
    routes: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's (token, expert) routes as a batch of one route per row: the hidden state of each
    route's token, its local expert id and its weight (``routes`` keeps where to scatter them back)."""
    own = (~off_rank).reshape(-1, index.shape[-1])
    if compat.is_fake(own):
        # A shape-only trace (plangen cost) has no routing: this rank's experts take their even share
        # of the routes, the number a fixed-size nonzero gives (how many routes they take is data).
        token, slot = torch.nonzero_static(own, size=-(-own.numel() // ranks)).unbind(-1)
    else:
        token, slot = own.nonzero(as_tuple=True)
    flat = hidden.reshape(-1, hidden.shape[-1])
    routes.update(token=token, shape=hidden.shape)
    ids = index.reshape(-1, index.shape[-1])[token, slot] % local
    return flat[token], ids.unsqueeze(-1), weights.reshape(-1, weights.shape[-1])[token, slot].unsqueeze(-1)


def _scatter_routes(output: torch.Tensor, routes: dict[str, Any]) -> torch.Tensor:
    """Each route's output added back onto its token's row (the inverse of :func:`_own_routes`)."""
    token, shape = routes.pop("token"), routes.pop("shape")
    whole = output.new_zeros((shape.numel() // shape[-1], output.shape[-1]))
    return whole.index_add(0, token, output).reshape(*shape[:-1], output.shape[-1])


def _shard_intermediate(module: nn.Module, device_mesh: DeviceMesh, dims: dict[str, int]) -> None:
    """Each expert's intermediate split: ``gate_up_proj`` re-laid out so each rank's slice holds its
    part of gate and of up (with state-dict hooks for Hugging Face's layout), then every parameter a
    plain ``Shard`` on its intermediate dim."""
    from plangen.styles.fused import install_layout_hooks, interleave_index

    tp = device_mesh.size()
    relaid = {n: d for n, d in dims.items() if n == _GATE_UP}
    for name, param in list(module.named_parameters(recurse=False)):
        dim = dims[name]
        data = param.data
        if name in relaid:
            data = data.index_select(dim, interleave_index(data.shape[dim], (1, 1), tp).to(data.device))
        sharded = distribute_tensor(data, device_mesh, [Shard(dim)], src_data_rank=None)
        module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
    if relaid:
        install_layout_hooks(module, (1, 1), tp, relaid)


def _share_identity_output(identity: nn.Module, tp: int) -> None:
    # Every rank computes every identity route, and the outputs are summed over TP: each rank's is
    # its 1/tp share (transformers' moe_identity_expert divides the same way). The input's gradient
    # is summed over TP with the experts' (exact: a power-of-two TP size scales without rounding).
    def share(mod: nn.Module, args: tuple) -> tuple:
        return (args[0] / tp, *args[1:])

    identity.register_forward_pre_hook(share)


def _take(args: list, kwargs: dict, position: int, names: tuple[str, ...]) -> tuple[torch.Tensor, Any]:
    if len(args) > position:
        return args[position], position
    for name in names:
        if name in kwargs:
            return kwargs[name], name
    raise ValueError(f"ExpertsParallel: the experts were called without {names[0]}")


def _put(args: list, kwargs: dict, where: Any, value: torch.Tensor) -> None:
    if isinstance(where, int):
        args[where] = value
    else:
        kwargs[where] = value


class AllReduceOutputGrad(PlangenStyle):
    """A replicated module whose output scales a partial sum (Qwen2-MoE's ``shared_expert_gate``:
    ``sigmoid(gate(x)) * shared_expert(x)``, the shared expert's output still partial over TP).

    Each rank's gradient of that output covers its partial sum only, so its weight and input
    gradients would be partial too: the output's gradient is summed over TP in backward (identity
    forward), and everything upstream of it is exact.
    """

    facts = StyleFacts("grad_reduce", replicates=True)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def reduce_grad(mod: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            return all_reduce_grad(output, device_mesh) if torch.is_grad_enabled() else output

        module.register_forward_hook(reduce_grad)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

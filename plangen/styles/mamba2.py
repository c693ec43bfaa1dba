"""Mamba2 mixers split by heads over TP, as Megatron and vLLM split them.

A Mamba2 mixer (NemotronH, GraniteMoeHybrid, Bamba, Mamba2, Zamba2) projects the hidden state once,
``in_proj`` giving ``[z (I) | x (I) | B (G·N) | C (G·N) | dt (H)]`` (``I = H · head_dim`` for ``H``
heads, ``G`` groups of ``N`` state features), runs a depthwise ``conv1d`` over ``[x | B | C]``, the
scan per head (head ``h`` reads the ``B``/``C`` of group ``h // (H / G)``), a gated RMSNorm over
groups of ``I / G`` features and ``out_proj`` back to the hidden size. Everything per head splits
over TP: ``z``, ``x``, ``dt``, ``A_log``, ``D``, ``dt_bias``, the norm's weight, ``x``'s conv channels
and ``out_proj``'s input (row-parallel: one all-reduce, or a reduce-scatter under SP). ``B`` and
``C``:

* ``G`` divisible by the TP size: split by groups (rank ``r``'s heads read only its groups), and the
  norm's groups lie whole on one rank, so the mixer needs no collective of its own;
* ``G = 1`` (GraniteMoeHybrid, Bamba, Zamba2, FalconH1): every rank needs the one group. Its rows
  of ``in_proj`` and ``conv1d`` are stored sharded like any other row (1/tp per rank, so memory is
  the ideal) and all-gathered whole once per forward (weights, not activations: ``2 · N · hidden``
  and ``2 · N · kernel`` values), their gradient reduce-scattered, which sums every rank's heads'
  part: exact, as :class:`~plangen.styles.fused.MultiQueryColwiseParallel` does for one KV head.
  The norm's one group spans every rank: its sum of squares is all-reduced (B·S values each way).

A buffer that scales ``in_proj``'s output per feature (FalconH1's ``mup_vector``) is cut to this
rank's features; a mixer without a norm (FalconH1's ``Identity`` when ``mamba_rms_norm`` is off)
gates its local slice in its own forward.

The weights are stored as :class:`~plangen.styles.fused.FusedColwiseParallel` stores a packed
projection: re-laid out once so each rank's rows are its own parts, a plain ``Shard(0)`` that FSDP2
composes with, and state-dict hooks that give and take Hugging Face's layout (``docs/fused.md``).

Two styles: :class:`Mamba2MixerParallel` on the mixer (its forward reads ``conv1d.weight`` and its
own ``A_log``/``D``/``dt_bias`` directly, never calling ``conv1d``, so the mixer's style lays them out
and, during each forward, swaps in this rank's local tensors; it also makes its head and width
attributes this rank's), and :class:`GatedRMSNormParallel` on its norm. ``out_proj`` is torch's
``RowwiseParallel``. Head counts are read from the mixer when the plan is applied; plans carry none.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from plangen.stack import torch_compat as compat
from plangen.styles.fused import FusedColwiseParallel, gather_shared_rows
from plangen.styles.tp_sums import SumOverTP
from plangen.plan.style_facts import HEADS, NORM, REPLICATE, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

# The mixer's own parameters of one value per head, read directly by its forward.
HEAD_PARAMETERS = ("A_log", "D", "dt_bias")


@dataclass(frozen=True)
class Mamba2Layout:
    """A Mamba2 mixer's sizes: ``heads`` of ``head_dim``, ``groups`` of ``state`` B/C features."""

    heads: int
    head_dim: int
    groups: int
    state: int

    @property
    def intermediate(self) -> int:
        return self.heads * self.head_dim

    @property
    def shared(self) -> bool:
        """One B/C group, which every rank's heads read: gathered whole per forward."""
        return self.groups == 1

    @property
    def in_proj_parts(self) -> tuple[int, ...]:
        """``in_proj``'s output parts, ``z | x | B | C | dt``."""
        bc = self.groups * self.state
        return (self.intermediate, self.intermediate, bc, bc, self.heads)

    @property
    def conv_parts(self) -> tuple[int, ...]:
        """``conv1d``'s channels, ``x | B | C``."""
        bc = self.groups * self.state
        return (self.intermediate, bc, bc)

    IN_PROJ_SHARED = (2, 3)
    CONV_SHARED = (1, 2)

    def largest_tp(self, limit: int = 64) -> int:
        return max(tp for tp in range(1, limit + 1) if self.refusal(tp) is None)

    def refusal(self, tp: int) -> str | None:
        """Why TP size ``tp`` cannot split this mixer; None where it can."""
        if self.heads % tp:
            return f"mamba heads={self.heads} do not split over TP size {tp}"
        if self.shared and self.state % tp:
            return f"the one B/C group's ssm_state_size={self.state} does not split over TP size {tp}"
        if not self.shared and self.groups % tp:
            return f"n_groups={self.groups} is neither 1 nor divisible by TP size {tp}"
        return None

    def local(self, tp: int) -> dict[str, int]:
        """The mixer's attributes that count all heads, as this rank's."""
        groups = 1 if self.shared else self.groups // tp
        intermediate = self.intermediate // tp
        return {
            "num_heads": self.heads // tp,
            "intermediate_size": intermediate,
            "n_groups": groups,
            "conv_dim": intermediate + 2 * groups * self.state,
        }


def _int_attribute(module: nn.Module, name: str) -> int:
    value = getattr(module, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{type(module).__name__} has no positive integer {name}: not a Mamba2 mixer")
    return value


def resolve_mamba2_layout(module: nn.Module) -> Mamba2Layout:
    """The sizes of a Mamba2 mixer, checked against its ``in_proj``, ``conv1d`` and own parameters.

    Raises a one-line ``ValueError`` for a module that is not laid out as a Mamba2 mixer.
    """
    name = type(module).__name__
    layout = Mamba2Layout(*(_int_attribute(module, a) for a in ("num_heads", "head_dim", "n_groups", "ssm_state_size")))
    in_proj, conv = getattr(module, "in_proj", None), getattr(module, "conv1d", None)
    if not isinstance(in_proj, nn.Linear) or not isinstance(conv, nn.Conv1d):
        raise ValueError(f"{name} has no nn.Linear in_proj and nn.Conv1d conv1d: not a Mamba2 mixer")
    if in_proj.out_features != sum(layout.in_proj_parts):
        raise ValueError(
            f"{name}.in_proj gives {in_proj.out_features} features, not z|x|B|C|dt = {'+'.join(map(str, layout.in_proj_parts))}"
        )
    channels = sum(layout.conv_parts)
    if conv.groups != conv.in_channels or conv.weight.shape[0] != channels:
        raise ValueError(f"{name}.conv1d is not depthwise over x|B|C = {channels} channels")
    if layout.heads % layout.groups:
        raise ValueError(f"{name}: num_heads={layout.heads} is not a multiple of n_groups={layout.groups}")
    for param_name in HEAD_PARAMETERS:
        param = module._parameters.get(param_name)
        if param is None or tuple(param.shape) != (layout.heads,):
            raise ValueError(f"{name}.{param_name} is not one value per head ({layout.heads})")
    return layout


def _local_input(x: torch.Tensor, mesh: DeviceMesh, layout: Placement) -> torch.Tensor:
    """The whole input on every rank, local; its gradient, this rank's heads' part, summed over TP
    (all-reduced, or reduce-scattered back to a sequence shard)."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, (layout,), run_check=False)
    if any(not p.is_replicate() for p in x.placements):
        x = x.redistribute(placements=[Replicate()])
    return x.to_local(grad_placements=(Partial(),))


class Mamba2MixerParallel(PlangenStyle):
    """A Mamba2 mixer split by heads over TP (see the module docstring for the layout).

    ``input_layouts``: the hidden state as the layer hands it (``Replicate()``, or ``Shard(1)`` under
    sequence parallel: all-gathered once, its gradient reduce-scattered). Applied before the mixer's
    children's styles (``norm``: :class:`GatedRMSNormParallel`, ``out_proj``: row-parallel): it lays
    out ``in_proj``, ``conv1d`` and ``A_log``/``D``/``dt_bias`` itself, and sets ``num_heads``,
    ``intermediate_size``, ``n_groups`` and ``conv_dim`` to this rank's. Refuses, with the largest
    legal size, a TP size that splits neither the heads nor the groups.
    """

    # A Mamba2 mixer split by heads (plangen.styles.mamba2): its own [heads] parameters, in_proj and
    # conv1d re-laid out by heads; it takes its input itself (gathered, gradient reduced once).
    facts = StyleFacts(
        "prepare_input",
        shard_dim={HEADS: 0},
        layout_defaults={"input_layouts": REPLICATE},
        lays_out_children={"in_proj": "colwise", "conv1d": "colwise"},
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        try:
            resolve_mamba2_layout(module)
        except ValueError as err:
            return f"`{type(self).__name__}`: {err}"
        return None

    def __init__(self, *, input_layouts: Placement | None = None) -> None:
        super().__init__()
        self.input_layouts = input_layouts if input_layouts is not None else Replicate()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        layout = resolve_mamba2_layout(module)
        tp = device_mesh.size()
        why = layout.refusal(tp)
        if why is not None:
            raise ValueError(
                f"Mamba2MixerParallel: {type(module).__name__}: {why}; the largest TP size it splits over is {layout.largest_tp()}"
            )
        for child, parts in ((module.in_proj, layout.in_proj_parts), (module.conv1d, layout.conv_parts)):
            if isinstance(child.weight, DTensor):
                raise ValueError(f"{type(module).__name__}'s {type(child).__name__} was sharded before its mixer")
            FusedColwiseParallel(part_sizes=parts)._partition_linear_fn("", child, device_mesh)
        for name in HEAD_PARAMETERS:
            param = module._parameters[name]
            sharded = distribute_tensor(param.detach(), device_mesh, [Shard(0)])
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        _apply_local_feature_buffers(module, layout, device_mesh)
        for name, value in layout.local(tp).items():
            setattr(module, name, value)
        # A forward that calls conv1d (NemotronH's before transformers 5.24) reads its channel counts.
        conv = module.conv1d
        conv.in_channels = conv.out_channels = conv.groups = layout.local(tp)["conv_dim"]
        _install_local_swap(module, layout, device_mesh, self.input_layouts)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(input_layouts={self.input_layouts})"


def local_features(layout: Mamba2Layout, tp: int, rank: int) -> torch.Tensor:
    """The ``in_proj`` output features rank ``rank`` computes, in Hugging Face's numbering:
    ``[z_r; x_r; B_r; C_r; dt_r]``, with the whole ``B`` and ``C`` where there is one group."""
    parts, pieces, start = layout.in_proj_parts, [], 0
    for i, size in enumerate(parts):
        if layout.shared and i in Mamba2Layout.IN_PROJ_SHARED:
            pieces.append(torch.arange(start, start + size))
        else:
            pieces.append(torch.arange(start + rank * size // tp, start + (rank + 1) * size // tp))
        start += size
    return torch.cat(pieces)


def _apply_local_feature_buffers(module: nn.Module, layout: Mamba2Layout, mesh: DeviceMesh) -> None:
    """Buffers that scale ``in_proj``'s output feature by feature (FalconH1's ``mup_vector``): this
    rank's features only, as its local output holds them (constants, not trained: a plain slice)."""
    features = sum(layout.in_proj_parts)
    index = None
    for name, buffer in list(module.named_buffers(recurse=False)):
        if buffer is None or buffer.dim() == 0 or buffer.shape[-1] != features:
            continue
        if index is None:
            index = local_features(layout, mesh.size(), mesh.get_local_rank()).to(buffer.device)
        persistent = name not in module._non_persistent_buffers_set
        module.register_buffer(name, buffer.index_select(-1, index), persistent=persistent)


def _install_local_swap(module: nn.Module, layout: Mamba2Layout, mesh: DeviceMesh, input_layout: Placement) -> None:
    """During each forward: the input whole and local, and the parameters the forward reads this
    rank's local tensors (the one B/C group's rows gathered whole); put back after."""
    shared = {
        "in_proj": (layout.in_proj_parts, Mamba2Layout.IN_PROJ_SHARED),
        "conv1d": (layout.conv_parts, Mamba2Layout.CONV_SHARED),
    }

    def local_of(owner: nn.Module, child: str, param: torch.Tensor) -> torch.Tensor:
        if child in shared and layout.shared:
            parts, which = shared[child]
            # This rank's rows of each part, as the proportions gather_shared_rows splits by.
            return gather_shared_rows(param, 0, tuple(p // mesh.size() for p in parts), which, mesh)
        return param.to_local() if isinstance(param, DTensor) else param

    def enter(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            args = (_local_input(args[0], mesh, input_layout), *args[1:])
        else:
            kwargs = {**kwargs, "hidden_states": _local_input(kwargs["hidden_states"], mesh, input_layout)}
        owners = [
            (mod, "", HEAD_PARAMETERS),
            (mod.in_proj, "in_proj", ("weight", "bias")),
            (mod.conv1d, "conv1d", ("weight", "bias")),
        ]
        for owner, child, names in owners:
            for name in names:
                param = owner._parameters.get(name)
                if param is None:
                    continue
                params.replace(owner, name, local_of(owner, child, param))
        return args, kwargs

    run_on_local_tensors(module, enter)


# ---------------------------------------------------------------------------------------------
# The gated RMSNorm over groups of heads


def _normalize_groups(h: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    *prefix, width = h.shape
    grouped = h.view(*prefix, width // group, group)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    return grouped.view(*prefix, width)


def _gated_norm(
    x: torch.Tensor,
    gate: torch.Tensor | None,
    weight: torch.Tensor,
    group: int,
    eps: float,
    mesh: DeviceMesh | None,
    groups: int = 1,
    rank_group: int = 0,
    gather: bool = False,
) -> torch.Tensor:
    """Mamba2's gated RMSNorm of this rank's features: ``x · silu(gate)`` normalised over groups of
    ``group`` features. Where a group spans ranks (``group`` wider than the local slice), the slice's
    sum of squares is summed over ``mesh`` for its group ``rank_group`` of ``groups``; with ``gather``
    the slices are all-gathered instead and every group normalised whole (no cross-rank sum)."""
    dtype = x.dtype
    h = x.float()
    if gate is not None:
        h = h * nn.functional.silu(gate.float())
    *prefix, local = h.shape
    if mesh is None or local % group == 0:
        h = _normalize_groups(h, group, eps)
    elif gather:
        whole = compat.all_gather(h, h.ndim - 1, mesh)
        h = _normalize_groups(whole, group, eps).narrow(-1, mesh.get_local_rank() * local, local)
    else:
        sums = h.pow(2).sum(-1, keepdim=True)
        if groups > 1:  # every group's sum in one all-reduce: this rank adds to its own group's only
            sums = sums * nn.functional.one_hot(torch.tensor(rank_group, device=h.device), groups).to(h.dtype)
        total = SumOverTP.apply(sums, mesh)
        if groups > 1:
            total = total.narrow(-1, rank_group, 1)
        h = h * torch.rsqrt(total / group + eps)
    return weight * h.to(dtype)


def resolve_gated_norm(module: nn.Module) -> tuple[int, int, float]:
    """(width, group size, eps) of a Mamba2 gated RMSNorm whose forward computes :func:`_gated_norm`,
    found by running it once on random values; a one-line ``ValueError`` for anything else."""
    name = type(module).__name__
    weight = module._parameters.get("weight")
    params = dict(module.named_parameters())
    if weight is None or weight.dim() != 1 or set(params) != {"weight"}:
        raise ValueError(f"{name} is not a gated RMSNorm with one 1-D weight")
    group, eps = getattr(module, "group_size", None), getattr(module, "variance_epsilon", None)
    width = weight.shape[0]
    if not isinstance(group, int) or group <= 0 or width % group or not isinstance(eps, (int, float)):
        raise ValueError(f"{name} states no group_size dividing its width {width} and variance_epsilon")
    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        probe.weight.copy_(torch.rand(width, generator=generator) + 0.5)
        x, gate = (torch.randn(2, 3, width, generator=generator) * 1e-3 + 2e-3 for _ in range(2))
        got = probe(x, gate)
        expected = _gated_norm(x, gate, probe.weight, group, float(eps), None)
    if (
        not isinstance(got, torch.Tensor)
        or got.shape != x.shape
        or not torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
    ):
        raise ValueError(
            f"{name} does not compute Mamba2's gated RMSNorm over groups of {group} (x · silu(gate), then RMS)"
        )
    return width, group, float(eps)


class GatedRMSNormParallel(PlangenStyle):
    """Mamba2's gated RMSNorm (``norm(x, gate)``) on this rank's heads: weight ``Shard(0)``.

    Takes this rank's slice of ``x`` and of ``gate`` (local tensors, as :class:`Mamba2MixerParallel`
    makes them) and returns its slice of the output. Groups that lie whole on a rank (``n_groups``
    divisible by the TP size) are normalised locally, no collective; a group spread over ranks
    (``n_groups = 1``) gets its sum of squares all-reduced (B·S values per group, one all-reduce in
    forward, one in backward). The module's own forward is the spec: it is run once and refused
    where it computes anything else.
    """

    # Its gated RMSNorm on this rank's heads: weight Shard(0), a group spread over ranks all-reduced.
    facts = StyleFacts("sharded_norm", shard_dim={NORM: 0})

    def fit_problem(self, module: nn.Module) -> str | None:
        try:
            resolve_gated_norm(module)
        except ValueError as err:
            return f"`{type(self).__name__}`: {err}"
        return None

    # Where a group spans ranks: all-gather its slices rather than sum its statistics over TP.
    gather = False

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        width, group, eps = resolve_gated_norm(module)
        tp = device_mesh.size()
        local = width // tp if width % tp == 0 else 0
        if not local or (local % group and group % local):
            raise ValueError(
                f"GatedRMSNormParallel: {type(module).__name__} of width {width} in groups of {group} does not split "
                f"over TP size {tp} into whole groups or whole shares of one"
            )
        weight = module._parameters["weight"]
        sharded = distribute_tensor(weight.detach(), device_mesh, [Shard(0)])
        module.register_parameter("weight", nn.Parameter(sharded, requires_grad=weight.requires_grad))
        rank_group = device_mesh.get_local_rank() * local // group
        # An instance attribute: nn.Module.__call__ (and FSDP2's hooks around it) runs it as the forward.
        module.forward = partial(  # type: ignore[method-assign]
            _gated_forward, module, group, eps, device_mesh, width // group, rank_group, self.gather
        )
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _gated_forward(
    module: nn.Module,
    group: int,
    eps: float,
    mesh: DeviceMesh,
    groups: int,
    rank_group: int,
    gather: bool,
    hidden_states: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    weight = module.weight.to_local() if isinstance(module.weight, DTensor) else module.weight
    if hidden_states.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"GatedRMSNormParallel: the input's last dim is {hidden_states.shape[-1]}, this rank's slice of the norm is "
            f"{weight.shape[0]} wide: its mixer must be split by heads (Mamba2MixerParallel)"
        )
    return _gated_norm(hidden_states, gate, weight, group, eps, mesh, groups, rank_group, gather)


class GatheredGatedRMSNormParallel(GatedRMSNormParallel):
    """:class:`GatedRMSNormParallel` without a cross-rank sum in forward: the stable variant's
    (:mod:`plangen.plans.variants`). A group spread over ranks has its slices of ``x · silu(gate)``
    all-gathered (one all-gather of this rank's width) and normalised whole on every rank as one
    device does; each rank keeps its slice and applies its own ``Shard(0)`` slice of the weight (so
    the weight's gradient stays local and exact). Groups whole on a rank need nothing."""

    # Its stable-variant twin: a group spread over ranks all-gathered and normalised whole instead.
    facts = StyleFacts("sharded_norm", shard_dim={NORM: 0})

    gather = True

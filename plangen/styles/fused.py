"""Fused (packed) projections under TP and FSDP2: each rank holds its own heads' q, k and v.

A fused projection packs several parts along its output features: Phi-3's ``qkv_proj`` is
``[q; k; v]`` (with GQA, k and v are smaller than q), its ``gate_up_proj`` is ``[gate; up]``.
A plain ``Shard(0)`` would give rank 0 all of q and rank 1 k and v. :class:`FusedColwiseParallel`
re-lays the fused weight out once, when TP is applied, as ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]``,
and shards that with an ordinary ``Shard(0)``: each rank's local output is its own
``[q_r; k_r; v_r]``, and FSDP2 composes with a plain ``Shard`` exactly as it does for any
column-parallel weight. torch's ``_StridedShard`` cannot say this: it splits equal parts only
(not GQA's q/k/v), and FSDP2 (torch 2.13) gathers it back permuted (docs/fused.md measures both).

The parameter then holds the rows in an order of plangen's own, so the style also installs two
state-dict hooks on the module that translate both ways: ``state_dict()`` gives the Hugging Face
layout (a ``Replicate()`` DTensor of the whole fused weight, gathered once per fused weight, which
is what a full state dict gathers anyway), and ``load_state_dict`` takes the Hugging Face layout
(a plain tensor or any DTensor of the whole weight) and keeps this rank's rows. The model's own
split of the fused output (``chunk(2, -1)``, or slices by head counts that
:class:`LocalHeadCounts` makes local) then sees this rank's parts.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from plangen.styles.hf_layout import (  # noqa: F401 - LAYOUT_ATTRIBUTE, interleave_index: imported from here too
    LAYOUT_ATTRIBUTE,
    HuggingFaceLayoutTensor,
    relaid_dim,
    hugging_face_value,
    interleave_index,
    keep_unwrap_last,
)
from plangen.model.module_facts import apply_head_counts, head_count_owner, is_conv1d, output_dim
from plangen.plan.style_facts import CONV1D, LINEAR, MODULE_HOOKS, PARTIAL_SUM, REPLICATE, SHARD_LAST, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle, head_count_dims


def _linear_or_conv1d_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear) or is_conv1d(module):
        return None
    return f"`{type(style).__name__}` shards nn.Linear and GPT-2's Conv1D only, not {type(module).__name__}"


def _check_projection(style: ParallelStyle, module: nn.Module) -> None:
    if not (isinstance(module, nn.Linear) or is_conv1d(module)):
        raise NotImplementedError(
            f"{type(style).__name__} shards nn.Linear and Conv1D only, not {type(module).__name__}"
        )


class Conv1DColwiseParallel(ColwiseParallel, PlangenStyle):
    """:class:`ColwiseParallel` that also takes GPT-2's ``Conv1D``: its weight is split on dim 1
    (the output features of ``[in, out]``), its bias on dim 0; ``nn.Linear`` as torch does."""

    # GPT-2's Conv1D keeps its weight [in, out]: the output features are dim 1, the input ones dim 0.
    facts = StyleFacts(
        "colwise",
        shard_dim={LINEAR: 0, CONV1D: 1},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
        produces=SHARD_LAST,
        hooks=MODULE_HOOKS,
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        return _linear_or_conv1d_problem(self, module)

    def _partition_linear_fn(self, name, module, device_mesh):
        for param_name, param in list(module.named_parameters(recurse=False)):
            dim = output_dim(module, param_name)
            dist_param = nn.Parameter(
                distribute_tensor(
                    self._relayout(param.detach(), dim, device_mesh),
                    device_mesh,
                    [Shard(dim)],
                    src_data_rank=self.src_data_rank,
                ),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(param_name, dist_param)

    def _relayout(self, tensor: torch.Tensor, dim: int, device_mesh: DeviceMesh) -> torch.Tensor:
        return tensor

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_projection(self, module)
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class Conv1DRowwiseParallel(RowwiseParallel, PlangenStyle):
    """:class:`RowwiseParallel` that also takes GPT-2's ``Conv1D``: its weight is split on dim 0
    (the input features of ``[in, out]``), its bias replicated (added once, after the sum)."""

    facts = StyleFacts(
        "rowwise",
        shard_dim={LINEAR: 1, CONV1D: 0},
        layout_defaults={"input_layouts": SHARD_LAST, "output_layouts": REPLICATE},
        produces=PARTIAL_SUM,
        hooks=MODULE_HOOKS,
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        return _linear_or_conv1d_problem(self, module)

    def _partition_linear_fn(self, name, module, device_mesh):
        if not is_conv1d(module):
            return super()._partition_linear_fn(name, module, device_mesh)
        for param_name, param in list(module.named_parameters(recurse=False)):
            placement = Shard(0) if param_name == "weight" else Replicate()
            dist_param = nn.Parameter(
                distribute_tensor(param, device_mesh, [placement], src_data_rank=self.src_data_rank),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(param_name, dist_param)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_projection(self, module)
        self.desired_input_layouts = (Shard(-1),)  # what torch sets for a row-parallel Linear
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class FusedColwiseParallel(Conv1DColwiseParallel):
    """Column-wise for a projection whose output packs parts of sizes in proportion ``part_sizes``.

    ``part_sizes=(1, 1)`` for ``[gate; up]``; ``(heads, kv_heads, kv_heads)`` for ``[q; k; v]``.
    Each rank's local output is ``[part0_r; part1_r; ...]`` (see the module docstring); the
    input is handled as :class:`ColwiseParallel` does (``input_layouts=Shard(1)`` gathers a
    sequence-sharded input once, and reduce-scatters its gradient). The output stays sharded on
    the last dim: a gathered output would interleave the parts. Works on ``nn.Linear`` and on
    GPT-2's ``Conv1D`` (weight ``[in, out]``); weights are ordinary ``Shard`` DTensors, so FSDP2
    shards them further like any column-parallel weight.
    """

    # A fused projection's output features, re-laid out so each rank's rows are its own parts.
    facts = StyleFacts(
        "colwise", shard_dim={LINEAR: 0, CONV1D: 1}, layout_defaults={"input_layouts": REPLICATE}, produces=SHARD_LAST
    )

    def __init__(
        self,
        *,
        part_sizes: tuple[int, ...] = (1, 1),
        input_layouts: Any = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(input_layouts=input_layouts, output_layouts=Shard(-1), use_local_output=use_local_output)
        self.part_sizes = tuple(part_sizes)

    def _relayout(self, tensor: torch.Tensor, dim: int, device_mesh: DeviceMesh) -> torch.Tensor:
        index = interleave_index(tensor.shape[dim], self.part_sizes, device_mesh.size())
        return tensor.index_select(dim, index.to(tensor.device))

    def _partition_linear_fn(self, name, module, device_mesh):
        super()._partition_linear_fn(name, module, device_mesh)
        install_layout_hooks(module, self.part_sizes, device_mesh.size())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(part_sizes={self.part_sizes}, input_layouts={self.input_layouts}, "
            f"use_local_output={self.use_local_output})"
        )


class MultiQueryColwiseParallel(FusedColwiseParallel):
    """Column-wise for a packed ``[q; k; v]`` with one key/value head (multi-query attention).

    ``part_sizes`` are the parts' proportions (``(heads, 1, 1)``: GPT-BigCode's ``c_attn``,
    Falcon-7B's ``query_key_value``), ``shared_parts`` the indices of the parts every rank needs
    whole (the one k and the one v head: no TP size splits one head). Each rank computes
    ``[q_r; k; v]``: its own query heads and the whole shared head, as Megatron replicates a KV head
    the TP size exceeds.

    The weight is stored as :class:`FusedColwiseParallel` stores it, a plain ``Shard`` of the
    re-laid-out rows (each rank holds its query rows and ``1/tp`` of the shared rows), so FSDP2,
    the gradient norm and the Hugging Face state dict (the same hooks) treat it as any
    column-parallel weight. Each forward all-gathers the shared rows over TP (``2 · head_dim ·
    hidden`` values of weight, not activations); backward reduce-scatters their gradient, which sums
    every rank's query heads' part: exact. Why not a replicated copy of the shared rows inside the
    sharded parameter: its full tensor would not be Hugging Face's, the gradient norm and the
    optimizer would count the copy ``tp`` times, and the copies need the same sum over TP anyway
    (an all-reduce: what the all-gather and reduce-scatter here cost together).

    The input is taken as :class:`ColwiseParallel` takes it (``input_layouts=Shard(1)`` gathers a
    sequence-sharded input once, and reduce-scatters its gradient); the output is local, this rank's
    ``[q_r; k; v]`` (no DTensor describes q sharded beside k and v whole).
    """

    # A packed [q; k; v] with one KV head: q column-parallel, the shared head gathered whole per forward.
    facts = StyleFacts(
        "colwise", shard_dim={LINEAR: 0, CONV1D: 1}, layout_defaults={"input_layouts": REPLICATE}, produces=SHARD_LAST
    )

    def __init__(
        self,
        *,
        part_sizes: tuple[int, ...] = (2, 1, 1),
        shared_parts: tuple[int, ...] = (1, 2),
        input_layouts: Placement | None = None,
    ) -> None:
        super().__init__(part_sizes=part_sizes, input_layouts=input_layouts, use_local_output=True)
        self.shared_parts = tuple(shared_parts)
        if not self.shared_parts or any(not 0 <= i < len(self.part_sizes) for i in self.shared_parts):
            raise ValueError(f"shared_parts {self.shared_parts} must name parts of part_sizes {self.part_sizes}")

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from copy import copy

        from plangen.styles.padded_heads import PADDED_HEADS, apply_padded_packed_rows, install_pad_save_hook

        _check_projection(self, module)
        # Query heads padded by the block's PrepareAttentionInput(padded_heads=True): the layout's parts
        # are the padded ones (this rank's query heads, pad included; the shared head whole).
        padded = getattr(module, PADDED_HEADS, None) is not None
        parts = apply_padded_packed_rows(module, self.part_sizes, self.shared_parts)
        style = copy(self) if padded else self
        style.part_sizes = parts
        style._partition_linear_fn("", module, device_mesh)
        if padded:
            install_pad_save_hook(module)  # after the layout hooks: it drops the pad from their rows
        apply_shared_parts(module, device_mesh, parts, self.shared_parts, self.input_layouts[0])
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(part_sizes={self.part_sizes}, shared_parts={self.shared_parts}, "
            f"input_layouts={self.input_layouts})"
        )


def gather_shared_rows(
    param: torch.Tensor, dim: int, part_sizes: tuple[int, ...], shared: tuple[int, ...], device_mesh: DeviceMesh
) -> torch.Tensor:
    """This rank's ``[part_0_r; part_1_r; ...]`` of a re-laid-out parameter (a ``Shard(dim)`` DTensor of
    :func:`interleave_index`'s rows), with the ``shared`` parts all-gathered whole (one all-gather; in
    backward one reduce-scatter, which sums every rank's contribution to the shared rows)."""
    tp = device_mesh.size()
    local = param.to_local() if isinstance(param, DTensor) else param
    unit = local.shape[dim] // sum(part_sizes)
    pieces = list(local.split([unit * p for p in part_sizes], dim))
    mine = torch.cat([pieces[i] for i in shared], dim)
    # [shared parts of rank 0; of rank 1; ...], the gradient of each rank's copy summed back (Partial).
    whole = DTensor.from_local(mine, device_mesh, (Shard(dim),), run_check=False)
    whole = whole.redistribute(device_mesh, (Replicate(),)).to_local(grad_placements=(Partial(),))
    by_rank = [whole.narrow(dim, r * mine.shape[dim], mine.shape[dim]) for r in range(tp)]
    offsets = [sum(unit * part_sizes[j] for j in shared[:k]) for k in range(len(shared))]
    for k, i in enumerate(shared):
        size = unit * part_sizes[i]
        pieces[i] = torch.cat([rows.narrow(dim, offsets[k], size) for rows in by_rank], dim)
    return torch.cat(pieces, dim)


def apply_shared_parts(
    module: nn.Module, device_mesh: DeviceMesh, part_sizes: tuple[int, ...], shared: tuple[int, ...], input_layout: Any
) -> None:
    """During each forward, ``module``'s parameters are this rank's ``[part_0_r; ...]`` with the
    ``shared`` parts gathered whole, and its input a local tensor whose gradient is summed over TP."""

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x, *rest = args
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, (input_layout,), run_check=False)
        if any(not p.is_replicate() for p in x.placements):
            x = x.redistribute(placements=[Replicate()])
        x = x.to_local(grad_placements=(Partial(),))
        for name, param in list(mod._parameters.items()):
            if param is None:
                continue
            params.replace(mod, name, gather_shared_rows(param, output_dim(mod, name), part_sizes, shared, device_mesh))
        return (x, *rest), kwargs

    run_on_local_tensors(module, swap_in)


def shard_packed_rows(module: nn.Module, part_sizes: tuple[int, ...], device_mesh: DeviceMesh) -> None:
    """Every parameter of ``module`` packs parts of ``part_sizes`` on its dim 0 (a depthwise
    ``nn.Conv1d`` over ``[q; k; v]`` channels): re-laid out and ``Shard(0)``, as
    :class:`FusedColwiseParallel` lays out a packed projection, with the same state-dict hooks."""
    for param_name, param in list(module.named_parameters(recurse=False)):
        index = interleave_index(param.shape[0], part_sizes, device_mesh.size()).to(param.device)
        sharded = distribute_tensor(param.detach().index_select(0, index), device_mesh, [Shard(0)], src_data_rank=None)
        module.register_parameter(param_name, nn.Parameter(sharded, requires_grad=param.requires_grad))
    install_layout_hooks(module, tuple(part_sizes), device_mesh.size())


def hugging_face_layout(model: nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The whole parameter (or gradient) ``name`` of ``model`` in Hugging Face's layout.

    ``tensor`` is the gathered value as the parallelized model holds it (``full_tensor()`` of the
    parameter or of its gradient); parameters of modules :class:`FusedColwiseParallel` did not
    re-lay out come back unchanged.
    """
    from plangen.styles.padded_heads import drop_pad

    path, _, param_name = name.rpartition(".")
    module = model.get_submodule(path)
    return drop_pad(module, param_name, padded_layout(module, param_name, tensor))


def padded_layout(module: nn.Module, param_name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The whole parameter (or gradient) in Hugging Face's row order, with any pad heads still in
    (:mod:`plangen.styles.padded_heads`); unchanged where the module was not re-laid out."""
    layout = getattr(module, LAYOUT_ATTRIBUTE, None)
    if layout is None:
        return tensor
    part_sizes, tp_size, dims = layout
    dim = relaid_dim(module, param_name, dims)
    if dim is None:
        return tensor
    index = interleave_index(tensor.shape[dim], part_sizes, tp_size).to(tensor.device)
    return tensor.index_select(dim, torch.argsort(index))


def install_layout_hooks(
    module: nn.Module, part_sizes: tuple[int, ...], tp_size: int, dims: dict[str, int] | None = None
) -> None:
    """State-dict hooks that show the Hugging Face layout outside and keep the TP order inside.

    ``dims``: the parameters re-laid out and the dim of each (None: every parameter, on its output
    dim); the others pass through the hooks untouched.
    """
    setattr(module, LAYOUT_ATTRIBUTE, (part_sizes, tp_size, dims))

    def index_of(param_name: str, rows: int, device: torch.device) -> torch.Tensor:
        return interleave_index(rows, part_sizes, tp_size).to(device)

    def to_hugging_face(mod: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        # A DTensor becomes a view in Hugging Face's layout over this rank's rows, pad left out: nothing
        # gathered (plangen.styles.hf_layout); a plain tensor is re-ordered.
        for param_name, param in mod.named_parameters(recurse=False):
            key = prefix + param_name
            value = state_dict.get(key)
            if value is None or relaid_dim(mod, param_name, dims) is None:
                continue
            state_dict[key] = (
                hugging_face_value(mod, param_name, value)
                if isinstance(value, DTensor)
                else padded_layout(mod, param_name, value)
            )  # any pad: install_pad_save_hook's, after this one

    def from_hugging_face(mod: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        for param_name, param in mod.named_parameters(recurse=False):
            key = prefix + param_name
            value = state_dict.get(key)
            dim = relaid_dim(mod, param_name, dims)
            if isinstance(value, HuggingFaceLayoutTensor):
                continue  # this model's own entry, the parameter's storage: keep_unwrap_last's hook takes it
            if value is None or dim is None or tuple(value.shape) != tuple(param.shape):
                continue  # load_state_dict reports the missing key or the wrong shape itself
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            permuted = whole.index_select(dim, index_of(param_name, whole.shape[dim], whole.device))
            if isinstance(param, DTensor):  # keep this rank's rows: a local slice, no communication
                permuted = distribute_tensor(
                    permuted.to(param.device_mesh.device_type), param.device_mesh, param.placements, src_data_rank=None
                )
            state_dict[key] = permuted

    module.register_state_dict_post_hook(to_hugging_face)
    module.register_load_state_dict_pre_hook(from_hugging_face)
    keep_unwrap_last(module)


class LocalHeadCounts(PlangenStyle):
    """The attention module sees only this rank's heads: its head counts are divided by the TP size.

    For attention that splits a fused projection's output by head counts (Phi-3 slices ``qkv`` at
    ``config.num_attention_heads * head_dim``; GPT-2 splits ``c_attn`` by ``split_size``), after
    :class:`FusedColwiseParallel` made that output this rank's ``[q_r; k_r; v_r]``. ``attributes``
    names the module's integer attributes to divide (``"num_key_value_heads"``, ``"split_size"``);
    ``"config.X"`` gives the module a view of its config with ``X`` divided (the model's own config
    is untouched). Parameters and the forward are left alone. A count that does not divide is refused.
    """

    # Divides the attention module's head counts; its parameters are its children's business.
    facts = StyleFacts("other")

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        return head_count_dims(module, self.attributes) or super().required_dims(module, tp)

    def __init__(self, *, attributes: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.attributes = tuple(attributes)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp = device_mesh.size()
        counts = {attribute: getattr(*head_count_owner(module, attribute)) for attribute in self.attributes}
        for attribute, value in counts.items():
            if not isinstance(value, int) or value % tp:
                raise ValueError(
                    f"{type(self).__name__}: {type(module).__name__}.{attribute}={value!r} does not divide by the TP size {tp}"
                )
        apply_head_counts(module, {attribute: value // tp for attribute, value in counts.items()})
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(attributes={self.attributes})"

"""Experts modules of one ``[experts, out, in]`` weight applied to tokens sorted by expert (JetMoE's
``JetMoeParallelExperts``), split column- and row-parallel inside every expert.

The transformers 5.x packed experts (``gate_up_proj`` / ``down_proj``) are :mod:`plangen.moe_styles`'.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.moe_styles import expert_count
from plangen.tp_sums import SumOverMesh, all_reduce_grad, replicated_local


def _swap_in_local(mod: nn.Module, swapped: dict[str, nn.Parameter]) -> None:
    # The forward computes on this rank's shards; to_local's backward hands each gradient back as the DTensor.
    for name, param in list(mod._parameters.items()):
        if isinstance(param, DTensor):
            swapped[name] = param
            mod._parameters[name] = param.to_local()  # type: ignore[assignment]


def _grouped_weight(style: ParallelStyle, module: nn.Module) -> nn.Parameter:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 3 or expert_count(module) is None:
        raise ValueError(
            f"{type(style).__name__} applies to an experts module with one [experts, out, in] weight "
            f"(JetMoE's JetMoeParallelExperts); {type(module).__name__} has none"
        )
    return weight


class GroupedColwiseParallel(ParallelStyle):
    """Column-parallel for an experts module of one ``[E, out, in]`` weight that its forward applies
    per expert to the tokens sorted by expert (JetMoE's ``JetMoeParallelExperts``, called with the
    inputs and per-expert token counts, ``input_linear`` of its MoE and of its mixture of attention
    heads): each rank computes its slice of every expert's output features (``Shard(1)``) from the
    whole input, and the input's gradient, partial for the same reason, is summed over TP.

    ``part_sizes``: the parts packed in the output features (``(1, 1)`` for ``[gate; up]``, which the
    block chunks in two), re-laid out so each rank's slice holds its share of every part, with the
    state dict in Hugging Face's layout (:mod:`plangen.fused_styles`); ``()`` for one part (a
    query projection, split by heads).
    """

    def __init__(self, *, part_sizes: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.part_sizes = tuple(part_sizes)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.fused_styles import install_layout_hooks, interleave_index

        weight = _grouped_weight(self, module)
        tp = device_mesh.size()
        data = weight.data
        if self.part_sizes:
            data = data.index_select(1, interleave_index(data.shape[1], self.part_sizes, tp).to(data.device))
        elif data.shape[1] % tp:
            raise ValueError(f"{type(self).__name__}: {data.shape[1]} output features do not divide by the TP size {tp}")
        sharded = distribute_tensor(data, device_mesh, [Shard(1)], src_data_rank=None)
        module.register_parameter("weight", nn.Parameter(sharded, requires_grad=weight.requires_grad))
        if self.part_sizes:
            install_layout_hooks(module, self.part_sizes, tp, {"weight": 1})
        swapped: dict[str, nn.Parameter] = {}

        def prepare(mod: nn.Module, args: tuple) -> tuple:
            inputs, *rest = args
            inputs = replicated_local(inputs)
            if torch.is_grad_enabled():
                inputs = all_reduce_grad(inputs, device_mesh)
            _swap_in_local(mod, swapped)
            return (inputs, *rest)

        def restore(mod: nn.Module, args: tuple, output: Any) -> None:
            mod._parameters.update(swapped)  # type: ignore[arg-type]
            swapped.clear()

        module.register_forward_pre_hook(prepare)
        # always_call: an exception inside forward must not leave local views in place of the parameters.
        module.register_forward_hook(restore, always_call=True)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(part_sizes={self.part_sizes})"


class GroupedRowwiseParallel(ParallelStyle):
    """Row-parallel for the same kind of experts module (JetMoE's ``output_linear``): each rank holds
    its slice of every expert's input features (``Shard(2)``), takes the matching slice its
    :class:`GroupedColwiseParallel` partner left, and the partial outputs are summed over TP (one
    all-reduce of the routed tokens, ``B·S·k × H``), so everything after (the gates, the scatter back
    to the tokens, the block's bias) runs on whole values, exactly."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        weight = _grouped_weight(self, module)
        tp = device_mesh.size()
        if weight.shape[2] % tp:
            raise ValueError(f"{type(self).__name__}: {weight.shape[2]} input features do not divide by the TP size {tp}")
        sharded = distribute_tensor(weight.data, device_mesh, [Shard(2)], src_data_rank=None)
        module.register_parameter("weight", nn.Parameter(sharded, requires_grad=weight.requires_grad))
        swapped: dict[str, nn.Parameter] = {}

        def prepare(mod: nn.Module, args: tuple) -> tuple:
            _swap_in_local(mod, swapped)
            return (replicated_local(args[0]), *args[1:])

        def finish(mod: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            mod._parameters.update(swapped)  # type: ignore[arg-type]
            swapped.clear()
            return output if output is None else SumOverMesh.apply(output, device_mesh.get_group())

        module.register_forward_pre_hook(prepare)
        module.register_forward_hook(finish, always_call=True)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

"""Column- and row-wise styles for a Linear whose features pack equal parts ([gate; up]), each
part sharded on its own: transformers' ``packed_colwise`` / ``packed_rowwise`` as ``_StridedShard``
DTensors. torch 2.13 on computes on such layouts; earlier releases are refused in one line naming
:class:`plangen.styles.fused.FusedColwiseParallel`, whose weights are plain shards.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Placement

from plangen.stack import torch_compat as compat
from plangen.styles.base import PlangenStyle, linear_only_problem
from plangen.plan.style_facts import LINEAR, PARTIAL_SUM, REPLICATE, StyleFacts


def _strided_shard(dim: int, split_factor: int) -> Placement:
    return compat.strided_shard(dim, split_factor)


def _check_packed(param: torch.Tensor, dim: int, split_factor: int, device_mesh: DeviceMesh, what: str) -> None:
    if not compat.COMPUTES_ON_STRIDED_SHARD:
        raise ValueError(
            f"{what}: torch {torch.__version__}'s DTensor cannot compute on a packed (_StridedShard) layout "
            "(torch 2.13 on can): use plangen's FusedColwiseParallel(part_sizes=(1, 1)) and RowwiseParallel, "
            "whose weights are plain shards"
        )
    # Uneven strided shards would mix the packed parts on the last rank: refuse instead.
    parts = split_factor * device_mesh.size()
    if param.shape[dim] % parts:
        raise ValueError(
            f"{what}: dim {dim} of size {param.shape[dim]} packs {split_factor} parts that must each split "
            f"evenly over {device_mesh.size()} TP ranks"
        )


class PackedColwiseParallel(ColwiseParallel, PlangenStyle):
    """Column-wise for a fused ``nn.Linear`` whose output packs ``split_factor`` equal parts ([gate; up]).

    transformers' ``packed_colwise``. Each part is sharded on its own, so rank ``r`` holds
    ``[gate_r; up_r]`` and the module's own ``chunk(2, -1)`` of its local output still separates gate
    from up. The weight and bias are ``_StridedShard(0, split_factor)`` DTensors: a faithful view of
    the original tensor (``full_tensor()`` and DCP state dicts give the checkpoint's layout back), and
    DTensor's linear propagates it to a ``_StridedShard`` output without communication. Input is
    replicated like :class:`ColwiseParallel`; its gradient is all-reduced by DTensor.

    TP only: FSDP2 (torch 2.13) over such a parameter runs a correct forward but builds a wrong 2-D
    spec for it (``_StridedShard`` on both mesh dims), so ``full_tensor()``, state dicts and
    checkpoints of the FSDP-sharded parameter come back permuted. Keep packed layers at DP=1.
    """

    facts = StyleFacts("colwise", shard_dim={LINEAR: 0}, strided=True, layout_defaults={"input_layouts": REPLICATE})

    def fit_problem(self, module: nn.Module) -> str | None:
        return linear_only_problem(self, module)

    def __init__(
        self,
        *,
        split_factor: int = 2,
        input_layouts: Any = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(input_layouts=input_layouts, use_local_output=use_local_output)
        self.split_factor = split_factor

    def _partition_linear_fn(self, name, module, device_mesh):
        placement = _strided_shard(0, self.split_factor)
        for param_name, param in module.named_parameters():
            _check_packed(param, 0, self.split_factor, device_mesh, f"{type(self).__name__} {param_name}")
            dist_param = nn.Parameter(
                distribute_tensor(param, device_mesh, [placement], src_data_rank=self.src_data_rank),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(param_name, dist_param)

    def _partition_embedding_fn(self, name, module, device_mesh):
        raise NotImplementedError(f"{type(self).__name__} shards nn.Linear only")

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        # The strided output is already what the module's consumers expect locally; a redistribute
        # to a plain Shard(-1) would interleave the parts across ranks.
        return outputs.to_local() if use_local_output else outputs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split_factor={self.split_factor}, input_layouts={self.input_layouts}, "
            f"use_local_output={self.use_local_output})"
        )


class PackedRowwiseParallel(RowwiseParallel, PlangenStyle):
    """Row-wise for an ``nn.Linear`` whose input packs ``split_factor`` equal parts, each sharded on its own.

    transformers' ``packed_rowwise`` layout: weight ``_StridedShard(1, split_factor)`` (the input
    features), bias replicated. transformers uses it only as a parameter layout (MoE expert weights run
    by ``moe_tp_experts``) and installs no forward; a module needs one under torch, so this one is the
    row-wise forward that matches the layout: the local input is this rank's ``[a_r; b_r]`` (what
    :class:`PackedColwiseParallel` outputs), the partial output is summed to ``output_layouts``.
    """

    facts = StyleFacts(
        "rowwise",
        shard_dim={LINEAR: 1},
        strided=True,
        layout_defaults={"output_layouts": REPLICATE},
        produces=PARTIAL_SUM,
    )

    def fit_problem(self, module: nn.Module) -> str | None:
        return linear_only_problem(self, module)

    def __init__(
        self,
        *,
        split_factor: int = 2,
        output_layouts: Any = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(output_layouts=output_layouts, use_local_output=use_local_output)
        self.split_factor = split_factor

    def _partition_linear_fn(self, name, module, device_mesh):
        _check_packed(module.weight, 1, self.split_factor, device_mesh, f"{type(self).__name__} weight")
        module.register_parameter(
            "weight",
            nn.Parameter(
                distribute_tensor(
                    module.weight,
                    device_mesh,
                    [_strided_shard(1, self.split_factor)],
                    src_data_rank=self.src_data_rank,
                ),
                requires_grad=module.weight.requires_grad,
            ),
        )
        if getattr(module, "bias", None) is not None:
            module.register_parameter(
                "bias",
                nn.Parameter(
                    distribute_tensor(module.bias, device_mesh, [Replicate()], src_data_rank=self.src_data_rank),
                    requires_grad=module.bias.requires_grad,
                ),
            )

    @staticmethod
    def _prepare_packed_input_fn(split_factor, mod, inputs, device_mesh):
        x = inputs[0]
        placement = (_strided_shard(x.ndim - 1, split_factor),)
        if not isinstance(x, DTensor):
            return DTensor.from_local(x, device_mesh, placement, run_check=False)
        if x.placements != placement:
            x = x.redistribute(placements=placement)
        return x

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{type(self).__name__} shards nn.Linear only")
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_packed_input_fn, self.split_factor),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split_factor={self.split_factor}, output_layouts={self.output_layouts}, "
            f"use_local_output={self.use_local_output})"
        )

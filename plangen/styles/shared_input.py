"""Sequence parallel for children of one module that read the same sequence-sharded input whole:
gathered once for all of them (Gemma 4's decoder layer: its router and its experts' input norm both
read the flattened residual). Re-exported by :mod:`plangen.styles`, where plans name it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

from plangen.stack import torch_compat as compat
from plangen.styles.tp_sums import grad_once
from plangen.plan.style_facts import StyleFacts
from plangen.styles.local_tensors import local_views_during_forward
from plangen.styles.base import PlangenStyle


class SharedInputGather(PlangenStyle):
    """Sequence parallel for children of one module that read the same sequence-sharded DTensor
    whole (Gemma 4's layer: its router and its experts' input norm are both handed the flattened
    residual): all-gathered once, at the first of ``readers`` that runs, and the same local whole
    tensor handed to the others. A ``PrepareModuleInput`` per reader gathers it once each.

    ``partial_readers`` (some of ``readers``): readers whose input gradient is a partial sum over TP
    (the experts' input norm ahead of ``ExpertsParallel(sum_input_grad=False)``: each rank's gradient
    covers its own experts' routes). Then the other readers' gradients, whole on every rank (the
    router's: ``ExpertsParallel`` sums its outputs' gradients), count on the first rank only, and the
    shared tensor's gradient, a partial sum, is reduce-scattered into this rank's sequence shard: the
    all-gather's own backward (B·S·H / tp per rank, where an all-reduce of the experts' input moved
    B·S·H and the gather's backward then kept a shard). A partial reader's own parameters become
    ``Replicate`` DTensors whose gradients are left ``Partial``, summed over TP where the sequence
    parallel norms' are. Without ``partial_readers`` every reader's gradient must be whole, and the
    gather's backward keeps this rank's shard, with no collective.

    A plain (not DTensor) input passes through untouched. ``readers``: child paths relative to the
    module; the cached tensor is dropped when the module's forward ends.
    """

    # A layer whose children read one sequence-sharded input whole (Gemma 4's router and experts' norm): gathered once.
    facts = StyleFacts("prepare_input")

    def __init__(self, *, readers: tuple[str, ...], partial_readers: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.readers = tuple(readers)
        self.partial_readers = tuple(partial_readers)
        if not set(self.partial_readers) <= set(self.readers):
            raise ValueError(
                f"SharedInputGather: partial_readers {self.partial_readers} must be among readers {self.readers}"
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        shared: dict[str, Any] = {}
        partial = bool(self.partial_readers)

        def gather_once(mod: nn.Module, args: tuple) -> tuple:
            source = args[0] if args else None
            if not isinstance(source, DTensor):
                return args
            if shared.get("source") is not source:
                shared.update(
                    source=source,
                    whole=_gather_partial_grad(source, device_mesh)
                    if partial
                    else source.redistribute(device_mesh, [Replicate()]).to_local(),
                )
            return (shared["whole"], *args[1:])

        def count_once(mod: nn.Module, args: tuple) -> tuple:
            # After gather_once (registered first): a whole gradient, added once to the partial sum.
            return (
                (grad_once(args[0], device_mesh), *args[1:])
                if torch.is_grad_enabled() and args and "whole" in shared
                else args
            )

        def forget(mod: nn.Module, args: tuple, output: Any) -> None:
            shared.clear()

        for reader in self.readers:
            child = module.get_submodule(reader)
            child.register_forward_pre_hook(gather_once)
            if reader in self.partial_readers:
                _partial_grad_parameters(child, device_mesh)
            elif partial:
                child.register_forward_pre_hook(count_once)
        # always_call: an exception inside forward must not keep the gathered activation alive.
        module.register_forward_hook(forget, always_call=True)
        return module

    def __repr__(self) -> str:
        partial = f", partial_readers={self.partial_readers}" if self.partial_readers else ""
        return f"{type(self).__name__}(readers={self.readers}{partial})"


def _gather_partial_grad(source: DTensor, device_mesh: DeviceMesh) -> torch.Tensor:
    """``source`` all-gathered whole (a local tensor) whose gradient, a partial sum over TP, is
    reduce-scattered back into ``source``'s shard. A flattened sequence shard (``[B, S, H]`` split on
    S, reshaped to ``[B·S, H]``: a ``_StridedShard`` of the rows) is gathered as ``[B, S, H]``:
    DTensor reduces a ``Partial`` gradient into a strided shard by an all-reduce (2x the bytes)."""
    (placement,) = source.placements
    shape = source.shape
    if compat.is_strided_shard(placement):
        dim, factor = placement.dim, placement.split_factor
        source = source.view(*shape[:dim], factor, shape[dim] // factor, *shape[dim + 1 :])  # Shard(dim + 1)
    whole = source.redistribute(device_mesh, [Replicate()]).to_local(grad_placements=(Partial(),))
    return whole.reshape(shape)


def _partial_grad_parameters(module: nn.Module, device_mesh: DeviceMesh) -> None:
    """``module``'s own parameters as ``Replicate`` DTensors (as a ``SequenceParallel`` norm's), run as
    local tensors whose gradient, a partial sum over TP (their module's output gradient is one), lands
    ``Partial`` in ``param.grad`` with no collective: summed where the sequence-parallel norms' are."""
    for name, param in list(module.named_parameters(recurse=False)):
        replicated = distribute_tensor(param.data, device_mesh, [Replicate()], src_data_rank=None)
        module.register_parameter(name, nn.Parameter(replicated, requires_grad=param.requires_grad))
    local_views_during_forward(module, grad_placements=(Partial(),))


__all__ = ["SharedInputGather"]

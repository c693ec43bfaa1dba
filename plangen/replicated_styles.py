"""Styles that keep a module's weights whole on every TP rank: sequence parallel for rotary
embeddings, and the replicated weights whose gradients must be summed over TP because their module
sees only this rank's slice (per-head norms, activation parameters). Re-exported by
:mod:`plangen.styles`, where plans name them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel


class RotaryEmbedParallel(SequenceParallel):
    """Sequence parallel for rotary-embedding modules called as ``rotary_emb(x, position_ids)``.

    The first input is the sequence-sharded hidden state, the second the position ids (replicated);
    the outputs (cos, sin) are returned as local tensors or DTensors sharded on the sequence.
    """

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):  # type: ignore[override]
        new_inputs = list(inputs)
        if not isinstance(inputs[0], DTensor):
            new_inputs[0] = DTensor.from_local(inputs[0], device_mesh, sequence_sharding, run_check=False)
        if len(inputs) > 1 and not isinstance(inputs[1], DTensor):
            new_inputs[1] = DTensor.from_local(inputs[1], device_mesh, (Replicate(),), run_check=False)
        return type(inputs)(new_inputs)

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):  # type: ignore[override]
        return type(outputs)(o.to_local() if use_local_output else o for o in outputs)


class ReplicatedWithGradAllReduce(SequenceParallel):
    """Replicated weights whose module sees a different slice on each TP rank (per-head norms).

    The module's weights become ``Replicate()`` DTensors and its local input is labelled as sharded
    on ``sequence_dim`` (the heads dimension of ``[batch, seq, heads, head_dim]`` by default), so
    autograd sums the weight gradient over the TP group. The output is returned local.
    """

    def __init__(self, *, sequence_dim: int = 2, use_local_output: bool = True) -> None:
        super().__init__(sequence_dim=sequence_dim, use_local_output=use_local_output)


def _all_reduce_grad(tensor: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
    """Identity in forward; in backward, the gradient is summed over ``device_mesh``.

    Labelling the gradient ``Partial`` makes ``from_local``'s backward redistribute it to the
    forward's ``Replicate`` (an all-reduce), with no division: DTensor's documented guarantee.
    """
    replicated = DTensor.from_local(tensor, device_mesh, (Replicate(),), run_check=False)
    return replicated.to_local(grad_placements=(Partial(),))


class AllReduceParamGrads(ParallelStyle):
    """Replicated parameters used on rank-local data: the forward is untouched, parameter grads are summed.

    transformers' ``replicated_with_grad_allreduce``: a norm between a colwise and a rowwise layer
    (Qwen3's per-head ``q_norm``) sees only this rank's heads, so each rank's weight gradient covers
    its heads only and the true gradient is their sum. The parameters stay plain tensors, identical on
    every rank, and the module's forward runs on local tensors whatever the input layout is (unlike
    :class:`ReplicatedWithGradAllReduce`, which assumes the heads dimension). During the forward each
    own parameter is swapped for an identity view whose backward all-reduces the gradient, so the
    summed gradient lands in ``param.grad`` before any optimizer or FSDP reduce-scatter reads it.
    """

    as_dtensor = False

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        sum_own_grads_over(module, device_mesh, as_dtensor=self.as_dtensor)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def sum_own_grads_over(module: nn.Module, device_mesh: DeviceMesh, as_dtensor: bool = False) -> None:
    """During each forward, ``module``'s own parameters are identity views whose gradient is summed
    over ``device_mesh`` (:class:`AllReduceParamGrads`; the block styles that also own such parameters).
    ``as_dtensor``: the views are ``Replicate`` DTensors (:class:`SequenceParallelOwnParameters`), in
    no-grad forwards too, so that they meet DTensor activations."""
    swapped: dict[str, torch.Tensor] = {}

    def swap_in(mod: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled() and not as_dtensor:
            return
        for name, param in list(mod._parameters.items()):
            if param is None or (not param.requires_grad and not as_dtensor):
                continue
            swapped[name] = param
            local = param.to_local() if isinstance(param, DTensor) else param
            view = (
                DTensor.from_local(local, device_mesh, (Replicate(),), run_check=False)
                if as_dtensor
                else _all_reduce_grad(local, device_mesh)
            )
            mod._parameters[name] = view  # type: ignore[assignment]

    def swap_back(mod: nn.Module, args: Any, output: Any) -> None:
        mod._parameters.update(swapped)  # type: ignore[arg-type]
        swapped.clear()

    module.register_forward_pre_hook(swap_in)
    # always_call: an exception inside forward must not leave views in place of the parameters.
    module.register_forward_hook(swap_back, always_call=True)


class SequenceParallelOwnParameters(AllReduceParamGrads):
    """A module's own parameters applied to the sequence-sharded residual stream (a ``Shard(1)``
    DTensor under sequence parallelism): Doge's layer scales, ``input_residual * residual``.

    Its children are left to their own styles. During the forward each own parameter is a
    ``Replicate`` DTensor made from the plain, identical-on-every-rank parameter, so it meets the
    residual as DTensor arithmetic; each rank's gradient covers its sequence shard only, and
    ``from_local``'s backward redistributes that ``Partial`` gradient to ``Replicate`` (the sum over
    TP) before it lands in ``param.grad``. The parameters stay plain tensors for FSDP2 and state dicts.
    """

    as_dtensor = True


class LeaveUnsharded(ParallelStyle):
    """Apply nothing: every TP rank keeps the full parameters and runs the module as is.

    transformers' ``replicate`` (5.x): a rule that exists so that a module keeps no other rule, e.g.
    ``embed_tokens`` where transformers would otherwise add ``embedding_rowwise``.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

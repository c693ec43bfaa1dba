"""Styles that keep a module's weights whole on every TP rank: sequence parallel for rotary
embeddings, and the replicated weights whose gradients must be summed over TP because their module
sees only this rank's slice (per-head norms, activation parameters). Re-exported by
:mod:`plangen.styles`, where plans name them.
"""

from __future__ import annotations


import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import SequenceParallel
from plangen.plan.style_facts import SEQUENCE_HOOKS, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle, own_parameters_problem


class RotaryEmbedParallel(SequenceParallel, PlangenStyle):
    """Sequence parallel for rotary-embedding modules called as ``rotary_emb(x, position_ids)``.

    The first input is the sequence-sharded hidden state, the second the position ids (replicated);
    the outputs (cos, sin) are returned as local tensors or DTensors sharded on the sequence.
    """

    facts = StyleFacts("sequence", replicates=True, replicate_dtensor=True)

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


class ReplicatedWithGradAllReduce(SequenceParallel, PlangenStyle):
    """Replicated weights whose module sees a different slice on each TP rank (per-head norms).

    The module's weights become ``Replicate()`` DTensors and its local input is labelled as sharded
    on ``sequence_dim`` (the heads dimension of ``[batch, seq, heads, head_dim]`` by default), so
    autograd sums the weight gradient over the TP group. The output is returned local.
    """

    # A SequenceParallel with the heads dim as its "sequence": reads and leaves this rank's heads.
    facts = StyleFacts("grad_reduce", replicates=True, replicate_dtensor=True, hooks=SEQUENCE_HOOKS)

    def fit_problem(self, module: nn.Module) -> str | None:
        return own_parameters_problem(self, module)

    def __init__(self, *, sequence_dim: int = 2, use_local_output: bool = True) -> None:
        super().__init__(sequence_dim=sequence_dim, use_local_output=use_local_output)


def _all_reduce_grad(tensor: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
    """Identity in forward; in backward, the gradient is summed over ``device_mesh``.

    Labelling the gradient ``Partial`` makes ``from_local``'s backward redistribute it to the
    forward's ``Replicate`` (an all-reduce), with no division: DTensor's documented guarantee.
    """
    replicated = DTensor.from_local(tensor, device_mesh, (Replicate(),), run_check=False)
    return replicated.to_local(grad_placements=(Partial(),))


class AllReduceParamGrads(PlangenStyle):
    """Replicated parameters used on rank-local data: the forward is untouched, parameter grads are summed.

    transformers' ``replicated_with_grad_allreduce``: a norm between a colwise and a rowwise layer
    (Qwen3's per-head ``q_norm``) sees only this rank's heads, so each rank's weight gradient covers
    its heads only and the true gradient is their sum. The parameters stay plain tensors, identical on
    every rank, and the module's forward runs on local tensors whatever the input layout is (unlike
    :class:`ReplicatedWithGradAllReduce`, which assumes the heads dimension). During the forward each
    own parameter is swapped for an identity view whose backward all-reduces the gradient, so the
    summed gradient lands in ``param.grad`` before any optimizer or FSDP reduce-scatter reads it.
    """

    facts = StyleFacts("grad_reduce", replicates=True)

    def fit_problem(self, module: nn.Module) -> str | None:
        return own_parameters_problem(self, module)

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

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled() and not as_dtensor:
            return
        for name, param in list(mod._parameters.items()):
            if param is None or (not param.requires_grad and not as_dtensor):
                continue
            local = param.to_local() if isinstance(param, DTensor) else param
            view = (
                DTensor.from_local(local, device_mesh, (Replicate(),), run_check=False)
                if as_dtensor
                else _all_reduce_grad(local, device_mesh)
            )
            params.replace(mod, name, view)

    run_on_local_tensors(module, swap_in)


class SequenceParallelOwnParameters(AllReduceParamGrads):
    """A module's own parameters applied to the sequence-sharded residual stream (a ``Shard(1)``
    DTensor under sequence parallelism): Doge's layer scales, ``input_residual * residual``.

    Its children are left to their own styles. During the forward each own parameter is a
    ``Replicate`` DTensor made from the plain, identical-on-every-rank parameter, so it meets the
    residual as DTensor arithmetic; each rank's gradient covers its sequence shard only, and
    ``from_local``'s backward redistributes that ``Partial`` gradient to ``Replicate`` (the sum over
    TP) before it lands in ``param.grad``. The parameters stay plain tensors for FSDP2 and state dicts.
    """

    facts = StyleFacts("grad_reduce", replicates=True)

    as_dtensor = True


class LeaveUnsharded(PlangenStyle):
    """Apply nothing: every TP rank keeps the full parameters and runs the module as is.

    transformers' ``replicate`` (5.x): a rule that exists so that a module keeps no other rule, e.g.
    ``embed_tokens`` where transformers would otherwise add ``embedding_rowwise``.
    """

    facts = StyleFacts("none", replicates=True)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

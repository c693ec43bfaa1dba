"""Gemma 3n's activation sparsity, sharded with the MLP: the gate's statistics reduced over TP.

Gemma 3n's first MLPs (``activation_sparsity_pattern``) keep only the gate activations above a
cutoff set by the activations' own mean and standard deviation over the intermediate width
(``_gaussian_topk``: ``relu(x - (mean + std * Φ⁻¹(sparsity)))``). Under a column-parallel
``gate_proj`` each TP rank holds a slice of that width, so the module's own statistics would be
its slice's: no error, other activations kept (logits off by 0.12 on the tiny model).
:class:`ActivationSparsityParallel` prepares the MLP's input as ``PrepareModuleInput`` does and,
on MLPs whose ``activation_sparsity`` is above zero, computes the same two statistics over the
whole width: the sum, then the sum of squared deviations from the whole mean (two passes, as
``torch.std``), each one all-reduce of B·S values (their gradients all-reduced too, as every rank
used the sums). MLPs without sparsity are left as ``PrepareModuleInput`` leaves them.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import PrepareModuleInput

from plangen.styles.tp_sums import sum_over_tp
from plangen.plan.style_facts import PREPARE_INPUT, StyleFacts
from plangen.styles.base import PlangenStyle


class ActivationSparsityParallel(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` for an MLP whose forward keeps the gate's Gaussian top-k
    (``_gaussian_topk``): its mean and standard deviation taken over every rank's slice."""

    # An MLP's input; where it keeps the gate's Gaussian top-k, the statistics over every rank's slice.
    facts = StyleFacts("prepare_input", hooks=PREPARE_INPUT)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        sparsity = getattr(module, "activation_sparsity", 0.0)
        if sparsity > 0.0:
            if not callable(getattr(module, "_gaussian_topk", None)):
                raise ValueError(
                    f"ActivationSparsityParallel: {type(module).__name__} has no _gaussian_topk to distribute"
                )
            width = module.gate_proj.out_features
            module._gaussian_topk = partial(gaussian_topk_over_tp, sparsity, width, device_mesh)
        return super()._apply(module, device_mesh)


def gaussian_topk_over_tp(sparsity: float, width: int, mesh: DeviceMesh, inputs: torch.Tensor) -> torch.Tensor:
    """Gemma 3n's ``_gaussian_topk`` of this rank's slice ``inputs`` of ``width`` features."""
    target = torch.tensor(sparsity, dtype=torch.float32, device=inputs.device)
    std_multiplier = torch.distributions.normal.Normal(0, 1).icdf(target).type(inputs.dtype)
    mean = sum_over_tp(inputs.sum(dim=-1, keepdim=True), mesh) / width
    variance = sum_over_tp(((inputs - mean) ** 2).sum(dim=-1, keepdim=True), mesh) / width
    cutoff = mean + variance.sqrt() * std_multiplier
    return nn.functional.relu(inputs - cutoff)

"""Multi-head latent attention (MLA: DeepSeek-V2/V3 and the classes that copy their attention).

MLA compresses the block input into small latents shared by every head and expands them per head::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))        (or q_proj(x) without q_lora_rank)
    kv, kr = split(kv_a_proj_with_mqa(x), [kv_lora_rank, qk_rope_head_dim])
    k, v   = kv_b_proj(kv_a_layernorm(kv)) per head;  every head's key ends with the one rope key kr
    out    = o_proj(attention(q, [k, kr], v))

Sharded by heads, the down-projections and their norms stay whole on every rank (small, shared by
all heads), the up-projections are column-parallel, ``o_proj`` row-parallel. Column-parallel
up-projections already sum their input gradient over TP; the rope key ``kr`` reaches the heads
without one, so each rank's gradient of it covers its own heads only and must be summed:
:class:`MlaKvAProjParallel` does that on ``kv_a_proj_with_mqa``'s output, given the rope width.

Where the query latent is a large share of the model (Youtu: 5.1 %, the rule in
:func:`plangen.plans.families.latent.shards_query_latent`), it is sharded too: ``q_a_proj`` column-parallel
(each rank computes its slice of the latent), ``q_a_layernorm`` over the whole latent with its
statistics summed over TP (:class:`~plangen.styles.norms.ShardedNormParallel`), the latent
all-gathered into a column-parallel ``q_b_proj`` (its gradient reduce-scattered back). ``q_a_proj``'s
input gradient is then a partial sum over TP: ``MlaAttentionParallel(sharded_query_latent=True)``
leaves it partial, counts ``kv_a_proj_with_mqa``'s (whole on every rank) on the first rank only, and
reduces the block input's gradient once, an all-reduce of B·S·H, or under sequence parallel the
reduce-scatter that is its all-gather's backward (where ``q_a_proj`` reducing its own would add an
all-reduce of B·S·H to the gather's free slice).

A plan file must not carry the width: ``plangen verify --run`` checks the file on a shrunk model
whose rope width differs, and a runtime that only calls ``parallelize_module`` (NeMo RL) would apply
a wrong number silently. :class:`MlaAttentionParallel` is applied on the attention module instead,
where the width is a fact of the module's own shapes (``kv_a_proj_with_mqa`` gives
``kv_lora_rank + rope`` features, ``kv_b_proj`` reads ``kv_lora_rank``); it also prepares the
block input, as ``PrepareModuleInput``, so the plan has one entry per attention module.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import PrepareModuleInput

from plangen.stack import torch_compat as compat
from plangen.styles.tp_sums import all_reduce_grad, grad_once_pre_hook
from plangen.plan.style_facts import PREPARE_INPUT, StyleFacts
from plangen.styles.base import PlangenStyle, linear_only_problem

# transformers' names of MLA's latent projections (every MLA class in transformers 5.x).
LATENT_KV_PROJ = "kv_a_proj_with_mqa"
KV_UP_PROJ = "kv_b_proj"
QUERY_DOWN_PROJ = "q_a_proj"


def _all_reduce_rope_grad(rope_dim: int, device_mesh: DeviceMesh, mod: nn.Module, inputs, output):
    if not torch.is_grad_enabled() or rope_dim == 0:
        return output
    passthrough, rope = output.split([output.shape[-1] - rope_dim, rope_dim], dim=-1)
    return torch.cat([passthrough, all_reduce_grad(rope, device_mesh)], dim=-1)


class MlaKvAProjParallel(PlangenStyle):
    """Multi-head latent attention's ``kv_a_proj_with_mqa``: all-reduce the gradient of its rope tail.

    transformers' ``mla_kv_a_proj``. The output is ``[kv_lora_rank + rope_dim]``; the first part
    feeds ``kv_b_proj`` (colwise, whose input gradient DTensor already all-reduces), the last
    ``rope_dim`` features go straight to the rank-local attention heads, so their gradient is partial
    per rank and must be summed. Forward unchanged; parameters stay replicated plain tensors.
    ``rope_dim`` is a model size: plan files use :class:`MlaAttentionParallel`, which reads it.
    """

    facts = StyleFacts("other", replicates=True)

    def fit_problem(self, module: nn.Module) -> str | None:
        return linear_only_problem(self, module)

    def __init__(self, *, rope_dim: int) -> None:
        super().__init__()
        self.rope_dim = rope_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module.register_forward_hook(partial(_all_reduce_rope_grad, self.rope_dim, device_mesh))
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rope_dim={self.rope_dim})"


def rope_width(attention: nn.Module) -> int:
    """The width of MLA's shared rope key, from the attention module's own shapes."""
    latent, up = getattr(attention, LATENT_KV_PROJ, None), getattr(attention, KV_UP_PROJ, None)
    if not isinstance(latent, nn.Linear) or not isinstance(up, nn.Linear):
        raise ValueError(
            f"MlaAttentionParallel: {type(attention).__name__} has no nn.Linear {LATENT_KV_PROJ} and "
            f"{KV_UP_PROJ}: apply it on a multi-head latent attention module"
        )
    width = latent.out_features - up.in_features
    expected = getattr(attention, "qk_rope_head_dim", width)
    if width < 0 or width != expected:
        raise ValueError(
            f"MlaAttentionParallel: {type(attention).__name__}.{LATENT_KV_PROJ} gives {latent.out_features} "
            f"features and {KV_UP_PROJ} reads {up.in_features}: no rope key of width {expected} between them"
        )
    return width


class MlaAttentionParallel(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` for a multi-head latent attention module, which also sums over TP the
    gradient of its shared rope key (see the module docstring).

    Takes ``PrepareModuleInput``'s arguments (the block input made whole and local for the
    replicated down-projections: ``use_local_output=True``). When applied, it reads the rope width
    from the module (:func:`rope_width`) and hooks ``kv_a_proj_with_mqa`` as
    :class:`MlaKvAProjParallel` would: the plan file names no model size.

    ``sharded_query_latent=True``: ``q_a_proj`` is column-parallel (the plan's entry for it), so its
    input gradient is a partial sum over TP; it is left partial, ``kv_a_proj_with_mqa``'s input
    gradient (whole on every rank) counts on the first rank only, and the block input's gradient is
    reduced once here (the module docstring).
    """

    # PrepareModuleInput on a latent-attention module (it also hooks kv_a_proj_with_mqa's rope grad).
    facts = StyleFacts("prepare_input", hooks=PREPARE_INPUT)

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_output: bool = True,
        sharded_query_latent: bool = False,
    ) -> None:
        # The layouts are PrepareModuleInput's, passed on (its annotations are the contract).
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )
        self.sharded_query_latent = sharded_query_latent
        if sharded_query_latent:
            desired = [*(self.desired_input_layouts or ()), *(self.desired_input_kwarg_layouts or {}).values()]
            if not use_local_output or not all(layout is None or isinstance(layout, Replicate) for layout in desired):
                raise ValueError(
                    "MlaAttentionParallel(sharded_query_latent=True): the down-projections read the block "
                    "input whole and local (desired layouts Replicate(), use_local_output=True)"
                )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        MlaKvAProjParallel(rope_dim=rope_width(module))._apply(getattr(module, LATENT_KV_PROJ), device_mesh)
        if self.sharded_query_latent:
            _leave_query_input_grad_partial(module, device_mesh)
        return super()._apply(module, device_mesh)

    def _prepare_input_arg(self, input: Any, mesh: DeviceMesh, input_layout: Any, desired_layout: Any) -> Any:
        if not self.sharded_query_latent or input_layout is None:
            return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)
        # PrepareModuleInput's, the local gradient taken as a partial sum: reduced to the input's
        # layout by the backward of this redistribution (all-reduce; reduce-scatter from Replicate to SP).
        whole = (
            input if isinstance(input, DTensor) else DTensor.from_local(input, mesh, (input_layout,), run_check=False)
        )
        if desired_layout is not None and input_layout != desired_layout:
            whole = whole.redistribute(placements=(desired_layout,))
        return whole.to_local(grad_placements=(Partial(),))


def _leave_query_input_grad_partial(attention: nn.Module, device_mesh: DeviceMesh) -> None:
    """``q_a_proj``'s local input handed on as a Replicate DTensor whose gradient stays partial (its
    column-parallel style then neither converts it nor reduces it); ``kv_a_proj_with_mqa``'s whole
    input gradient counted on the first rank only."""
    query = getattr(attention, QUERY_DOWN_PROJ, None)
    if not isinstance(query, nn.Linear):
        raise ValueError(
            f"MlaAttentionParallel(sharded_query_latent=True): {type(attention).__name__} has no nn.Linear "
            f"{QUERY_DOWN_PROJ} (a query latent)"
        )

    def partial_grad_input(mod: nn.Module, args: tuple) -> tuple:
        if not isinstance(mod.weight, DTensor):
            raise ValueError(
                f"MlaAttentionParallel(sharded_query_latent=True): {QUERY_DOWN_PROJ} is not sharded; give it "
                "ColwiseParallel (its input gradient is left partial for the block to reduce once)"
            )
        x, *rest = args
        if isinstance(x, DTensor):
            return args
        return (compat.from_local(x, device_mesh, (Replicate(),), run_check=False, grad_placements=(Partial(),)), *rest)

    # Prepended: before the column-parallel style's own input hook, whatever order the plan applies them in.
    query.register_forward_pre_hook(partial_grad_input, prepend=True)
    getattr(attention, LATENT_KV_PROJ).register_forward_pre_hook(grad_once_pre_hook(device_mesh))

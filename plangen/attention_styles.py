"""Attention styles: parameters of an attention block that belong to its heads.

gpt-oss's attention keeps one learned ``sinks`` logit per query head as a parameter of the
attention module itself (``[num_heads]``), read inside the attention function
(``module.sinks`` in eager attention, ``s_aux=self.sinks`` for the flex / flash kernels). Once q/k/v
are column-parallel each TP rank computes only its own heads, so it needs only its heads' sinks:
:class:`AttentionSinksParallel` shards them ``Shard(0)`` with the heads.

Why a style on the attention block and not on the parameter: ``parallelize_module`` applies styles to
modules, one per module, and the block already has one (``PrepareModuleInput``: the block's input
enters once, as one ``Replicate`` DTensor, for q/k/v). So this style *is* that ``PrepareModuleInput``
(same arguments, same input handling) and also shards the block's own parameters.

Why the sinks' gradient is exact with no communication: attention is independent per head, every
rank sees the whole (replicated) input, so rank r's local heads compute exactly the unsharded
model's values for those heads and the gradient of its sinks slice is exactly theirs. The
parameter is a ``Shard(0)`` DTensor, so FSDP2 composes with it like a column-parallel bias and a
full state dict gathers back the Hugging Face ``[num_heads]`` tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput


class AttentionSinksParallel(PrepareModuleInput):
    """``PrepareModuleInput`` for an attention block whose own parameters are per head (gpt-oss's
    ``sinks``): they are sharded ``Shard(0)`` with the heads, and the block's forward sees the local
    slice (the DTensor parameter is swapped for its local view during the forward and put back
    after, so FSDP2, optimizers and state dicts see the ``Shard(0)`` DTensor).

    The arguments are ``PrepareModuleInput``'s. Applied at TP size ``tp``, every parameter the block
    owns directly (not its projections') must have a first dimension divisible by ``tp``.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        own = head_parameters(module)
        if not own:
            raise ValueError(f"AttentionSinksParallel: {type(module).__name__} has no parameters of its own to shard by heads")
        shard_by_heads(module, own, device_mesh, type(self).__name__)
        local_during_forward(module, [(module, name) for name in own])
        return super()._apply(module, device_mesh)


def shard_by_heads(module: nn.Module, params: dict[str, torch.Tensor], device_mesh: DeviceMesh, style: str) -> None:
    """Each of ``module``'s ``params`` (one value per head on dim 0) becomes a ``Shard(0)`` DTensor."""
    tp = device_mesh.size()
    for name, param in params.items():
        if param.shape[0] % tp:
            raise ValueError(
                f"{style}: {type(module).__name__}.{name} has {param.shape[0]} heads, which TP size {tp} does not divide"
            )
        sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
        module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


def local_during_forward(owner: nn.Module, params: list[tuple[nn.Module, str]]) -> None:
    """During ``owner``'s forward each ``(module, name)`` DTensor parameter is its local view.

    The forward reads them directly (``self.sinks``, ``self.conv1d.weight``) alongside local tensors;
    the DTensor is put back after, so FSDP2, optimizers and state dicts see it. ``to_local``'s
    backward hands the gradient back as the DTensor's placements (this rank's heads: exact).
    """
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []

    def swap_in(mod: nn.Module, args: Any) -> None:
        for module, name in params:
            param = module._parameters.get(name)
            if isinstance(param, DTensor):
                swapped.append((module, name, param))
                module._parameters[name] = param.to_local()  # type: ignore[assignment]

    def put_back(mod: nn.Module, args: Any, output: Any) -> None:
        for module, name, param in swapped:
            module._parameters[name] = param
        swapped.clear()

    owner.register_forward_pre_hook(swap_in)
    # always_call: an exception inside forward must not leave local views in place of the parameters.
    owner.register_forward_hook(put_back, always_call=True)


def head_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters ``module`` owns itself, with at least one dimension (gpt-oss's ``sinks``)."""
    return {n: p for n, p in module.named_parameters(recurse=False) if p.dim() >= 1}


class PairedHeadsAttentionInput(PrepareModuleInput):
    """``PrepareModuleInput`` for differential attention (DiffLlama): head ``i`` is paired with head
    ``i + H/2`` (the forward chunks the heads in two halves, and values likewise), and the block's own
    parameters (``lambda_q1`` ... ``[head_dim]``) are reduced to one scalar shared by every head.

    The block's q/k/v are column-parallel in a two-part layout (``FusedColwiseParallel(part_sizes=(1, 1))``:
    rank ``r`` holds the ``r``-th slice of each half), so its local heads are whole pairs, in the
    forward's own order; the pairs' output is then contiguous per rank, so ``o_proj`` is a plain
    row-parallel. The own parameters stay replicated: each rank's gradient covers only its pairs, so it
    is summed over TP during the backward. Refused where the TP size does not split each half's query
    and key/value heads (a rank would hold half a pair).
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.kv_styles import attention_head_counts
        from plangen.replicated_styles import sum_own_grads_over

        tp = device_mesh.size()
        counts = attention_head_counts(module)
        if counts is None:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__} has no config with head counts to pair")
        heads, kv_heads, _ = counts
        bad = [(what, n) for what, n in (("attention heads", heads), ("key/value heads", kv_heads)) if n % (2 * tp)]
        if bad:
            what, n = bad[0]
            raise ValueError(
                f"{type(self).__name__}: {type(module).__name__} pairs head i with i + H/2, so each half's heads "
                f"split over TP: {n} {what} need a multiple of 2 x TP size {tp}"
            )
        sum_own_grads_over(module, device_mesh)
        return super()._apply(module, device_mesh)


def depthwise_conv(module: nn.Module) -> nn.Conv1d | None:
    """The one depthwise ``nn.Conv1d`` at or below ``module`` (a short convolution's), else None."""
    convs = [c for c in module.modules() if isinstance(c, nn.Conv1d)]
    if len(convs) != 1 or not (convs[0].in_channels == convs[0].out_channels == convs[0].groups):
        return None
    return convs[0]


def short_conv_only(module: nn.Module) -> nn.Conv1d | None:
    """The depthwise ``nn.Conv1d`` below ``module`` where its parameters are all ``module`` has (a
    short convolution, Inkling's ``InklingShortConvolution``), else None."""
    conv = depthwise_conv(module) if not isinstance(module, nn.Conv1d) else None
    if conv is None or sum(1 for _ in module.parameters()) != sum(1 for _ in conv.parameters()):
        return None
    return conv


class ConvChannelsParallel(ParallelStyle):
    """A short convolution inside attention, over a column-parallel projection's heads (Inkling's
    ``k_sconv`` / ``v_sconv``, a depthwise ``nn.Conv1d`` along the sequence on k and on v): its
    channels are split with their heads (``Shard(0)``: rank r's channels are its heads' rows of the
    projection it follows), and it convolves this rank's local channels.

    Depthwise means per channel: each rank computes exactly its channels' values, the weight's
    gradient is exactly its channels' and the input's needs no sum. The forward reads the conv's
    weight directly (``causal_conv1d_fn(x, self.conv1d.weight.squeeze(1))``), so the weight is its
    local view during the forward; the conv's channel counts are made this rank's."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        conv, tp = depthwise_conv(module), device_mesh.size()
        if conv is None:
            raise ValueError(f"{type(self).__name__} applies to a module around one depthwise nn.Conv1d; "
                             f"{type(module).__name__} has none")
        if conv.in_channels % tp:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__}'s {conv.in_channels} conv channels do not "
                             f"divide by the TP size {tp}")
        for name, param in list(conv.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
            conv.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        conv.in_channels = conv.out_channels = conv.groups = conv.in_channels // tp
        local_during_forward(module, [(conv, name) for name, _ in conv.named_parameters(recurse=False)])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

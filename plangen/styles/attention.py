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

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput
from plangen.plan.style_facts import HEADS, HEAD_TABLE, PREPARE_INPUT, PREPARE_INPUT_OUTPUT, SHORT_CONV, StyleFacts
from plangen.model.module_facts import attention_head_counts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle, head_count_dims

# Set on a child whose head counts RebuiltChildHeadCounts made this rank's.
_LOCAL_MARK = "_plangen_local_head_counts"


class AttentionSinksParallel(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` for an attention block whose own parameters are per head (gpt-oss's
    ``sinks``): they are sharded ``Shard(0)`` with the heads, and the block's forward sees the local
    slice (the DTensor parameter is swapped for its local view during the forward and put back
    after, so FSDP2, optimizers and state dicts see the ``Shard(0)`` DTensor).

    The arguments are ``PrepareModuleInput``'s. Applied at TP size ``tp``, every parameter the block
    owns directly (not its projections') must have a first dimension divisible by ``tp``.
    """

    # PrepareModuleInput of an attention block that also splits its own [heads] parameters (sinks).
    facts = StyleFacts("prepare_input", shard_dim={HEADS: 0}, hooks=PREPARE_INPUT)

    def fit_problem(self, module: nn.Module) -> str | None:
        if head_parameters(module):
            return None
        return (
            f"`{type(self).__name__}` splits a block's own per-head parameters (gpt-oss's sinks) with its heads,"
            f" but {type(module).__name__} has no parameters of its own: use PrepareModuleInput"
        )

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        # Whole heads' parameters per rank.
        return [(name, param.shape[0], 1) for name, param in head_parameters(module).items()]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        own = head_parameters(module)
        if not own:
            raise ValueError(
                f"AttentionSinksParallel: {type(module).__name__} has no parameters of its own to shard by heads"
            )
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

    def enter(swapped: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> None:
        for module, name in params:
            swapped.local_views(module, (name,))

    run_on_local_tensors(owner, enter)


def head_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters ``module`` owns itself, with at least one dimension (gpt-oss's ``sinks``)."""
    return {n: p for n, p in module.named_parameters(recurse=False) if p.dim() >= 1}


class PairedHeadsAttentionInput(PrepareModuleInput, PlangenStyle):
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

    # PrepareModuleInput of differential attention (heads paired i, i + H/2): its own parameters,
    # shared by every head, replicated with their gradient summed over TP.
    facts = StyleFacts("prepare_input", replicates=True, hooks=PREPARE_INPUT)

    def fit_problem(self, module: nn.Module) -> str | None:
        if attention_head_counts(module) is None:
            return (
                f"`{type(self).__name__}` keeps head pairs whole per rank, but {type(module).__name__} has no config"
                " with head counts to pair"
            )
        return None

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        counts = attention_head_counts(module)
        if counts is None:
            return super().required_dims(module, tp)
        return [("attention heads", counts[0], 2), ("key/value heads", counts[1], 2)]  # each half's, whole pairs

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.model.module_facts import attention_head_counts
        from plangen.styles.replicated import sum_own_grads_over

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


class RebuiltChildHeadCounts(PlangenStyle):
    """:class:`~plangen.styles.fused.LocalHeadCounts` for a child its parent rebuilds between forwards.

    BigBird's attention swaps its ``self`` child between block-sparse and full attention (the model's
    forward calls ``set_attention_type("original_full")`` for sequences too short for block-sparse),
    building the new child from the config with all heads' counts and moving the (column-parallel)
    q/k/v projections into it. Counts made local once, when the plan is applied, would be lost with the
    old child, so the parent's forward pre-hook makes them this rank's on the child it holds, once per
    child object: each of ``attributes`` the child has is divided by the TP size.

    ``refused_in_training`` names child classes that cannot follow a split by heads in training:
    BigBird's block-sparse attention seeds numpy with the layer index and then draws each head's
    random key blocks in turn, so a rank holding heads H/2.. would draw heads 0..'s blocks. A forward
    through one of them in training mode is refused with that reason (in eval its random blocks are a
    constant, the same for every head, so each rank's heads are exact).
    """

    # The same on a child its parent rebuilds (BigBird's attention.self), from the parent's pre-hook.
    facts = StyleFacts("other")

    def __init__(
        self, *, child: str = "self", attributes: tuple[str, ...] = (), refused_in_training: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self.child = child
        self.attributes = tuple(attributes)
        self.refused_in_training = tuple(refused_in_training)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp, style = device_mesh.size(), type(self).__name__
        child_name, attributes, refused = self.child, self.attributes, self.refused_in_training

        def make_local(child: nn.Module) -> None:
            # A mark on the child itself (not its id: a rebuilt child may reuse a freed one's).
            if child.__dict__.get(_LOCAL_MARK):
                return
            for attribute in attributes:
                value = getattr(child, attribute, None)
                if value is None:
                    continue
                if not isinstance(value, int) or value % tp:
                    raise ValueError(
                        f"{style}: {type(child).__name__}.{attribute}={value!r} does not divide by the TP size {tp}"
                    )
                setattr(child, attribute, value // tp)
            child.__dict__[_LOCAL_MARK] = True

        def before_forward(mod: nn.Module, args: Any) -> None:
            child = getattr(mod, child_name)
            if mod.training and type(child).__name__ in refused:
                raise ValueError(
                    f"{style}: {type(child).__name__} draws each head's random key blocks from one seeded stream, "
                    f"so a rank holding some of the heads would draw the first heads' blocks: train at TP {tp} with "
                    "full attention (attention_type='original_full') or sequences short enough for it"
                )
            make_local(child)

        make_local(getattr(module, child_name))  # a missing child fails when the plan is applied
        module.register_forward_pre_hook(before_forward)
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(child={self.child!r}, attributes={self.attributes}, "
            f"refused_in_training={self.refused_in_training})"
        )


class PrepareAttentionInputOutput(PrepareModuleInputOutput, PlangenStyle):
    """``PrepareModuleInputOutput`` for an attention block that also shapes by its head counts.

    ProphetNet's n-gram self-attention unpacks its width from its input (``hidden_size =
    hidden_states.size()[-1]``) and reshapes by it both before and after its output projection
    (``.view(batch_size, -1, hidden_size)`` of ``out_proj``'s output): it is handed this rank's slice
    of the hidden dimension (each column-parallel projection all-gathers it), its ``out_proj`` output
    is reduce-scattered to the same slice, and the block's output gathered back here. Its
    ``head_attributes`` (``num_attn_heads``) are divided by the TP size, as
    :class:`~plangen.styles.fused.LocalHeadCounts` does (one style per module: this one carries it).
    ``head_inputs`` names keyword arguments with one slice per head on dimension 1, built for all
    heads outside the block (ProphetNet's decoder expands its causal masks to every head): the block
    gets this rank's heads' slice (one of size 1, broadcast over the heads, is left as it is).
    The other arguments are ``PrepareModuleInputOutput``'s.
    """

    # PrepareModuleInputOutput on attention whose head counts it also makes local (ProphetNet's n-gram one).
    facts = StyleFacts("gather_output", hooks=PREPARE_INPUT_OUTPUT)

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        return head_count_dims(module, self.head_attributes) or super().required_dims(module, tp)

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_input: bool = False,
        output_layouts: Any,
        desired_output_layouts: Any,
        use_local_output: bool = True,
        head_attributes: tuple[str, ...] = (),
        head_inputs: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_input=use_local_input,
            output_layouts=output_layouts,
            desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output,
        )
        self.head_attributes = tuple(head_attributes)
        self.head_inputs = tuple(head_inputs)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.fused import LocalHeadCounts

        LocalHeadCounts(attributes=self.head_attributes)._apply(module, device_mesh)
        if self.head_inputs:
            module.register_forward_pre_hook(
                partial(_slice_head_inputs, self.head_inputs, device_mesh), with_kwargs=True
            )
        return super()._apply(module, device_mesh)


def _slice_head_inputs(
    names: tuple[str, ...], device_mesh: DeviceMesh, module: nn.Module, args: Any, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """This rank's heads' slice (dimension 1) of each tensor argument in ``names`` that has one per head,
    passed by keyword or by position (Phi-4-multimodal's conformer: ``self_attn(hidden_states, attention_mask)``)."""
    tp, rank = device_mesh.size(), device_mesh.get_local_rank()

    def cut(name: str, value: torch.Tensor) -> torch.Tensor:
        if value.dim() < 2 or value.shape[1] == 1:
            return value
        if value.shape[1] % tp:
            raise ValueError(
                f"PrepareAttentionInputOutput: {name} has {value.shape[1]} heads, which TP size {tp} does not divide"
            )
        local = value.shape[1] // tp
        return value.narrow(1, rank * local, local)

    return replace_arguments(module, names, args, kwargs, cut)


def slice_batch_head_rows(
    names: tuple[str, ...], heads: int, device_mesh: DeviceMesh, module: nn.Module, args: Any, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """This rank's heads' rows of each tensor argument in ``names`` that stacks every batch row's
    ``heads`` heads on dimension 0, batch row by batch row (Bloom's ALiBi, ``[B x H, 1, S]``):
    ``[B x H/tp, 1, S]``, the rows of heads ``rank x H/tp`` to ``(rank + 1) x H/tp - 1`` of every batch row."""
    tp, rank = device_mesh.size(), device_mesh.get_local_rank()
    local = heads // tp

    def cut(name: str, value: torch.Tensor) -> torch.Tensor:
        if value.dim() < 1 or value.shape[0] % heads:
            raise ValueError(
                f"PrepareAttentionInput: {name} has {value.shape[0]} rows, not a batch of {heads} heads each"
            )
        rows = value.unflatten(0, (-1, heads)).narrow(1, rank * local, local)
        return rows.flatten(0, 1)

    return replace_arguments(module, names, args, kwargs, cut)


def replace_arguments(
    module: nn.Module, names: tuple[str, ...], args: Any, kwargs: dict[str, Any], cut: Any
) -> tuple[Any, dict[str, Any]]:
    """``cut(name, value)`` in place of each tensor argument of ``module``'s forward named in ``names``,
    passed by keyword or by position."""
    import inspect

    positions = list(inspect.signature(module.forward).parameters)
    args = list(args)
    for name in names:
        at = positions.index(name) if name not in kwargs and name in positions else None
        value = kwargs.get(name) if at is None else (args[at] if at < len(args) else None)
        if not isinstance(value, torch.Tensor):
            continue
        if at is None:
            kwargs[name] = cut(name, value)
        else:
            args[at] = cut(name, value)
    return tuple(args), kwargs


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


class ConvChannelsParallel(PlangenStyle):
    """A short convolution inside attention, over a column-parallel projection's heads (Inkling's
    ``k_sconv`` / ``v_sconv``, a depthwise ``nn.Conv1d`` along the sequence on k and on v): its
    channels are split with their heads (``Shard(0)``: rank r's channels are its heads' rows of the
    projection it follows), and it convolves this rank's local channels.

    Depthwise means per channel: each rank computes exactly its channels' values, the weight's
    gradient is exactly its channels' and the input's needs no sum. The forward reads the conv's
    weight directly (``causal_conv1d_fn(x, self.conv1d.weight.squeeze(1))``), so the weight is its
    local view during the forward; the conv's channel counts are made this rank's."""

    # A short conv over a column-parallel projection's heads: its channels split with them.
    facts = StyleFacts("other", shard_dim={SHORT_CONV: 0})

    def fit_problem(self, module: nn.Module) -> str | None:
        if depthwise_conv(module):
            return None
        return (
            f"`{type(self).__name__}` splits a module around one depthwise nn.Conv1d by its channels,"
            f" not {type(module).__name__}"
        )

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        conv = depthwise_conv(module)
        if not conv:
            return super().required_dims(module, tp)
        return [("conv channels", conv.in_channels, 1)]  # local channels, plain tensors in the forward

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        conv, tp = depthwise_conv(module), device_mesh.size()
        if conv is None:
            raise ValueError(
                f"{type(self).__name__} applies to a module around one depthwise nn.Conv1d; "
                f"{type(module).__name__} has none"
            )
        if conv.in_channels % tp:
            raise ValueError(
                f"{type(self).__name__}: {type(module).__name__}'s {conv.in_channels} conv channels do not "
                f"divide by the TP size {tp}"
            )
        for name, param in list(conv.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
            conv.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        conv.in_channels = conv.out_channels = conv.groups = conv.in_channels // tp
        local_during_forward(module, [(conv, name) for name, _ in conv.named_parameters(recurse=False)])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class HeadTableParallel(PlangenStyle):
    """A table with one column per attention head that its module looks up itself (CpmAnt's
    ``CpmAntSegmentPositionEmbedding.relative_attention_bias``, ``[buckets, heads]``): sharded
    ``Shard(1)`` with the heads, so the module's forward (run on the local columns) computes the
    bias of this rank's heads only, which the model then hands every layer's sharded attention.

    Exact with no communication: each head's bias is its own column, and the attention of the
    ranks' heads reads only theirs, so each rank's columns get exactly their gradient.
    """

    # A [buckets, heads] table its module looks up itself, split by its head columns (CpmAnt's position bias).
    facts = StyleFacts("other", shard_dim={HEAD_TABLE: 1})

    def fit_problem(self, module: nn.Module) -> str | None:
        table = getattr(module, self.parameter, None)
        if isinstance(table, nn.Parameter) and table.dim() == 2:
            return None
        return (
            f"`{type(self).__name__}` splits a [buckets, heads] table `{self.parameter}` by its head columns,"
            f" not {type(module).__name__}"
        )

    def __init__(self, *, parameter: str = "relative_attention_bias") -> None:
        super().__init__()
        self.parameter = parameter

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        param = module._parameters.get(self.parameter)
        tp = device_mesh.size()
        if param is None or param.dim() != 2 or param.shape[1] % tp:
            shape = None if param is None else tuple(param.shape)
            raise ValueError(
                f"HeadTableParallel: {type(module).__name__}.{self.parameter} is {shape}, not a "
                f"[buckets, heads] table whose heads TP size {tp} divides"
            )
        sharded = distribute_tensor(param.data, device_mesh, [Shard(1)], src_data_rank=None)
        module.register_parameter(self.parameter, nn.Parameter(sharded, requires_grad=param.requires_grad))
        local_during_forward(module, [(module, self.parameter)])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(parameter={self.parameter!r})"

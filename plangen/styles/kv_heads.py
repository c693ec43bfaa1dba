"""KV heads replicated where the TP size exceeds them: Megatron's layout for grouped-query attention.

Column-parallel k/v projections give each TP rank ``kv_heads / tp`` whole KV heads, so they need the
TP size to divide the KV head count: Gemma-3-1B (1 KV head) could not take TP 2. Megatron instead
lets the TP size be a multiple of the KV head count: the query heads split as before, and each rank
computes the one KV head its own query heads use (query head ``h`` reads KV head
``h // (heads / kv_heads)``, so rank ``r`` of ``tp`` needs KV head ``r // (tp / kv_heads)``).

Two styles, both size-independent (plan files name no head count; they are read from the attention
module when the plan is applied, so one plan serves every TP size and every model of a class):

* :class:`PrepareAttentionInput` on the attention block: ``PrepareModuleInput``, and where the TP
  size exceeds the KV heads it sets the block's ``num_key_value_groups`` to its local query heads
  (one local KV head serves them all) and tells the block's k/v projections which KV head rows this
  rank computes. It must come before them in the plan (``parallelize_module`` applies keys in order;
  a parent key before its children, as every plangen plan writes it).
* :class:`KVHeadsColwiseParallel` on ``k_proj``/``v_proj``: plain ``ColwiseParallel`` where the KV
  heads split over TP; otherwise the weight (and bias) stay whole, ``Replicate()`` DTensors (FSDP2
  shards them over DP like any other; the full state dict is the Hugging Face weight), each rank
  runs the projection on its KV head's rows only, and the weight gradient, which covers only those
  rows and only this rank's query heads, is summed over TP: exact, as every rank sharing a KV head
  adds its query heads' part.

Why a replicated weight sliced locally rather than a weight sharded over KV groups with repetition
(a ``[tp * head_dim, hidden]`` parameter): the repeated one is smaller per rank only by the KV heads
a rank does not use (none at 1 KV head), needs its gradient summed over the ranks of each group (a
process group per group), and its full tensor is not the checkpoint's, so every state dict, DCP
checkpoint and NeMo RL weight sync would need a translation; DTensor cannot describe "replicated
within a group, sharded across groups" on the 1-D TP mesh. ``plangen cost`` reports the memory this
costs (the replicated KV weights, sharded over DP) against the ideal.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput

from plangen.model.module_facts import attention_head_counts
from plangen.plan.style_facts import LINEAR, MODULE_HOOKS, PREPARE_INPUT, REPLICATE, SHARD_LAST, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle, head_count_dims

# Set on a k/v projection by PrepareAttentionInput: (first row, rows) of this rank's KV head.
KV_ROWS = "_plangen_kv_rows"


def resolve_kv_head(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> int | None:
    """The KV head TP rank ``rank`` computes when the TP size exceeds the KV heads; None when they split."""
    if num_kv_heads % tp_size == 0:
        return None
    if tp_size % num_kv_heads or num_heads % tp_size:
        raise ValueError(
            f"TP size {tp_size} must divide num_attention_heads={num_heads} and either divide or be a multiple "
            f"of num_key_value_heads={num_kv_heads}"
        )
    return rank // (tp_size // num_kv_heads)


def kv_projections(attention: nn.Module, kv_heads: int, head_dim: int) -> list[tuple[str, nn.Linear]]:
    """The k/v projections of an attention block: its ``nn.Linear`` children of ``kv_heads * head_dim``
    outputs that read the block's input. The input width tells them from ``o_proj``, whose output
    (the hidden size) can be as wide where the heads are not as wide as the hidden state (2 heads
    of 16 over a hidden size of 16, 1 KV head: ``o_proj`` is 32 -> 16, ``k_proj`` 16 -> 16)."""
    hidden = getattr(getattr(attention, "config", None), "hidden_size", None)
    return [
        (name, child)
        for name, child in attention.named_children()
        if isinstance(child, nn.Linear)
        and child.out_features == kv_heads * head_dim
        and (not isinstance(hidden, int) or child.in_features == hidden)
    ]


def apply_kv_head_layout(attention: nn.Module, device_mesh: DeviceMesh) -> None:
    """Where the TP size exceeds the KV heads: one local KV head per rank, marked on its k/v projections."""
    counts = attention_head_counts(attention)
    if counts is None:
        return
    heads, kv_heads, head_dim = counts
    tp_size = device_mesh.size()
    kv_head = resolve_kv_head(heads, kv_heads, tp_size, device_mesh.get_local_rank())
    if kv_head is None:
        return
    projections = kv_projections(attention, kv_heads, head_dim)
    packed = any(
        isinstance(child, nn.Linear) and child.out_features == (heads + 2 * kv_heads) * head_dim
        for child in attention.children()
    )
    if not projections and getattr(attention, "is_kv_shared_layer", False) is True:
        # Keys and values reused from an earlier layer, whose k/v projections computed this rank's KV
        # head for the same query heads (Gemma 3n, Gemma 4): only the grouping is this rank's.
        attention.num_key_value_groups = heads // tp_size
        return
    if not projections and packed:
        # k and v packed with q in one projection (multi-query GPT-BigCode): its own style
        # (MultiQueryColwiseParallel) gives each rank the whole KV head; it serves the local query heads.
        attention.num_key_value_groups = heads // tp_size
        return
    if not projections:
        raise ValueError(
            f"{type(attention).__name__}: no nn.Linear child gives num_key_value_heads={kv_heads} x head_dim={head_dim} "
            f"outputs, so its KV heads cannot be replicated over TP size {tp_size}"
        )
    for name, child in projections:
        if isinstance(child.weight, DTensor):
            raise ValueError(
                f"{name} was sharded before its attention block: put PrepareAttentionInput's key before "
                "the k/v projections' keys in the plan"
            )
        setattr(child, KV_ROWS, (kv_head * head_dim, head_dim))
    # The attention's repeat_kv (eager, sdpa) repeats each local KV head for the local query heads.
    attention.num_key_value_groups = heads // tp_size


class PrepareAttentionInput(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` for an attention block, which also lays out its KV heads over TP.

    Where the TP size divides the KV heads this is ``PrepareModuleInput``. Where it exceeds them
    (a multiple of the KV head count), each rank keeps one KV head: the block's
    ``num_key_value_groups`` becomes its local query head count and its k/v projections (the
    ``nn.Linear`` children of ``kv_heads * head_dim`` outputs) learn which rows this rank computes,
    which :class:`KVHeadsColwiseParallel` on them reads. Head counts come from the module's config.

    ``head_attributes`` names integer attributes the block shapes its tensors by that count all its
    heads (OPT's ``self.num_heads`` in ``view(bsz, -1, self.num_heads, self.head_dim)``): they are
    divided by the TP size, as :class:`~plangen.styles.fused.LocalHeadCounts` does, so the block
    reshapes this rank's heads (one style per module: the input preparation carries it).
    ``shared_tables`` names the block's own parameters that every local head reads alike (GOT-OCR2's
    relative-position tables): replicated, each rank's gradient (its heads' share) summed over TP.
    ``padded_heads``: multi-query attention whose query heads the TP size does not divide (Falcon-7B's
    71) gets zero pad heads up to the next multiple (:mod:`plangen.styles.padded_heads`); ``head_attributes``
    then become this rank's padded share, and its one KV head stays whole in the packed projection.
    ``batch_head_inputs`` names arguments that stack every batch row's heads on dimension 0, built
    for all heads outside the block (Bloom's ALiBi ``alibi``, ``[batch x heads, 1, seq]``): the block
    gets this rank's heads' rows of each batch row (a local slice, no communication; the head count
    is the first of ``head_attributes``, read before it is made this rank's).
    """

    # The attention block's input; where TP exceeds the KV heads, one local KV head per rank.
    facts = StyleFacts("prepare_input", hooks=PREPARE_INPUT)

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        if self.padded_heads:
            return []  # its head counts become this rank's padded share: the heads check says which TP sizes can
        return head_count_dims(module, self.head_attributes) or super().required_dims(module, tp)

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_output: bool = False,
        head_attributes: tuple[str, ...] = (),
        shared_tables: tuple[str, ...] = (),
        padded_heads: bool = False,
        batch_head_inputs: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )
        self.head_attributes = tuple(head_attributes)
        self.shared_tables = tuple(shared_tables)
        self.padded_heads = padded_heads
        self.batch_head_inputs = tuple(batch_head_inputs)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.fused import LocalHeadCounts

        if self.batch_head_inputs:
            _slice_batch_head_rows(self, module, device_mesh)
        if self.padded_heads:
            from plangen.styles.padded_heads import apply_padded_heads

            # Multi-query: the one KV head is computed whole by the packed projection's style.
            apply_padded_heads(module, device_mesh, self.head_attributes)
        else:
            apply_kv_head_layout(module, device_mesh)
            if self.head_attributes:
                LocalHeadCounts(attributes=self.head_attributes)._apply(module, device_mesh)
        if self.shared_tables:
            from plangen.styles.replicated import sum_own_grads_over

            if set(self.shared_tables) != set(module._parameters):
                raise ValueError(
                    f"PrepareAttentionInput: shared_tables {self.shared_tables} are not all of "
                    f"{type(module).__name__}'s own parameters ({', '.join(module._parameters)})"
                )
            sum_own_grads_over(module, device_mesh)
        return super()._apply(module, device_mesh)


def _slice_batch_head_rows(style: PrepareAttentionInput, module: nn.Module, device_mesh: DeviceMesh) -> None:
    from functools import partial

    from plangen.styles.attention import slice_batch_head_rows
    from plangen.model.module_facts import head_count_owner

    if not style.head_attributes or style.padded_heads:
        raise ValueError(
            "PrepareAttentionInput: batch_head_inputs need the block's head count, the first of head_attributes "
            "(and no padded_heads)"
        )
    heads = getattr(*head_count_owner(module, style.head_attributes[0]))
    if not isinstance(heads, int) or heads % device_mesh.size():
        raise ValueError(
            f"PrepareAttentionInput: {type(module).__name__}.{style.head_attributes[0]}={heads!r} does not "
            f"divide by the TP size {device_mesh.size()}"
        )
    hook = partial(slice_batch_head_rows, style.batch_head_inputs, heads, device_mesh)
    module.register_forward_pre_hook(hook, with_kwargs=True)


def _all_reduce_grad(tensor: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
    # Identity forward; backward sums the gradient over the mesh (Partial -> Replicate, no division).
    replicated = DTensor.from_local(tensor, device_mesh, (Replicate(),), run_check=False)
    return replicated.to_local(grad_placements=(Partial(),))


class KVHeadsColwiseParallel(ColwiseParallel, PlangenStyle):
    """Column-parallel k/v projection that replicates KV heads where the TP size exceeds them.

    Unmarked (the TP size divides the KV heads) it is ``ColwiseParallel``. Marked by
    :class:`PrepareAttentionInput`, the parameters become ``Replicate()`` DTensors and each forward
    runs ``linear(x, weight[rows], bias[rows])`` on local tensors: the output is this rank's KV head,
    local (as ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=True)`` gives its heads).
    Backward: the parameter gradients are summed over TP (each rank contributes its query heads'
    part of its KV head's rows), and the input's gradient is this rank's part of a sum over TP, as
    column-parallel's is (``Partial`` on a DTensor input, all-reduced for a local one).
    """

    # Column-parallel where TP divides the KV heads; where TP exceeds them (plangen.styles.kv_heads) the
    # weight stays whole (Replicate()) and each rank computes its KV head's rows.
    facts = StyleFacts(
        "colwise",
        shard_dim={LINEAR: 0},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
        produces=SHARD_LAST,
        hooks=MODULE_HOOKS,
    )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        rows = getattr(module, KV_ROWS, None)
        if rows is None:
            return super()._apply(module, device_mesh)
        if not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{type(self).__name__} replicates the KV heads of nn.Linear only")
        if self.input_layouts != (Replicate(),) or self.output_layouts != (Shard(-1),) or not self.use_local_output:
            raise ValueError(
                f"{type(self).__name__} replicating KV heads takes a replicated input and returns its head local: "
                "input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True"
            )
        for name, param in list(module.named_parameters(recurse=False)):
            replicated = distribute_tensor(param, device_mesh, [Replicate()], src_data_rank=self.src_data_rank)
            module.register_parameter(name, nn.Parameter(replicated, requires_grad=param.requires_grad))
        apply_local_kv_rows(module, device_mesh, *rows)
        return module


def apply_local_kv_rows(module: nn.Linear, device_mesh: DeviceMesh, start: int, width: int) -> None:
    """During each forward, the module's parameters are views of their rows ``start:start + width``."""

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        grad = torch.is_grad_enabled()
        x, *rest = args
        if isinstance(x, DTensor):
            if any(not p.is_replicate() for p in x.placements):
                x = x.redistribute(placements=[Replicate()])
            x = x.to_local(grad_placements=(Partial(),))
        elif grad:
            x = _all_reduce_grad(x, device_mesh)
        for name, param in list(mod._parameters.items()):
            if param is None:
                continue
            local = param.to_local() if isinstance(param, DTensor) else param
            if grad and param.requires_grad:
                local = _all_reduce_grad(local, device_mesh)
            params.replace(mod, name, local.narrow(0, start, width))
        return (x, *rest), kwargs

    run_on_local_tensors(module, swap_in)

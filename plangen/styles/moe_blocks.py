"""MoE blocks' own styles: the block's input prepared once for its branches (routed experts, shared
experts, a dense MLP under the same pattern), their partial outputs reduced once.

Every branch of a MoE block reads the same hidden state, and each rank's gradient of it from a
TP-split branch covers that rank's share only (its experts' routes, its slice of the shared
experts' intermediate). Reduced per branch, the routed and the shared experts cost two reductions
of B·S·H in backward; summed locally first, one. :class:`MoeBlockParallel` and
``EveryTokenMoeParallel(input_grad_once=True)`` do that: the branches leave their input gradients
partial (``ExpertsParallel(sum_input_grad=False)``, :class:`PartialGradInput` on nn.Linear shared
experts, ``SharedExpertsParallel(sum_input_grad=False)`` on packed ones), the replicated readers
whose input gradient is whole on every rank (the router, a shared expert's gate) count it on the
first rank only, and the block reduces the sum once: an all-reduce, or under sequence parallel the
reduce-scatter that is its gather's backward (where each branch all-reduced its own before).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput

from plangen.stack import torch_compat as compat
from plangen.styles.experts import expert_count
from plangen.styles.tp_sums import (
    ShareOverMesh,
    all_reduce_grad,
    count_once_where_weight_is_read,
    grad_once_pre_hook,
    replicated_local,
)
from plangen.stack.transformers_compat import block_identity_experts, reads_child_weight
from plangen.plan.style_facts import PREPARE_INPUT, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle


class PartialGradInput(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` (same arguments, inputs ``Replicate()``) whose inputs' gradients are left
    partial over TP: for shared experts of nn.Linear projections inside a block that reduces all its
    branches' input gradients once (:class:`MoeBlockParallel`). The column-parallel projections that
    read the Replicate DTensor add their partial gradients on it, and nothing is reduced here."""

    # Shared experts' PrepareModuleInput whose input gradient is left to that block's one reduction.
    facts = StyleFacts("prepare_input", hooks=PREPARE_INPUT)

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_output: bool = False,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )
        layouts = [*(self.input_layouts or ()), *(self.input_kwarg_layouts or {}).values()]
        if not all(layout is None or isinstance(layout, Replicate) for layout in layouts):
            raise ValueError(
                "PartialGradInput: its inputs must be whole (Replicate()): a partial gradient of a shard is no layout"
            )

    def _prepare_input_arg(self, input: Any, mesh: DeviceMesh, input_layout: Any, desired_layout: Any) -> Any:
        if input_layout is not None and isinstance(input, torch.Tensor) and not isinstance(input, DTensor):
            input = compat.from_local(input, mesh, (input_layout,), run_check=False, grad_placements=(Partial(),))
        return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)


def _is_sequence_parallel(style: PrepareModuleInputOutput) -> bool:
    layouts = style.prepare_module_input.input_layouts or ()
    return not all(layout is None or isinstance(layout, Replicate) for layout in layouts)


def _install_input_once(
    style: PrepareModuleInputOutput, module: nn.Module, device_mesh: DeviceMesh, whole_readers: list[nn.Module]
) -> None:
    """On a block whose input preparation hands its forward a Replicate DTensor (``use_local_input``
    off): the local whole input, its gradient summed over TP once (an all-reduce by c10d, cheaper
    on the CPU than DTensor's; under SP left ``Partial`` for the gather's backward to reduce-scatter);
    each of ``whole_readers`` counts its whole input gradient once."""
    sp = _is_sequence_parallel(style)

    def local_once(mod: nn.Module, args: tuple) -> tuple:
        # After the input preparation (registered first): the whole input every branch reads.
        if not args or not isinstance(args[0], DTensor):
            return args
        if sp:
            local = args[0].to_local(grad_placements=(Partial(),))
        else:
            local = args[0].to_local()
            local = all_reduce_grad(local, device_mesh) if torch.is_grad_enabled() else local
        return (local, *args[1:])

    module.register_forward_pre_hook(local_once)
    children = {child: name for name, child in module.named_children()}
    for reader in whole_readers:
        name = children.get(reader)
        if name is not None and reads_child_weight(module, name):
            # The block computes the reader itself from its weight (5.8's DeepSeek-V2 router).
            count_once_where_weight_is_read(module, lambda reader=reader: reader.weight, device_mesh)
        else:
            reader.register_forward_pre_hook(grad_once_pre_hook(device_mesh))


class MoeBlockParallel(PrepareModuleInputOutput, PlangenStyle):
    """A MoE block's ``PrepareModuleInputOutput`` (same arguments; ``use_local_input`` is implied)
    whose branches leave their input gradients partial: the block input's gradient is summed over TP
    once (one all-reduce of B·S·H, or under SP one reduce-scatter) where each branch reduced its own.
    The ``router``'s input gradient and each of ``gates``' (replicated gates scaling the shared
    experts' partial output, ``AllReduceOutputGrad``), whole on every rank, count once.

    A block under the same pattern without the router, a dense MLP (DeepSeek's first layers): its
    input handed on as the Replicate DTensor, so its column-parallel projections add their partial
    gradients on it and the one reduction is the input preparation's backward.
    """

    # A MoE block's PrepareModuleInputOutput that also reduces its branches' input gradients once (Inkling's).
    facts = StyleFacts("gather_output")

    def __init__(
        self,
        *,
        router: str = "gate",
        gates: tuple[str, ...] = (),
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_input: bool = True,
        output_layouts: Any,
        desired_output_layouts: Any,
        use_local_output: bool = True,
    ) -> None:
        # The block's hook makes the input local itself (with the gradient's placement it needs).
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_input=False,
            output_layouts=output_layouts,
            desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output,
        )
        self.router, self.gates = router, tuple(gates)
        desired = self.prepare_module_input.desired_input_layouts or ()
        if not all(layout is None or isinstance(layout, Replicate) for layout in desired):
            raise ValueError(
                "MoeBlockParallel: the block's branches read its input whole (desired_input_layouts Replicate())"
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        names = (self.router, *self.gates)
        found = {name: _child(module, name) for name in names}
        routed = any(m is not None for m in found.values())
        if (
            routed
            and not all(m is not None for m in found.values())
            or not routed
            and any(map(expert_count, module.modules()))
        ):
            missing = [name for name, m in found.items() if m is None]
            raise ValueError(f"MoeBlockParallel: {type(module).__name__} has experts but no {', '.join(missing)}")
        module = super()._apply(module, device_mesh)
        if routed:
            _install_input_once(self, module, device_mesh, list(found.values()))
            if block_identity_experts(module):
                _share_identity_routes(module, found[self.router], device_mesh.size())
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(router={self.router!r}, gates={self.gates})"


def _share_identity_routes(block: nn.Module, router: nn.Module, tp: int) -> None:
    """A block that computes its zero-compute experts itself (5.25.0's LongCat-Flash:
    ``transformers_compat.block_identity_experts``) adds their output, whole on every rank, to the
    experts' partial sum, which this style reduces over TP: the router's weights of those routes are
    handed on as each rank's 1/tp share (:class:`~plangen.styles.tp_sums.ShareOverMesh`), so the reduced sum
    holds the identity output once. Their gradient is whole on every rank, as the replicated router's
    must be; the hidden state's from those routes is this rank's share, summed with the branches'."""
    routed = block.num_routed_experts

    def share(mod: nn.Module, args: tuple, output: Any) -> Any:
        if not isinstance(output, tuple):
            return output
        values = [replicated_local(v) if isinstance(v, torch.Tensor) else v for v in output]
        index = next((v for v in values if isinstance(v, torch.Tensor) and not v.is_floating_point()), None)
        at = next(
            (
                i
                for i, v in enumerate(values)
                if index is not None
                and isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and v.shape == index.shape
            ),
            None,
        )
        if at is None:
            raise ValueError(
                f"MoeBlockParallel: {type(mod).__name__} returns no routing weights beside its expert "
                "index, which the block's zero-compute experts need shared over TP"
            )
        weights = values[at]
        values[at] = torch.where(index >= routed, ShareOverMesh.apply(weights, tp), weights)
        return tuple(values)

    router.register_forward_hook(share)


def _child(module: nn.Module, name: str) -> nn.Module | None:
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


class EveryTokenMoeParallel(PrepareModuleInputOutput, PlangenStyle):
    """A MoE block whose experts run on every token (Llama-4's ``Llama4TextMoe``), experts split on
    the expert dimension: the block's own ``PrepareModuleInputOutput`` (same arguments), and the
    experts sharded ``Shard(0)`` with the router's scores cut to this rank's experts.

    Llama-4 scores every expert for every token (``sigmoid`` of the top-k logits, 0 elsewhere), feeds
    the experts ``hidden.repeat(E, 1) * scores`` (expert-major) and sums the ``E`` outputs. Here:

    * the router runs whole on every rank (routing exact); a forward hook hands the block this
      rank's ``E / tp`` columns of the scores, so the block builds its ``[E/tp · T, H]`` input and
      sums its ``E/tp`` outputs: a partial sum over ranks, reduced once by this style's output
      layouts (all-reduce, or reduce-scatter under SP) together with the shared expert's;
    * backward: the scores' gradient (``T · E``) and the experts' input's gradient with respect to the
      hidden state (``T · H``) cover this rank's experts only and are summed over TP. The second is
      taken where the block repeats the hidden state: the experts' input is recomputed from the
      router's input with that reduction (the same product, the same values), and the block's own
      copy is left unused. The router's input path and the shared expert's are exact as they are.

    ``input_grad_once=True``: the experts' share of the hidden state's gradient is left partial, the
    router's (whole) counted once, and the block's input gradient reduced once for the experts and
    the shared expert (given ``PartialGradInput``): one reduction of T · H where there were two.

    The block's children are found by transformers' names, ``experts`` and ``router``. (The block
    adds the routed sum in place into the shared expert's output: the plan gives its ``down_proj``
    ``RowwiseParallelOwnOutput``, whose output is a copy, not ``to_local``'s view.)
    """

    # A Llama-4 MoE block's PrepareModuleInputOutput that also splits its experts (the expert dim).
    facts = StyleFacts("gather_output")

    experts_name, router_name = "experts", "router"

    def __init__(
        self,
        *,
        input_grad_once: bool = False,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_input: bool = False,
        output_layouts: Any,
        desired_output_layouts: Any,
        use_local_output: bool = True,
    ) -> None:
        # Once: the block's hook makes the input local itself (with the gradient's placement it needs).
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_input=use_local_input and not input_grad_once,
            output_layouts=output_layouts,
            desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output,
        )
        self.input_grad_once = input_grad_once

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        experts, router = getattr(module, self.experts_name, None), getattr(module, self.router_name, None)
        count = expert_count(experts) if isinstance(experts, nn.Module) else None
        if count is None or not isinstance(router, nn.Module):
            raise ValueError(
                f"EveryTokenMoeParallel applies to a MoE block with a packed experts module "
                f"{self.experts_name!r} and a router {self.router_name!r}; {type(module).__name__} has none"
            )
        tp = device_mesh.size()
        if count % tp:
            raise ValueError(f"EveryTokenMoeParallel: {count} experts cannot be split evenly over TP size {tp}")
        for name, param in list(experts.named_parameters(recurse=False)):
            if param.dim() >= 1 and param.shape[0] == count:
                sharded = distribute_tensor(param.data, device_mesh, [Shard(0)], src_data_rank=None)
                experts.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        local = count // tp
        first = device_mesh.get_local_rank() * local
        routed: dict[str, torch.Tensor] = {}

        def keep_router_input(mod: nn.Module, args: tuple) -> None:
            routed["hidden"] = replicated_local(args[0])

        def local_scores(mod: nn.Module, args: tuple, output: tuple) -> tuple:
            scores, *rest = output
            scores = replicated_local(scores)
            if torch.is_grad_enabled():
                scores = all_reduce_grad(scores, device_mesh)
            routed["scores"] = scores[:, first : first + local]
            return (routed["scores"], *rest)

        def local_experts(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            hidden, scores = routed.pop("hidden"), routed.pop("scores")
            if torch.is_grad_enabled() and not self.input_grad_once:
                hidden = all_reduce_grad(hidden, device_mesh)
            params.local_views(mod)
            rebuilt = hidden.repeat(local, 1) * scores.transpose(0, 1).reshape(-1, 1)
            if rebuilt.shape != args[0].shape:
                raise ValueError(
                    f"EveryTokenMoeParallel: the experts' input {tuple(args[0].shape)} is not "
                    f"hidden.repeat(E/tp, 1) * scores ({tuple(rebuilt.shape)})"
                )
            return (rebuilt, *args[1:]), kwargs

        router.register_forward_pre_hook(keep_router_input)
        router.register_forward_hook(local_scores)
        run_on_local_tensors(experts, local_experts)
        module = super()._apply(module, device_mesh)
        if self.input_grad_once:  # after keep_router_input: the experts' copy of the input stays partial
            _install_input_once(self, module, device_mesh, [router])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ("input_grad_once=True" if self.input_grad_once else "") + ")"


__all__ = ["EveryTokenMoeParallel", "MoeBlockParallel", "PartialGradInput"]

"""Experts modules of one ``[experts, out, in]`` weight applied to tokens sorted by expert (JetMoE's
``JetMoeParallelExperts``), split column- and row-parallel inside every expert.

The transformers 5.x packed experts (``gate_up_proj`` / ``down_proj``) are :mod:`plangen.styles.experts`'.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.styles.experts import expert_count
from plangen.styles.tp_sums import SumOverMesh, all_reduce_grad, grad_once, replicated_local
from plangen.plan.style_facts import EXPERTS, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle


def _grouped_fit_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    weight = getattr(module, "weight", None)
    if expert_count(module) is None or not isinstance(weight, nn.Parameter) or weight.dim() != 3:
        return (
            f"`{type(style).__name__}` shards an experts module of one [experts, out, in] weight (JetMoE's),"
            f" not {type(module).__name__}"
        )
    return None


def _grouped_weight(style: ParallelStyle, module: nn.Module) -> nn.Parameter:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 3 or expert_count(module) is None:
        raise ValueError(
            f"{type(style).__name__} applies to an experts module with one [experts, out, in] weight "
            f"(JetMoE's JetMoeParallelExperts); {type(module).__name__} has none"
        )
    return weight


class GroupedColwiseParallel(PlangenStyle):
    """Column-parallel for an experts module of one ``[E, out, in]`` weight that its forward applies
    per expert to the tokens sorted by expert (JetMoE's ``JetMoeParallelExperts``, called with the
    inputs and per-expert token counts, ``input_linear`` of its MoE and of its mixture of attention
    heads): each rank computes its slice of every expert's output features (``Shard(1)``) from the
    whole input, and the input's gradient, partial for the same reason, is summed over TP.

    ``part_sizes``: the parts packed in the output features (``(1, 1)`` for ``[gate; up]``, which the
    block chunks in two), re-laid out so each rank's slice holds its share of every part, with the
    state dict in Hugging Face's layout (:mod:`plangen.styles.fused`); ``()`` for one part (a
    query projection, split by heads).

    ``sum_input_grad=False``: the input's gradient is left partial, for a block that reduces all its
    input gradients once (:class:`RoutedBlockParallel`'s, an all-reduce; under SP
    :class:`RoutedBlockSequenceParallel`'s gather, whose backward reduce-scatters).
    """

    # JetMoE's experts of one [E, out, in] weight: each expert's output features, or its input
    # features (the outputs all-reduced), split over TP.
    facts = StyleFacts("colwise", shard_dim={EXPERTS: 1})

    def fit_problem(self, module: nn.Module) -> str | None:
        return _grouped_fit_problem(self, module)

    def __init__(self, *, part_sizes: tuple[int, ...] = (), sum_input_grad: bool = True) -> None:
        super().__init__()
        self.part_sizes = tuple(part_sizes)
        self.sum_input_grad = sum_input_grad

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.fused import install_layout_hooks, interleave_index

        weight = _grouped_weight(self, module)
        tp = device_mesh.size()
        data = weight.data
        if self.part_sizes:
            data = data.index_select(1, interleave_index(data.shape[1], self.part_sizes, tp).to(data.device))
        elif data.shape[1] % tp:
            raise ValueError(
                f"{type(self).__name__}: {data.shape[1]} output features do not divide by the TP size {tp}"
            )
        sharded = distribute_tensor(data, device_mesh, [Shard(1)], src_data_rank=None)
        module.register_parameter("weight", nn.Parameter(sharded, requires_grad=weight.requires_grad))
        if self.part_sizes:
            install_layout_hooks(module, self.part_sizes, tp, {"weight": 1})

        def prepare(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            inputs, *rest = args
            inputs = replicated_local(inputs)
            if torch.is_grad_enabled() and self.sum_input_grad:
                inputs = all_reduce_grad(inputs, device_mesh)
            # The forward computes on this rank's shards; to_local's backward hands each gradient back as the DTensor.
            params.local_views(mod)
            return (inputs, *rest), kwargs

        run_on_local_tensors(module, prepare)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(part_sizes={self.part_sizes}, sum_input_grad={self.sum_input_grad})"


class GroupedRowwiseParallel(PlangenStyle):
    """Row-parallel for the same kind of experts module (JetMoE's ``output_linear``): each rank holds
    its slice of every expert's input features (``Shard(2)``), takes the matching slice its
    :class:`GroupedColwiseParallel` partner left, and the partial outputs are summed over TP (one
    all-reduce of the routed tokens, ``B·S·k × H``), so everything after (the gates, the scatter back
    to the tokens, the block's bias) runs on whole values, exactly.

    ``sum_output=False``: the partial outputs are returned as they are, for a block that reduces
    them once after its gates and scatter back (:class:`RoutedBlockParallel`, one all-reduce of
    B·S·H; :class:`RoutedBlockSequenceParallel`, one reduce-scatter)."""

    facts = StyleFacts("rowwise", shard_dim={EXPERTS: 2})

    def fit_problem(self, module: nn.Module) -> str | None:
        return _grouped_fit_problem(self, module)

    def __init__(self, *, sum_output: bool = True) -> None:
        super().__init__()
        self.sum_output = sum_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        weight = _grouped_weight(self, module)
        tp = device_mesh.size()
        if weight.shape[2] % tp:
            raise ValueError(
                f"{type(self).__name__}: {weight.shape[2]} input features do not divide by the TP size {tp}"
            )
        sharded = distribute_tensor(weight.data, device_mesh, [Shard(2)], src_data_rank=None)
        module.register_parameter("weight", nn.Parameter(sharded, requires_grad=weight.requires_grad))

        def prepare(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            params.local_views(mod)
            return (replicated_local(args[0]), *args[1:]), kwargs

        def finish(mod: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
            if output is None or not self.sum_output:
                return output
            return SumOverMesh.apply(output, device_mesh.get_group())

        run_on_local_tensors(module, prepare, finish)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sum_output={self.sum_output})"


class RoutedBlockParallel(PlangenStyle):
    """Tensor parallel (no SP) for a JetMoE block whose experts leave partial sums (its MoE MLP, and
    its attention with the mixture of attention heads), ending as a dense row-parallel layer does:
    in one all-reduce of B·S·H, where reducing each experts module's routed tokens costs k times that.

    * In: the block's (replicated) input, its gradient taken as partial sums over the ranks and
      all-reduced once for every reader of the block (the experts' routed tokens,
      ``GroupedColwiseParallel(sum_input_grad=False)``; each child named in ``reads_gathered``, which
      reads it as a ``Replicate()`` DTensor, so its gradient stays partial too: the attention's
      ``kv_proj``).
    * The experts' partial outputs (``GroupedRowwiseParallel(sum_output=False)``) go through the
      gates and the scatter back to the tokens, both linear, and leave the block as partial sums:
      one all-reduce, then the block's ``bias`` added once (whole on every rank, so is its
      gradient). The block's forward adds a zero in its place.
    * The ``router`` runs replicated on every token. The gates multiply partial outputs, so their
      gradient is partial: it is summed over TP (one all-reduce of B·S·k), and the router's
      gradients, whole on every rank from then on (the auxiliary loss's too), are exact; its input's
      gradient counts once (on the first rank) in the block's input-gradient reduction.

    ``input_kwarg``: the block's input keyword (``"hidden_states"`` for the attention), ``""`` for
    its first positional argument. Paths (``bias``, ``router``, ``reads_gathered``) are relative to
    the block. An output tuple has its first value reduced, the others passed through.
    """

    # A JetMoE block: its experts' partial sums all-reduced once (under SP: its input gathered, reduce-scattered out).
    facts = StyleFacts("gather_output")

    GATES = 2  # JetMoeTopKGating returns (sorted ids, token ids, gates, expert sizes, logits)

    def __init__(
        self, *, input_kwarg: str = "", bias: str = "bias", router: str = "router", reads_gathered: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self.input_kwarg, self.bias, self.router = input_kwarg, bias, router
        self.reads_gathered = tuple(reads_gathered)

    def _bias_parameter(self, bias: nn.Parameter, device_mesh: DeviceMesh) -> nn.Parameter | None:
        # Whole on every rank and added to the whole sum: a plain parameter, as every replicated one without SP.
        return None

    def _whole_input(self, hidden: torch.Tensor, device_mesh: DeviceMesh) -> DTensor:
        return (
            hidden
            if isinstance(hidden, DTensor)
            else DTensor.from_local(hidden, device_mesh, [Replicate()], run_check=False)
        )

    def _reduce(self, partial: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
        return SumOverMesh.apply(partial, device_mesh.get_group())

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        owner_path, _, bias_name = self.bias.rpartition(".")
        owner = module.get_submodule(owner_path)
        bias = owner._parameters.get(bias_name)
        if bias is None:
            raise ValueError(f"{type(self).__name__}: {type(module).__name__} has no parameter {self.bias!r}")
        made = self._bias_parameter(bias, device_mesh)
        if made is not None:
            owner.register_parameter(bias_name, made)
        state: dict[str, Any] = {}

        def gather(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            args, kwargs = list(args), dict(kwargs)
            hidden = kwargs[self.input_kwarg] if self.input_kwarg else args[0]
            whole = self._whole_input(hidden, device_mesh)
            # Partial: the gradients of every reader are summed first, then reduced once (from whole's backward).
            local = whole.to_local(grad_placements=[Partial()])
            state.update(whole=whole, local=local, bias=owner._parameters[bias_name])
            # The bias is added once, after the sum over TP: the experts' own forward adds nothing.
            params.replace(owner, bias_name, torch.zeros((), dtype=local.dtype, device=local.device))
            if self.input_kwarg:
                kwargs[self.input_kwarg] = local
            else:
                args[0] = local
            return tuple(args), kwargs

        def reduce(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            bias_param = state.pop("bias", None)
            state.clear()
            if output is None:  # the forward raised (always_call): the bias is back, nothing to reduce
                return output
            first = output[0] if isinstance(output, tuple) else output
            summed = self._reduce(first, device_mesh) + bias_param
            return (summed, *output[1:]) if isinstance(output, tuple) else summed

        def read_gathered(mod: nn.Module, args: tuple) -> tuple:
            # The block's input, read as the DTensor it came from: the gradient stays partial.
            return (state["whole"], *args[1:]) if args and args[0] is state.get("local") else args

        def route_once(mod: nn.Module, args: tuple) -> tuple:
            return (grad_once(args[0], device_mesh), *args[1:]) if torch.is_grad_enabled() else args

        def sum_gates_grad(mod: nn.Module, args: tuple, output: tuple) -> tuple:
            if not torch.is_grad_enabled():
                return output
            gates = all_reduce_grad(output[self.GATES], device_mesh)
            return (*output[: self.GATES], gates, *output[self.GATES + 1 :])

        run_on_local_tensors(module, gather, reduce)
        for child in self.reads_gathered:
            # prepend: before the child's own style reads its input.
            module.get_submodule(child).register_forward_pre_hook(read_gathered, prepend=True)
        router = module.get_submodule(self.router)
        router.register_forward_pre_hook(route_once)
        router.register_forward_hook(sum_gates_grad)
        return module

    def _arguments(self) -> str:
        return (
            f"input_kwarg={self.input_kwarg!r}, bias={self.bias!r}, router={self.router!r}, "
            f"reads_gathered={self.reads_gathered}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._arguments()})"


class RoutedBlockSequenceParallel(RoutedBlockParallel):
    """:class:`RoutedBlockParallel` under sequence parallel, ending as a dense row-parallel layer under
    SP does: the sequence-sharded input all-gathered once (its gradient, partial from every reader,
    reduce-scattered once), the experts' partial sums reduce-scattered onto the sequence-sharded
    residual, then the block's ``bias`` added once, on the shard (a ``Replicate()`` DTensor, as a
    norm's weight under SP: its gradient is summed as theirs is). The router and the gates as there.

    ``sequence_dim``: the dim the residual stream is sharded on (as torch's ``SequenceParallel``
    takes it).
    """

    facts = StyleFacts("gather_output")

    def __init__(
        self,
        *,
        input_kwarg: str = "",
        bias: str = "bias",
        router: str = "router",
        reads_gathered: tuple[str, ...] = (),
        sequence_dim: int = 1,
    ) -> None:
        super().__init__(input_kwarg=input_kwarg, bias=bias, router=router, reads_gathered=reads_gathered)
        self.sequence_dim = sequence_dim

    def _bias_parameter(self, bias: nn.Parameter, device_mesh: DeviceMesh) -> nn.Parameter | None:
        replicated = distribute_tensor(bias.data, device_mesh, [Replicate()], src_data_rank=None)
        return nn.Parameter(replicated, requires_grad=bias.requires_grad)

    def _whole_input(self, hidden: torch.Tensor, device_mesh: DeviceMesh) -> DTensor:
        if not isinstance(hidden, DTensor):
            hidden = DTensor.from_local(hidden, device_mesh, [Shard(self.sequence_dim)], run_check=False)
        return hidden.redistribute(device_mesh, [Replicate()])

    def _reduce(self, partial: torch.Tensor, device_mesh: DeviceMesh) -> torch.Tensor:
        return DTensor.from_local(partial, device_mesh, [Partial()], run_check=False).redistribute(
            device_mesh, [Shard(self.sequence_dim)]
        )

    def _arguments(self) -> str:
        return f"{super()._arguments()}, sequence_dim={self.sequence_dim}"

"""Gated-delta-net linear attention (Qwen3-Next, Qwen3.5, OLMo-Hybrid) sharded by heads over TP.

A gated delta net mixes each value head with the key head it belongs to (value heads
``i * r .. (i + 1) * r - 1`` read key head ``i``, ``r = num_v_heads / num_k_heads``), and nothing
mixes heads until ``out_proj``: so key heads and their value heads split together over TP, as
vLLM and Megatron shard it. On each rank:

* the input projections are column-parallel by head groups (their own entries: ``ColwiseParallel``,
  or ``FusedColwiseParallel`` for a packed ``[q; k; v]`` that feeds the convolution as is);
* the depthwise ``conv1d`` over the ``[q; k; v]`` channels keeps this rank's channels of each
  part (re-laid out as a packed projection is, :func:`plangen.styles.fused.shard_packed_rows`: the
  state dict stays Hugging Face's);
* ``A_log`` and ``dt_bias`` (one value per value head) keep this rank's heads, ``Shard(0)``;
* the head counts and widths the forward shapes by (``num_k_heads``, ``key_dim``, ...) are divided
  by the TP size;
* the gated norm (one head's width, shared by every head) stays whole, its gradient summed over TP
  (``AllReduceParamGrads``), and ``out_proj`` is row-parallel.

The forward reads ``conv1d.weight``, ``A_log`` and ``dt_bias`` directly next to local tensors
(``causal_conv1d_fn(x, self.conv1d.weight.squeeze(1), ...)``), so they are swapped for their local
views during the block's forward. Its hidden-state input is prepared as ``PrepareModuleInput``
does (one ``Replicate`` DTensor, so the column-parallel projections reduce its gradient once; under
sequence parallel the whole sequence is gathered, as the recurrence needs it); a padding mask
handed to it is made a ``Replicate`` DTensor too, since the forward multiplies the input by it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import PrepareModuleInput
from plangen.plan.style_facts import HEADS, PREPARE_INPUT, StyleFacts
from plangen.styles.base import PlangenStyle

# The padding mask a gated delta net multiplies its input by (apply_mask_to_padding_states).
MASK_KWARG = "attention_mask"


class GatedDeltaNetParallel(PrepareModuleInput, PlangenStyle):
    """``PrepareModuleInput`` for a gated-delta-net block that also splits its own heads over TP.

    ``head_attributes``: the integer attributes its forward shapes by (divided by the TP size, as
    :class:`~plangen.styles.fused.LocalHeadCounts` does); ``head_parameters``: its own parameters
    of one value per value head (``Shard(0)``); ``conv_parts``: the parts its one depthwise
    ``nn.Conv1d`` child packs on its channels (``(key_dim, key_dim, value_dim)``, in proportion: each
    rank keeps its slice of every part). The other arguments are ``PrepareModuleInput``'s.
    """

    # PrepareModuleInput of a gated delta net that also splits its own [value heads] parameters
    # (A_log, dt_bias), its conv's packed channels, and makes its head counts local.
    facts = StyleFacts("prepare_input", shard_dim={HEADS: 0}, hooks=PREPARE_INPUT)

    def fit_problem(self, module: nn.Module) -> str | None:
        problem = gated_delta_net_misfit(self, module)
        if problem is None:
            return None
        return f"`{type(self).__name__}` splits a gated delta net by heads, but {type(module).__name__} {problem}"

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        # Whole key heads and their value heads per rank.
        counts = [(a, getattr(module, a), 1) for a in self.head_attributes if isinstance(getattr(module, a, None), int)]
        own = [
            (p, getattr(module, p).shape[0], 1)
            for p in self.head_parameters
            if isinstance(getattr(module, p, None), nn.Parameter)
        ]
        return counts + own

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        input_kwarg_layouts: Any = None,
        desired_input_kwarg_layouts: Any = None,
        use_local_output: bool = False,
        head_attributes: tuple[str, ...] = (),
        head_parameters: tuple[str, ...] = (),
        conv_parts: tuple[int, ...] = (1, 1, 1),
    ) -> None:
        super().__init__(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_output,
        )
        self.head_attributes = tuple(head_attributes)
        self.head_parameters = tuple(head_parameters)
        self.conv_parts = tuple(conv_parts)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.attention import local_during_forward, shard_by_heads
        from plangen.styles.fused import LocalHeadCounts, shard_packed_rows

        name = type(self).__name__
        problem = gated_delta_net_misfit(self, module)
        if problem is not None:
            raise ValueError(f"{name}: {type(module).__name__} {problem}")
        conv = next(c for c in module.children() if isinstance(c, nn.Conv1d))
        LocalHeadCounts(attributes=self.head_attributes)._apply(module, device_mesh)
        own = {p: getattr(module, p) for p in self.head_parameters}
        shard_by_heads(module, own, device_mesh, name)
        shard_packed_rows(conv, self.conv_parts, device_mesh)
        # Its own forward (where a kernel calls it) then convolves this rank's channels.
        conv.in_channels = conv.out_channels = conv.groups = conv.in_channels // device_mesh.size()
        local_during_forward(module, [(module, p) for p in own] + [(conv, p) for p, _ in conv.named_parameters()])
        super()._apply(module, device_mesh)
        if not self.use_local_output:
            module.register_forward_pre_hook(replicate_mask_hook(device_mesh), with_kwargs=True)
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(head_attributes={self.head_attributes}, head_parameters={self.head_parameters}, "
            f"conv_parts={self.conv_parts})"
        )


def gated_delta_net_misfit(style: GatedDeltaNetParallel, module: nn.Module) -> str | None:
    """Why ``style`` cannot split ``module`` (the end of a sentence), or None: what ``_apply`` needs."""
    convs = [c for c in module.children() if isinstance(c, nn.Conv1d) and c.groups == c.in_channels]
    if len(convs) != 1:
        return f"has {len(convs)} depthwise nn.Conv1d children, not one"
    missing = [a for a in style.head_attributes if not isinstance(getattr(module, a, None), int)]
    if missing:
        return f"has no integer attribute {missing[0]}"
    missing = [p for p in style.head_parameters if not isinstance(getattr(module, p, None), nn.Parameter)]
    if missing:
        return f"has no parameter {missing[0]} of its own"
    channels, parts = convs[0].in_channels, sum(style.conv_parts)
    if channels % parts:
        return f"packs {channels} conv channels, which do not split in the proportions {style.conv_parts}"
    return None


def replicate_mask_hook(device_mesh: DeviceMesh):
    """A pre-hook making a plain padding mask a ``Replicate`` DTensor, to multiply the DTensor input."""

    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask = kwargs.get(MASK_KWARG)
        if isinstance(mask, torch.Tensor) and not isinstance(mask, DTensor):
            kwargs = {**kwargs, MASK_KWARG: DTensor.from_local(mask, device_mesh, (Replicate(),), run_check=False)}
        return args, kwargs

    return hook

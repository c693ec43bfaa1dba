"""Attention with a projection of one value per (bucket, head), bucket major: ProphetNet's n-gram
self-attention (``relative_pos_embeddings``, ``nn.Linear`` to ``num_buckets * num_heads``).

Sharded by heads (:class:`~plangen.styles.fused.FusedColwiseParallel` with ``num_buckets`` equal
parts: each rank its heads of every bucket) its main stream is exact on each rank's heads. Its
predict stream is not: ``get_predict_relative_pos_embeddings`` transposes its input before the
projection, so its rows are ordered (batch, position, stream, head) while the gather index beside
them is tiled (stream, batch, head, position) by all heads' count, and which bucket a row meets
depends on the total head count. That helper is therefore run for all heads on every rank: the
projection's output all-gathered over TP and put back in the bucket-major order of all heads, the
head count made global for the call, and this rank's heads sliced from the result. The all-gather's
backward reduce-scatters (sums): a rank's heads' result reads other ranks' rows, whose gradients
are summed where they are held.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement

from plangen.stack import torch_compat as compat
from plangen.styles.attention import PrepareAttentionInputOutput
from plangen.plan.style_facts import PREPARE_INPUT_OUTPUT, StyleFacts


class BucketedAttentionInputOutput(PrepareAttentionInputOutput):
    """:class:`~plangen.styles.attention.PrepareAttentionInputOutput` that also runs the block's
    ``all_heads_helper`` method for all heads (see the module docstring): ``bucketed`` is the
    column-parallel projection it reads (``buckets`` parts of all heads, bucket major), and
    ``all_heads_dim`` the dimension of its result that counts the heads. The head count is the
    first of ``head_attributes``."""

    # The same, with ProphetNet's predict-stream relative positions computed for all heads.
    facts = StyleFacts("gather_output", hooks=PREPARE_INPUT_OUTPUT)

    def __init__(
        self,
        *,
        # torch's annotations (PrepareModuleInputOutput's): the contract the static check holds plans to.
        input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        desired_input_layouts: Placement | tuple[Placement | None, ...] | None = None,
        input_kwarg_layouts: dict[str, Placement] | None = None,
        desired_input_kwarg_layouts: dict[str, Placement] | None = None,
        use_local_input: bool = False,
        output_layouts: Placement | tuple[Placement | None, ...],
        desired_output_layouts: Placement | tuple[Placement, ...],
        use_local_output: bool = True,
        head_attributes: tuple[str, ...] = (),
        head_inputs: tuple[str, ...] = (),
        bucketed: str = "relative_pos_embeddings",
        all_heads_helper: str = "get_predict_relative_pos_embeddings",
        all_heads_dim: int = 2,
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
            head_attributes=head_attributes,
            head_inputs=head_inputs,
        )
        self.bucketed, self.all_heads_helper, self.all_heads_dim = bucketed, all_heads_helper, all_heads_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        style = type(self).__name__
        if not self.head_attributes or not callable(getattr(module, self.all_heads_helper, None)):
            raise ValueError(
                f"{style}: {type(module).__name__} needs a head count attribute and a method {self.all_heads_helper}"
            )
        getattr(module, self.bucketed)  # a missing projection fails when the plan is applied
        super()._apply(module, device_mesh)
        helper = getattr(module, self.all_heads_helper)
        heads, bucketed, dim = self.head_attributes[0], self.bucketed, self.all_heads_dim
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()

        def all_heads_output(local: torch.Tensor, local_heads: int) -> torch.Tensor:
            # [..., buckets * local heads] per rank -> [..., buckets * all heads], bucket major.
            gathered = compat.all_gather(local.movedim(-1, 0), 0, device_mesh).movedim(0, -1)
            parts = gathered.reshape(*gathered.shape[:-1], tp, -1, local_heads).transpose(-3, -2)
            return parts.reshape(*gathered.shape[:-1], -1)

        def for_all_heads(*args: Any, **kwargs: Any) -> torch.Tensor:
            projection, local_heads = getattr(module, bucketed), getattr(module, heads)
            module.__dict__[bucketed] = lambda x: all_heads_output(
                projection(x), local_heads
            )  # shadows the child for the call
            setattr(module, heads, local_heads * tp)
            try:
                result = helper(*args, **kwargs)
            finally:
                del module.__dict__[bucketed]
                setattr(module, heads, local_heads)
            return result.narrow(dim, rank * local_heads, local_heads)

        module.__dict__[self.all_heads_helper] = for_all_heads
        return module

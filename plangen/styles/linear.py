"""torch's column-wise, row-wise, sequence-parallel and module-preparing styles, registered with
their facts, and plangen's small variants of them (NeMo RL's gathering column-wise, local outputs
of their own).
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import Placement

from plangen.plan.style_facts import (
    EMBEDDING,
    LINEAR,
    MODULE_HOOKS,
    PARTIAL_SUM,
    PREPARE_INPUT,
    PREPARE_INPUT_OUTPUT,
    PREPARE_OUTPUT,
    REPLICATE,
    SEQUENCE_HOOKS,
    SHARD_LAST,
    TORCH_STYLES,
    StyleFacts,
)
from plangen.styles.base import PlangenStyle, register_style

# torch's own styles: plan files import them from torch.distributed.tensor.parallel (or from here).
for _style, _facts in (
    # Output features of a Linear, the hidden dim of an Embedding.
    (
        ColwiseParallel,
        StyleFacts(
            "colwise",
            shard_dim={LINEAR: 0, EMBEDDING: 1},
            layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
            produces=SHARD_LAST,
            hooks=MODULE_HOOKS,
        ),
    ),
    # Input features of a Linear, the vocabulary of an Embedding.
    (
        RowwiseParallel,
        StyleFacts(
            "rowwise",
            shard_dim={LINEAR: 1, EMBEDDING: 0},
            layout_defaults={"input_layouts": SHARD_LAST, "output_layouts": REPLICATE},
            produces=PARTIAL_SUM,
            hooks=MODULE_HOOKS,
        ),
    ),
    (SequenceParallel, StyleFacts("sequence", replicates=True, replicate_dtensor=True, hooks=SEQUENCE_HOOKS)),
    (PrepareModuleInput, StyleFacts("prepare_input", hooks=PREPARE_INPUT)),
    (PrepareModuleOutput, StyleFacts("gather_output", hooks=PREPARE_OUTPUT)),
    (PrepareModuleInputOutput, StyleFacts("gather_output", hooks=PREPARE_INPUT_OUTPUT)),
):
    register_style(_style, _facts, TORCH_STYLES)


class ColwiseParallelWithGather(ColwiseParallel, PlangenStyle):
    """NeMo RL's name: column-parallel; with ``gather_output=True`` each rank gets the whole output,
    local (transformers' ``colwise_gather_output``; NeMo RL then ignores the output layout
    arguments too). The output is redistributed to ``Replicate()``, so DTensor's backward keeps each
    rank's gradient slice, and the style shows the layout plan checks read."""

    # NeMo RL's ColwiseParallel; gather_output=True sets output_layouts=Replicate().
    facts = StyleFacts(
        "colwise",
        shard_dim={LINEAR: 0, EMBEDDING: 1},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
        produces=SHARD_LAST,
        hooks=MODULE_HOOKS,
    )

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        gather_output: bool = False,
    ) -> None:
        if gather_output:
            output_layouts, use_local_output = Replicate(), True
        super().__init__(input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output)
        self.gather_output = gather_output


class RowwiseParallelOwnOutput(RowwiseParallel, PlangenStyle):
    """:class:`RowwiseParallel` whose local output is a tensor of its own, not a view.

    ``to_local()`` returns a view made inside an autograd Function, which autograd forbids to
    modify in place; a layer that adds to a block's output in place (Falcon's parallel attention:
    ``mlp_output += attention_output``) then fails. This style hands out a copy of the reduced
    output (one activation-sized copy per block, no communication); everything else is torch's.
    """

    # torch's RowwiseParallel, its local output a copy the model may modify in place.
    facts = StyleFacts(
        "rowwise",
        shard_dim={LINEAR: 1, EMBEDDING: 0},
        layout_defaults={"input_layouts": SHARD_LAST, "output_layouts": REPLICATE},
        produces=PARTIAL_SUM,
        hooks=MODULE_HOOKS,
    )

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        outputs = RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return outputs.clone() if use_local_output else outputs


class ColwiseParallelOwnOutput(ColwiseParallel, PlangenStyle):
    """:class:`ColwiseParallel` whose local output is a tensor of its own, not a view: the stable
    variant's twin of :class:`RowwiseParallelOwnOutput` (a column-parallel projection on the gathered
    input whose gathered output the layer modifies in place)."""

    # torch's ColwiseParallel, its local output a copy (the stable twin of the one above).
    facts = StyleFacts(
        "colwise",
        shard_dim={LINEAR: 0, EMBEDDING: 1},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
        produces=SHARD_LAST,
        hooks=MODULE_HOOKS,
    )

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        outputs = ColwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return outputs.clone() if use_local_output else outputs

"""Recurrent mixers' per-head parts split by heads over TP: RecurrentGemma's RG-LRU, xLSTM's
multi-head norm.

RecurrentGemma's (Griffin's) RG-LRU, split by its block-diagonal heads over TP.

transformers' ``RecurrentGemmaRglru`` computes, on the ``lru_width`` channels ``x`` its recurrent
block hands it (``linear_x``, then the depthwise ``conv_1d``)::

    x_h  = x.reshape(B·S, num_attention_heads, block_width)          # heads of block_width channels
    i, r = sigmoid(x_h @ input_gate_weight[h] + input_gate_bias[h]),  (the same with recurrent_gate_*)
    a    = exp(-8 r softplus(recurrent_param))                         # per channel
    h_t  = a_t h_(t-1) + sqrt(1 - a_t^2) (i_t x_t)                     # per channel, over the sequence

The gates are block-diagonal: head ``h``'s gate reads head ``h``'s channels only, so nothing mixes
heads, and each rank keeps whole heads: ``input_gate_weight``/``recurrent_gate_weight``
``[heads, block, block]`` and their biases ``[heads, block]`` split ``Shard(0)`` on the heads,
``recurrent_param [lru_width]`` ``Shard(0)`` on the channels (head-major, so the same heads), and
``num_attention_heads`` made this rank's (the reshape reads it; ``block_width`` stays). The TP size
must divide the heads. The recurrent state it keeps between calls (``recurrent_states``) is then
this rank's channels too.

The forward reads its parameters directly next to the local channels the block's column-parallel
``linear_x`` and sharded ``conv_1d`` leave (``torch.baddbmm(self.input_gate_bias[:, None, :], ...)``),
so they are swapped for their local views during its forward (``to_local``'s backward hands each
gradient back to the ``Shard(0)`` DTensor: each rank's heads' gradient, exact, with no communication).
The block around it is :class:`~plangen.styles.linear_attention.GatedDeltaNetParallel` (input
prepared, ``conv_1d`` split, ``lru_width`` made local); see :mod:`plangen.plans.families.recurrent`.

xLSTM's mLSTM layer normalises each head's output on its own (``xLSTMMultiHeadLayerNorm``: the
statistics over one head's ``head_dim``, then one weight per feature of all heads, head-major), so a
rank holding whole heads normalises them exactly: :class:`MultiHeadNormParallel` keeps this rank's
heads' slice of the weight (and bias) ``Shard(0)`` and makes its head count (and feature count)
this rank's; its input and output are this rank's heads as local tensors.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.device_mesh import DeviceMesh
from plangen.plan.style_facts import HEADS, NORM, StyleFacts
from plangen.styles.base import PlangenStyle

# transformers' names: the RG-LRU's own parameters, block-diagonal gates first.
GATE_WEIGHTS = ("input_gate_weight", "recurrent_gate_weight")  # [heads, block, block]
GATE_BIASES = ("input_gate_bias", "recurrent_gate_bias")  # [heads, block]
CHANNEL_PARAMETER = "recurrent_param"  # [heads * block], head-major
RG_LRU_PARAMETERS = (*GATE_WEIGHTS, *GATE_BIASES, CHANNEL_PARAMETER)
HEAD_COUNT = "num_attention_heads"  # the attribute its reshape reads


def rg_lru_misfit(module: nn.Module, head_attribute: str = HEAD_COUNT) -> str | None:
    """Why ``module`` is not an RG-LRU this style can split by heads (the end of a sentence), or None."""
    own = dict(module.named_parameters(recurse=False))
    if set(own) != set(RG_LRU_PARAMETERS):
        return f"has parameters {sorted(own)}, not an RG-LRU's {', '.join(RG_LRU_PARAMETERS)}"
    heads = getattr(module, head_attribute, None)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0:
        return f"has no integer attribute {head_attribute}"
    weight = own[GATE_WEIGHTS[0]]
    block = weight.shape[-1]
    expected = {
        **dict.fromkeys(GATE_WEIGHTS, (heads, block, block)),
        **dict.fromkeys(GATE_BIASES, (heads, block)),
        CHANNEL_PARAMETER: (heads * block,),
    }
    wrong = [n for n, shape in expected.items() if tuple(own[n].shape) != shape]
    if wrong:
        return f"has {wrong[0]} {tuple(own[wrong[0]].shape)}, not {expected[wrong[0]]} ({head_attribute}={heads} heads of {block})"
    return None


class RGLRUParallel(PlangenStyle):
    """An RG-LRU's block-diagonal heads split over TP (see the module docstring); its input and
    output are this rank's channels as local tensors, so it takes no layouts.

    ``head_attribute``: the integer attribute its forward reshapes by (divided by the TP size).
    """

    # An RG-LRU (RecurrentGemma) inside such a block: its own [heads, ...] gates and [channels]
    # recurrent_param split by heads; local channels in and out, so no layouts of its own.
    facts = StyleFacts("other", shard_dim={HEADS: 0})

    def fit_problem(self, module: nn.Module) -> str | None:
        problem = rg_lru_misfit(module, self.head_attribute)
        if problem is None:
            return None
        return f"`{type(self).__name__}` splits an RG-LRU by its heads, but {type(module).__name__} {problem}"

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        heads = getattr(module, self.head_attribute, None)
        if not isinstance(heads, int):
            return super().required_dims(module, tp)
        return [(self.head_attribute, heads, 1)]  # whole block-diagonal heads

    def __init__(self, *, head_attribute: str = HEAD_COUNT) -> None:
        super().__init__()
        self.head_attribute = head_attribute

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.attention import local_during_forward, shard_by_heads

        name = type(self).__name__
        problem = rg_lru_misfit(module, self.head_attribute)
        if problem is not None:
            raise ValueError(f"{name}: {type(module).__name__} {problem}")
        tp, heads = device_mesh.size(), getattr(module, self.head_attribute)
        if heads % tp:
            raise ValueError(f"{name}: {type(module).__name__} has {heads} heads, which TP size {tp} does not divide")
        # recurrent_param is head-major: Shard(0) of it holds the same heads as Shard(0) of the gates.
        shard_by_heads(module, {p: getattr(module, p) for p in RG_LRU_PARAMETERS}, device_mesh, name)
        setattr(module, self.head_attribute, heads // tp)
        local_during_forward(module, [(module, p) for p in RG_LRU_PARAMETERS])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(head_attribute={self.head_attribute!r})"


# transformers' names: the multi-head norm's head count (checked against its input) and feature count.
NORM_HEAD_COUNTS = ("num_heads", "num_features")


def multi_head_norm_misfit(module: nn.Module, head_attributes: tuple[str, ...] = NORM_HEAD_COUNTS) -> str | None:
    """Why ``module`` is not a per-head norm whose weight spans its heads (the end of a sentence), or None."""
    own = dict(module.named_parameters(recurse=False))
    if not own or any(c for c in module.children()):
        return "is not a leaf with parameters of its own"
    missing = [a for a in head_attributes if not isinstance(getattr(module, a, None), int)]
    if missing:
        return f"has no integer attribute {missing[0]}"
    width = {tuple(p.shape) for p in own.values()}
    if len(width) != 1 or len(next(iter(width))) != 1:
        return f"has parameters of shapes {sorted(width)}, not one value per feature"
    return None


class MultiHeadNormParallel(PlangenStyle):
    """A norm of each head on its own, its weight spanning all heads, on this rank's heads (see the
    module docstring): weight and bias ``Shard(0)``, ``head_attributes`` divided by the TP size.
    Input and output are local tensors (the column-parallel projections before it leave them so)."""

    # A norm of each head on its own, its weight spanning the heads (xLSTM's): sharded with them.
    facts = StyleFacts("sharded_norm", shard_dim={NORM: 0})

    def fit_problem(self, module: nn.Module) -> str | None:
        problem = multi_head_norm_misfit(module, self.head_attributes)
        if problem is None:
            return None
        return f"`{type(self).__name__}` splits a norm of each head by its heads, but {type(module).__name__} {problem}"

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        # Whole heads per rank, local counts.
        return [(a, getattr(module, a), 1) for a in self.head_attributes if isinstance(getattr(module, a, None), int)]

    def __init__(self, *, head_attributes: tuple[str, ...] = NORM_HEAD_COUNTS) -> None:
        super().__init__()
        self.head_attributes = tuple(head_attributes)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from plangen.styles.attention import local_during_forward, shard_by_heads
        from plangen.styles.fused import LocalHeadCounts

        name = type(self).__name__
        problem = multi_head_norm_misfit(module, self.head_attributes)
        if problem is not None:
            raise ValueError(f"{name}: {type(module).__name__} {problem}")
        # The head counts first: whole heads per rank, refused before any parameter is touched.
        LocalHeadCounts(attributes=self.head_attributes)._apply(module, device_mesh)
        own = {n: p for n, p in module.named_parameters(recurse=False) if not isinstance(p, DTensor)}
        shard_by_heads(module, own, device_mesh, name)
        local_during_forward(module, [(module, p) for p in own])
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(head_attributes={self.head_attributes})"

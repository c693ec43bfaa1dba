"""Recognise a gated short-convolution mixer (LFM2's and LFM3's ``ShortConv``): split by channels.

The mixer computes ``B, C, x = in_proj(h).chunk(3)`` (packed ``[B; C; x]``, one part per
channel of the conv), ``y = C * conv(B * x)`` with a depthwise ``nn.Conv1d``, then ``out_proj(y)``.
Every step between the two projections is per channel, so each rank keeps its slice of the
channels: ``in_proj`` column-parallel with its three parts re-laid out per rank
(``FusedColwiseParallel``), the conv's channels ``Shard(0)``, ``out_proj`` row-parallel.

It is planned as a gated delta net without heads (:class:`GatedDeltaNetBlock` with no head
parameters, attributes or norm), since its style does exactly what this mixer needs: the hidden
state prepared as one ``Replicate`` DTensor (the whole sequence gathered under SP), the padding
mask the forward multiplies it by made one too, and the conv's weight, which the forward reads
directly (``causal_conv1d_fn(x, self.conv.weight.squeeze(1), ...)``), made local during the
forward. The evidence is structural (shapes and which projection reads the input); the sweep
proves each class numerically.
"""

from __future__ import annotations

from torch import nn

from plangen.plans.families.dims import ModelDims, has_parameters, is_linear, own_parameters
from plangen.plans.source.forward import read_input_name_readers
from plangen.plans.families.linear_attention import GatedDeltaNetBlock

# in_proj's parts: B (the input gate), C (the output gate) and x, each as wide as the conv.
PARTS = (1, 1, 1)


def recognize_short_conv(block: nn.Module, dims: ModelDims) -> GatedDeltaNetBlock | None:
    """A depthwise-conv mixer between one packed ``[B; C; x]`` input projection and one output
    projection, nothing else with parameters; else None."""
    convs = [c for c in block.children() if isinstance(c, nn.Conv1d)]
    if len(convs) != 1 or own_parameters(block):
        return None
    conv = convs[0]
    width = conv.in_channels
    if not (conv.out_channels == conv.groups == width):
        return None
    readers = read_input_name_readers(type(block))
    if readers is None:
        return None
    ins, outs = [], []
    for name, child in block.named_children():
        if child is conv or not has_parameters(child):
            continue
        if not is_linear(child):
            return None
        if name in readers and child.in_features == dims.hidden and child.out_features == len(PARTS) * width:
            ins.append(name)
        elif name not in readers and child.in_features == width and child.out_features == dims.hidden:
            outs.append(name)
        else:
            return None
    if len(ins) != 1 or len(outs) != 1:
        return None
    return GatedDeltaNetBlock(
        colwise=(ins[0],),
        rowwise=outs[0],
        norm=None,
        conv_parts=(1,),
        head_parameters=(),
        head_attributes=(),
        packed=ins[0],
        packed_parts=PARTS,
    )

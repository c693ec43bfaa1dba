"""Recognise softmax attention whose keys and values pass through short convolutions (Inkling's
``InklingAttention``): split by heads, each conv's channels with their heads.

Inkling's attention projects q, k, v and per-head relative features ``r`` from the hidden state,
runs a depthwise ``nn.Conv1d`` along the sequence over k's and over v's channels (``k_sconv``,
``v_sconv``), normalises q and k per head, and adds relative logits from a bank every head reads
(``rel_logits_proj.proj`` ``[d_rel, extent]``). Its conv children made the generic recognizer take
it for a state-space / linear-attention mixer. Every step is per head or per channel of a head, so
sharded by heads each rank computes exactly its heads:

* q, k, v and r column-parallel (their rows are head-major: the forward views them per head),
  ``o_proj`` row-parallel;
* each conv's channels ``Shard(0)`` with its projection's heads (``ConvChannelsParallel``);
* the per-head norms and the relative-logits bank replicated, their gradient summed over TP;
* the head counts the forward shapes by (``view(..., self.num_heads, -1)``) made this rank's.

The head counts are the block's own (``num_heads``, ``num_key_value_heads``, ``head_dim``), since
Inkling's sliding-window layers have their own. The evidence is structural; the sweep proves each
class numerically.
"""

from __future__ import annotations

from torch import nn

from plangen.styles.attention import depthwise_conv
from plangen.plans.families.dims import ModelDims, has_parameters, is_linear, is_per_feature, own_parameters
from plangen.plans.source.forward import read_input_readers
from plangen.plans.families.core import ShardedBlock, head_count_attributes
from plangen.plans.source.shape import read_shape_sizes

_HEAD_COUNTS = ("num_heads", "num_key_value_heads", "head_dim")


def recognize_conv_attention(block: nn.Module, dims: ModelDims) -> ShardedBlock | None:
    """Attention with depthwise short convs on its k/v projections' channels, split by heads; else None."""
    n, k, d = (getattr(block, name, None) for name in _HEAD_COUNTS)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (n, k, d)) or own_parameters(block):
        return None
    readers = read_input_readers(type(block))
    shapes = read_shape_sizes(type(block))
    if readers is None or shapes is None:
        return None
    h = dims.hidden
    linears = {name: child for name, child in block.named_children() if is_linear(child)}
    reading = {name: m for name, m in linears.items() if name in readers}
    outputs = [
        name for name, m in linears.items() if name not in readers and m.in_features == n * d and m.out_features == h
    ]
    # Read from the input, whole heads each: q (n x d), k and v (k x d), per-head features (n x width).
    if (
        len(outputs) != 1
        or len(linears) != len(reading) + 1
        or len(reading) < 3
        or any(
            m.in_features != h or (m.out_features not in (n * d, k * d) and m.out_features % n)
            for m in reading.values()
        )
    ):
        return None
    kv_widths = {m.out_features for m in reading.values()} & {k * d}
    convs, norms, shared = [], [], []
    for name, child in block.named_children():
        if name in linears or not has_parameters(child):
            continue
        conv = depthwise_conv(child)
        if conv is not None and conv.in_channels in kv_widths:
            convs.append(name)
        elif is_per_feature(child, d):
            norms.append(name)
        elif not any(has_parameters(c) for c in child.children()):
            shared.append(name)  # a leaf every local head reads (the relative-logits bank)
        else:
            return None
    if not convs:
        return None  # attention without short convs: the generic recognizer's
    local = ModelDims(h, n, k, d, dims.vocab, dims.experts)
    return ShardedBlock(
        "attention",
        tuple(reading),
        outputs[0],
        tuple(norms),
        head_attributes=head_count_attributes(block, shapes, local),
        conv_children=tuple(convs),
        shared_children=tuple(shared),
    )


__all__ = ["recognize_conv_attention"]

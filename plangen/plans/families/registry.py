"""The block families in the order they are asked: the one answer to what a layer's child is.

Each family's recognizer reads a block (its modules, shapes and forward source) with the model's
dims and answers a block it shards, a :class:`~plangen.plans.families.core.KeptBlock` (the block is
its family's but stays whole, and why), or ``None`` (not its family). The first family that answers
owns the block; where none does, :func:`~plangen.plans.families.core.unrecognized` says why it stays
whole. So the order is the precedence, written once here: the narrower shapes first (latent
attention, packed and bucketed attention, attention by convolutions), then attention, the mixers,
MLPs and experts, then what is kept whole by kind, and a wrapper around an attention module last.

A new family is a module under ``plangen/plans/families/`` with its recognizer and its plan entries,
and one line in :data:`FAMILIES`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from torch import nn

from plangen.plans.families.bucketed_attention import recognize_bucketed_attention
from plangen.plans.families.conv_attention import recognize_conv_attention
from plangen.plans.families.core import (
    ModelDims,
    keep_mixture_of_experts,
    keep_recurrent_mixer,
    keep_short_convolution,
    recognize_attention,
    recognize_mlp,
    recognize_moe,
    unrecognized,
)
from plangen.plans.families.latent import recognize_latent_attention
from plangen.plans.families.linear_attention import recognize_gated_delta_net
from plangen.plans.families.mamba1 import recognize_mamba1_mixer
from plangen.plans.families.mamba2 import recognize_mamba2
from plangen.plans.families.packed import recognize_packed_attention, recognize_wrapped_attention
from plangen.plans.families.recurrent import recognize_recurrent_block
from plangen.plans.families.short_conv import recognize_short_conv


class Family(NamedTuple):
    name: str
    recognize: Callable[[nn.Module, ModelDims], Any]  # a block, a KeptBlock, or None


FAMILIES: tuple[Family, ...] = (
    Family("latent attention", recognize_latent_attention),
    # Attention whose projections are packed, bucketed or convolutions: attention's own recognizer
    # would keep them whole (a packed [q; k; v] is not three projections).
    Family("packed attention", recognize_packed_attention),
    Family("bucketed attention", recognize_bucketed_attention),
    Family("convolutional attention", recognize_conv_attention),
    Family("attention", recognize_attention),
    Family("recurrent mixer", recognize_recurrent_block),
    Family("MLP", recognize_mlp),
    Family("mixture of experts", recognize_moe),
    # Before the experts' shape test: a mixer's [value heads] weights can match a tiny expert count.
    Family("gated delta net", recognize_gated_delta_net),
    Family("short convolution mixer", recognize_short_conv),
    Family("experts kept whole", keep_mixture_of_experts),
    Family("Mamba1 mixer", recognize_mamba1_mixer),
    Family("Mamba2 mixer", recognize_mamba2),
    Family("short convolution kept whole", keep_short_convolution),
    Family("state-space mixer kept whole", keep_recurrent_mixer),
    # A thin wrapper holds one attention module: asked only where no family took the wrapper itself.
    Family("wrapped attention", recognize_wrapped_attention),
)


def recognize_block(name: str, block: nn.Module, dims: ModelDims) -> Any:
    """What a decoder-layer child with parameters is, and how it is sharded (or why it is not): the
    first family's answer, else why no family took it."""
    for family in FAMILIES:
        found = family.recognize(block, dims)
        if found is not None:
            return found
    return unrecognized(name, block, dims)

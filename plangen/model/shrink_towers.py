"""The sizes of vision and audio towers in a tiny config (:mod:`plangen.model.shrink`), set so that the
numerical checks can run them on their 8 token ids (:mod:`plangen.model.tower_inputs`).

A tower's input makes a number of placeholder tokens in the text (its patches or frames, merged);
at the original sizes that is hundreds per image, more than the checks' sequence holds. Only the
configs of the towers the checks run are touched, recognised by the keys that set that count.
"""

from __future__ import annotations

from typing import Any

# Convolution widths that equal the hidden size in the original and must stay equal to it (Phi-4-
# multimodal's conformer: its GLU conv's output feeds a depthwise conv of hidden-size channels).
_HIDDEN_WIDE_CONV_KEYS = ("ext_pw_out_channel", "depthwise_separable_out_channel", "nemo_conv_channels")


def shrink_tower_sizes(values: dict[str, Any], original: dict[str, Any], hidden: int, intermediate: int) -> None:
    """Shrink, in place, the sizes of one config level that set how many tokens its tower makes
    (``hidden`` and ``intermediate``: the level's tiny widths)."""
    patch = values.get("patch_size")
    if "global_attn_indexes" in values and isinstance(patch, int):
        # A SAM-style windowed ViT (GOT-OCR2's): 4 x 4 patches in windows of 2 (its global and windowed
        # layers on 16 tokens, not 4096; GOT-OCR2's two stride-2 convs make one image token of them);
        # weights drawn at 0.02, not its 1e-10, so that the pixels matter.
        values.update(image_size=4 * patch, window_size=2, mlp_dim=intermediate, initializer_range=0.02)
    if "crop_size" in values and isinstance(patch, int):
        # Phi-4-multimodal's SigLIP crops: 2 x 2 patches, pooled 2 x 2 into one token per crop.
        values.update(image_size=2 * patch, crop_size=2 * patch)
    if "nemo_conv_channels" in values:
        # Phi-4-multimodal's conformer: weights drawn at 0.1, not 0.02, so that its subsampling convs
        # (9 taps of one channel, then depthwise) do not shrink the features to 1e-6, which each layer's
        # closing LayerNorm turns into gradients of 1e3 (rounding far above the checks' 1e-5).
        values["initializer_range"] = 0.1
    for name in _HIDDEN_WIDE_CONV_KEYS:
        if name in values and original.get(name) == original.get("hidden_size"):
            values[name] = hidden

"""Inputs that run a model's vision or audio tower in a numerical check: pixel values for an image
encoder, mel features for an audio tower, with their placeholders in the token ids.

A tower that only text reaches is never run, so its sharding would go unproven (its parameters get
no gradient on either side). The parity cases (tests/distributed/cases.py, which the sweep runs)
give the classes listed here one image or one audio chunk per row, so their towers' outputs and
gradients are compared too; the synthesizer shards a tower with its own config only for these
classes (:mod:`plangen.plans.synthesis.towers`). Keyed by class name; every tensor has one row per row of
``ids``, so a DP rank takes its rows of each.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Builder = Callable[[Any, torch.Tensor, torch.Generator], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _git(model: Any, ids: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # Git prepends the projected patches to the text: its logits cover them too (cropped by text_logits).
    size, channels = model.config.vision_config.image_size, model.config.vision_config.num_channels
    return ids, {"pixel_values": torch.randn(ids.shape[0], channels, size, size, generator=gen)}


def _moss(model: Any, ids: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # One Whisper window per row, its valid length chosen so that it merges into one audio token,
    # which replaces one placeholder id of the row.
    config, audio = model.config, model.config.audio_config
    frames = audio.max_source_positions * 2  # both convolutions' strides: 1 and 2
    features = torch.randn(ids.shape[0], audio.num_mel_bins, frames, generator=gen)
    valid = torch.zeros(ids.shape[0], frames, dtype=torch.long)
    valid[:, : 2 * config.audio_merge_size - 1] = 1  # (valid - 1) // 2 + 1 = merge size: one token
    ids = ids.clone()
    ids[:, 1] = config.audio_token_id
    return ids, {"input_features": features, "input_features_mask": valid}


def _got_ocr2(model: Any, ids: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # One image per row; its features (the neck's map after the projector's two stride-2 convs: one
    # token for the tiny model's 4 x 4 patches) replace the row's placeholders, from its second id.
    vision = model.config.vision_config
    pixels = torch.randn(ids.shape[0], vision.num_channels, vision.image_size, vision.image_size, generator=gen)
    with torch.no_grad():  # how many tokens one image makes: the towers' own arithmetic, not a copy of it
        tokens = model.model.get_image_features(pixel_values=pixels[:1]).pooler_output.shape[1]
    ids = ids.clone()
    ids[:, 1 : 1 + tokens] = model.config.image_token_id
    return ids, {"pixel_values": pixels}


def _phi4_multimodal(
    model: Any, ids: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # One image (one crop of the image's own size, with the global view: two crops) and one audio
    # chunk per row. The image's tokens are the crop's and the global view's pooled patches, each row
    # of them closed by a separator, and one more between the two; the audio's two tokens are the
    # conformer's frames after its time reduction (two, so that its attention and its per-head
    # relative bias get a gradient: over one key the softmax is constant).
    vision, audio = model.config.vision_config, model.config.audio_config
    rows, crop = ids.shape[0], vision.crop_size
    side = int(model.model.embed_tokens_extend.image_embed.num_img_tokens**0.5)  # pooled patches per side
    image_tokens = 2 * side * (side + 1) + 1
    patches = crop // vision.patch_size
    audio_tokens = 2
    frames = audio_tokens * audio.time_reduction
    ids = ids.clone()
    # Drawn ids may hit a placeholder (the hand-written parity cases draw from the whole vocabulary),
    # which would ask for features no input gives: made plain text.
    ids[(ids == vision.image_token_id) | (ids == audio.audio_token_id)] = 0
    ids[:, 1 : 1 + image_tokens] = vision.image_token_id
    ids[:, 1 + image_tokens : 1 + image_tokens + audio_tokens] = audio.audio_token_id
    return ids, {
        "image_pixel_values": torch.randn(rows, 2, vision.num_channels, crop, crop, generator=gen),
        "image_sizes": torch.tensor([[crop, crop]] * rows),
        "image_attention_mask": torch.ones(rows, 2, patches, patches, dtype=torch.long),
        "audio_input_features": torch.randn(rows, frames, audio.input_size, generator=gen),
        "audio_embed_sizes": torch.full((rows,), audio_tokens),
        "audio_attention_mask": torch.ones(rows, frames, dtype=torch.bool),
    }


TOWER_INPUTS: dict[str, Builder] = {
    "Phi4MultimodalForCausalLM": _phi4_multimodal,
    "GotOcr2ForConditionalGeneration": _got_ocr2,
    "GitForCausalLM": _git,
    "MossTranscribeDiarizeForConditionalGeneration": _moss,
}


def build_tower_inputs(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(ids with any placeholders, the tower inputs) for ``model``'s class; no inputs for the rest."""
    builder = TOWER_INPUTS.get(type(model).__name__)
    return builder(model, ids, torch.Generator().manual_seed(2)) if builder else (ids, {})


def text_logits(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The logits at the text positions: the last ``ids.shape[1]`` (Git puts its patches first); the
    logits themselves where they are the text's only."""
    return logits if logits.shape[1] == ids.shape[1] else logits[:, -ids.shape[1] :]

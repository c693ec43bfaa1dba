"""Inputs that run a model's vision or audio tower in a numerical check: pixel values for an image
encoder, mel features for an audio tower, with their placeholders in the token ids.

A tower that only text reaches is never run, so its sharding would go unproven (its parameters get
no gradient on either side). The parity cases (tests/distributed/cases.py, which the sweep runs)
give the classes listed here one image or one audio chunk per row, so their towers' outputs and
gradients are compared too; the synthesizer shards a tower with its own config only for these
classes (:mod:`plangen.plans.towers`). Keyed by class name; every tensor has one row per row of
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


TOWER_INPUTS: dict[str, Builder] = {
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
    return logits if logits.shape[1] == ids.shape[1] else logits[:, -ids.shape[1]:]

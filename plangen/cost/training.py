"""The config settings a training step runs with where a class's defaults are generation's.

``--peak`` (:mod:`plangen.cost.peak`) traces one training step of the real config; shrunk configs
(:mod:`plangen.model.shrink`) already set ``use_cache=False``. What a training run sets that the
defaults do not is here, once, by model type.
"""

from __future__ import annotations

import copy
from typing import Any

from plangen.model.resolve import text_config

# By model_type. xLSTM: mode "inference" runs chunkwise kernels that fail in bf16 on a chunk of tokens or
# more (in transformers itself: "expected m1 and m2 to have the same dtype"), "train" is what training
# runs; and with use_cache its model allocates the recurrent state for every head (config.num_heads),
# not this rank's ("The expanded size of the tensor (4) must match the existing size (8)").
# Not use_cache=False for every class, as NeMo RL's training loop passes it: it changes how Llama's
# causal mask is made, and with it every traced peak (docs/cost.md: to measure and document apart).
TRAINING_SETTINGS: dict[str, dict[str, Any]] = {"xlstm": {"mode": "train", "use_cache": False}}


def training_config(config: Any) -> Any:
    """``config`` with its class's :data:`TRAINING_SETTINGS` (a copy; itself where it has none)."""
    settings = TRAINING_SETTINGS.get(getattr(text_config(config), "model_type", None), {})
    if not settings:
        return config
    config = copy.deepcopy(config)
    for key, value in settings.items():
        setattr(text_config(config), key, value)
    return config

"""What differs between the transformers releases plangen runs on, in one place.

Every fact here is read from the installed transformers (its source, its config classes), never
from a version number alone, and is written down per release as found in each one's modeling code:

* **Experts' sentinel routes.** :class:`plangen.moe_styles.ExpertsParallel` (whole experts per
  rank) hands another rank's routes to the experts as the sentinel id ``E / tp`` with weight 0.
  From the release whose experts interface knows expert parallelism (``_is_expert_parallel``,
  set by ``use_experts_implementation``; 5.24.0 and 5.25.0 have it) every experts forward
  (``grouped_mm``, ``batched_mm``, eager) computes those routes as zero exactly. Before it:

  - 5.5.x ``grouped_mm`` (the default): no sentinel handling at all. The sorted sentinel rows lie
    past the last group, where the kernel writes nothing: forward rows of uninitialised memory
    (times weight 0: NaN or garbage), their input gradient uninitialised and scattered into the
    hidden states' (Qwen3-MoE's ``embed_tokens.weight`` gradient off by 1e+30), and a biased
    expert's per-row bias gathered at id ``E / tp``, out of range (gpt-oss: ``IndexError``).
  - 5.8.x ``grouped_mm``: a mask before the up projection and after the weighting, none between:
    the down projection's input gradient at the sentinel rows is uninitialised, and a biased
    expert's ``gate_up_proj_bias``, gathered per row, sums it (gpt-oss: its gradient silently
    wrong, 8.2e-2 to 1e+36). ``batched_mm`` clamps the caller's index tensor in place.
  - eager forwards (``one_hot(top_k_index, num_classes=self.num_experts)``) reject the sentinel.

  There :func:`experts_take_sentinels` is False and the style runs the experts on this rank's
  routes alone, gathered into a shorter batch of one route per row and scattered back
  (no sentinel ever reaches transformers' code: right on every release, whatever forward).

* **Hybrid layer kinds.** NemotronH and Zamba2 name each layer's kind in ``layers_block_type``:
  5.5.x and 5.8.x ``"mamba"`` / ``"attention"``, 5.24.0 on ``"linear_attention"`` /
  ``"full_attention"`` (transformers' own ``_LEGACY_LAYER_TYPE_REMAP``, which also reads old
  configs). Plans read the kinds through :func:`layer_kinds` (the newer names whatever built
  the config); configs written by plangen or its tests spell them as the installed config
  class does (:func:`installed_layer_kinds`: its own default's spelling).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

# The Mamba/attention kinds' older names (5.5.x-5.8.x), as transformers' remap (5.24.0 on) maps them.
LEGACY_LAYER_KINDS = {"mamba": "linear_attention", "attention": "full_attention"}


@functools.cache
def experts_take_sentinels() -> bool:
    """Whether the installed transformers' experts forwards compute the sentinel route id
    (``num_experts``, weight 0) exactly: its experts interface knows expert parallelism."""
    try:
        from transformers.integrations import moe
    except ImportError:  # no experts interface at all
        return False
    try:
        source = inspect.getsource(moe)
    except (OSError, TypeError):
        return False
    return "_is_expert_parallel" in source


def _layer_kind_remap() -> dict[str, str]:
    try:
        from transformers.configuration_utils import _LEGACY_LAYER_TYPE_REMAP
    except ImportError:  # 5.5.x-5.8.x: no remap, the older names are the names
        return dict(LEGACY_LAYER_KINDS)
    return {**LEGACY_LAYER_KINDS, **_LEGACY_LAYER_TYPE_REMAP}


def layer_kind(kind: str) -> str:
    """``kind`` in the newer name (``"mamba"`` -> ``"linear_attention"``), others unchanged."""
    return _layer_kind_remap().get(kind, kind)


def layer_kinds(config: Any, attribute: str = "layers_block_type") -> list[str]:
    """The config's per-layer kinds in the newer names, whichever release built it."""
    return [layer_kind(k) for k in getattr(config, attribute)]


@functools.cache
def _spells_legacy(config_class: type, attribute: str) -> bool:
    try:
        default = getattr(config_class(), attribute, None) or []
    except Exception:  # noqa: BLE001 - a config class that needs arguments: assume the newer names
        return False
    return any(kind in LEGACY_LAYER_KINDS for kind in default)


def installed_layer_kinds(config_class: type, kinds: list[str], attribute: str = "layers_block_type") -> list[str]:
    """``kinds`` (newer names) as the installed ``config_class`` spells them: the older names where
    its own default uses them (5.5.x-5.8.x, whose validation rejects the newer ones)."""
    if not _spells_legacy(config_class, attribute):
        return list(kinds)
    back = {new: old for old, new in LEGACY_LAYER_KINDS.items()}
    return [back.get(k, k) for k in kinds]


__all__ = ["LEGACY_LAYER_KINDS", "experts_take_sentinels", "installed_layer_kinds", "layer_kind", "layer_kinds"]

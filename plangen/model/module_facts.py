"""What a Hugging Face module states about its heads and its weights' layout, and the one way a
style changes its head counts (:func:`apply_head_counts`).

Below every style module (fused, KV-head, padded-head and attention styles all read these facts),
so none of them has to import another for them.
"""

from __future__ import annotations

from typing import Any


def attention_head_counts(attention: Any) -> tuple[int, int, int] | None:
    """(heads, KV heads, head_dim) of a Hugging Face attention module, read from its config; None if absent."""
    config = getattr(attention, "config", None)
    head_dim = getattr(attention, "head_dim", None)
    heads = getattr(config, "num_attention_heads", None)
    if not heads or not isinstance(head_dim, int):
        return None
    return heads, getattr(config, "num_key_value_heads", None) or heads, head_dim


def head_count_owner(module: Any, attribute: str) -> tuple[Any, str]:
    """Where a head-count attribute lives: ``"config.X"`` on the module's config, else on the module."""
    return (module.config, attribute[len("config.") :]) if attribute.startswith("config.") else (module, attribute)


def apply_head_counts(module: Any, counts: dict[str, int]) -> None:
    """Give ``module`` the head counts ``counts`` (attribute -> value, :func:`head_count_owner`'s
    names): set on the module itself, or on a :class:`ConfigView` of its config, so the model's own
    config, which other modules read, keeps the whole counts."""
    overrides: dict[str, int] = {}
    for attribute, value in counts.items():
        owner, name = head_count_owner(module, attribute)
        if owner is module:
            setattr(module, name, value)
        else:
            overrides[name] = value
    if overrides:
        module.config = ConfigView(module.config, overrides)


def is_conv1d(module: Any) -> bool:
    """GPT-2's ``Conv1D`` (transformers.pytorch_utils): an ``nn.Linear`` with its weight stored ``[in, out]``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def output_dim(module: Any, param_name: str) -> int:
    """The dim of a projection's parameter that runs over its output features."""
    # nn.Linear keeps [out, in]; GPT-2's Conv1D keeps its weight transposed, [in, out]. Biases are [out].
    return 1 if param_name == "weight" and is_conv1d(module) else 0


class ConfigView:
    """A config with a few attributes overridden; every other attribute read or written is the base's."""

    def __init__(self, base: Any, overrides: dict[str, Any]) -> None:
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_overrides", dict(overrides))

    def __getattr__(self, name: str) -> Any:
        # Only called for names not on the view itself; guard copies/unpickling before __init__ ran.
        state = self.__dict__
        if name in state.get("_overrides", {}):
            return state["_overrides"][name]
        if "_base" not in state:
            raise AttributeError(name)
        return getattr(state["_base"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._base, name, value)

    def __repr__(self) -> str:
        return f"ConfigView({self._overrides}, of {type(self._base).__name__})"

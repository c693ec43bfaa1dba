"""The sizes recognizers compare shapes against, and the leaf tests they share.

Apart from :mod:`plangen.plans.families.core` so that the recognizers of single mixers
(:mod:`~plangen.plans.families.linear_attention` and the Mamba ones) read them without importing
the block recognizer that dispatches to them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from plangen.model.resolve import text_config


@dataclass(frozen=True)
class ModelDims:
    """What the recognizers compare shapes against (the text config's sizes)."""

    hidden: int
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    vocab: int | None
    experts: int | None


def _config_int(config: Any, *names: str) -> int | None:
    for name in names:
        try:  # per-layer configs raise on ambiguous global attributes
            value = getattr(config, name, None)
        except Exception:  # noqa: BLE001 - any failure means "not stated"
            value = None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def read_dims(model: nn.Module) -> ModelDims | None:
    """The text decoder's sizes, or None when the config states no hidden size."""
    return dims_of_config(text_config(getattr(model, "config", None)))


def dims_of_config(config: Any) -> ModelDims | None:
    """The sizes one config states (a text decoder's, or a vision or audio tower's), or None when
    it states no hidden size."""
    hidden = _config_int(config, "hidden_size", "d_model", "n_embd")
    if hidden is None:
        return None
    heads = _config_int(config, "num_attention_heads", "n_head", "num_heads")
    kv_heads = _config_int(config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num") or heads
    head_dim = _config_int(config, "head_dim") or (hidden // heads if heads and hidden % heads == 0 else None)
    return ModelDims(
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=_config_int(config, "vocab_size"),
        experts=_config_int(config, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    )


def layer_dims(model: nn.Module, dims: ModelDims, layer: nn.Module) -> ModelDims:
    """``dims`` as decoder ``layer`` sees them: a heterogeneous config (transformers'
    ``per_layer_config``: Gemma 4's full-attention layers have twice the sliding ones' head_dim)
    states head sizes per layer, and its global ``head_dim`` is ambiguous (it raises). Read from the
    layer's attention module (its ``head_dim`` and ``num_key_value_groups``), not the config by
    index: a sample of the layers (plangen list's) renumbers them."""
    if getattr(text_config(getattr(model, "config", None)), "per_layer_config", None) is None:
        return dims
    for module in layer.modules():
        head_dim, groups = getattr(module, "head_dim", None), getattr(module, "num_key_value_groups", None)
        if isinstance(head_dim, int) and head_dim > 0 and isinstance(groups, int) and groups > 0 and dims.heads:
            return replace(dims, head_dim=head_dim, kv_heads=dims.heads // groups)
    return dims


# ---------------------------------------------------------------------------------------------
# Leaves


def own_parameters(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.named_parameters(recurse=False)}


def has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def is_linear(module: nn.Module) -> bool:
    # torch's Colwise/RowwiseParallel shard nn.Linear (and subclasses); GPT-2's Conv1D stores the
    # weight transposed and is not one. Nor is BitNet's quantised AutoBitLinear (how its checkpoints
    # load): it scales by statistics over the whole weight and each token's whole input, which a
    # rank's shard does not hold (row-parallel, its logits came out as far off as they are large).
    return isinstance(module, nn.Linear) and not _is_quantised_bitnet(module)


def _is_quantised_bitnet(module: nn.Module) -> bool:
    try:
        from transformers.integrations.bitnet import AutoBitLinear
    except ImportError:  # pragma: no cover - an older transformers without it
        return False
    return isinstance(module, AutoBitLinear)


def is_per_feature(module: nn.Module, width: int) -> bool:
    """A leaf whose every parameter is one value per feature of a ``width``-wide input (a norm's weight, bias)."""
    if any(has_parameters(child) for child in module.children()):
        return False
    shapes = list(own_parameters(module).values())
    return bool(shapes) and all(shape == (width,) for shape in shapes)


def wrapped_linear(module: nn.Module) -> tuple[str, nn.Linear] | None:
    """``(name, linear)`` where ``module`` only wraps one ``nn.Linear`` (Moshi's ``MoshiLinear`` at
    ``use_flexible_linear=False``: its one child ``linear``, nothing else of its own); else None."""
    children = list(module.named_children())
    if is_linear(module) or len(children) != 1 or own_parameters(module) or list(module.buffers(recurse=False)):
        return None
    ((name, child),) = children
    return (name, child) if is_linear(child) else None


def describe(name: str, module: nn.Module) -> str:
    """``name (Class: param (shape), ...)``: how findings name a module."""
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in own_parameters(module).items())
    return f"{name} ({type(module).__name__}{': ' + shapes if shapes else ''})"


def sequential_readers(block: nn.Module) -> frozenset[str] | None:
    """An ``nn.Sequential`` applies its children in order: the first reads the input (CTRL's MLP)."""
    if type(block) is not nn.Sequential:
        return None
    first = next((name for name, _ in block.named_children()), None)
    return frozenset({first}) if first is not None else frozenset()

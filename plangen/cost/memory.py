"""Per-rank training state of a model whose TP plan is applied (on the meta device).

After TP each parameter is a DTensor (or a plain tensor the plan left whole); its local shard is
what one TP rank holds. FSDP2 then shards every parameter over DP on the dim the runtime gives it
(:func:`plangen.runtime.fsdp_shard.fsdp_shard_dim`: dim 0, padded to a multiple of the DP size, unless that
pads more than 1 % of it, as with one expert per TP rank or 7 experts over DP 2, where another dim
splits evenly), so one rank holds ``ceil(size[d] / dp) x rest`` elements of each. Gradients
have the parameters' layout; AdamW keeps two states of the same layout (exp_avg, exp_avg_sq). The
figures are rank 0's, the largest when shards are uneven.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from torch import nn

from plangen.cost.data import MemoryCost
from plangen.cost.settings import CostSettings
from plangen.runtime.fsdp_shard import fsdp_shard_dim
from plangen.model.module_tree import key_matches
from plangen.plan import Replicated

ADAMW_STATES = 2


@dataclass(frozen=True)
class ParameterShard:
    name: str
    global_numel: int
    tp_shape: tuple[int, ...]  # the local shape on one TP rank
    tp_sharded: bool

    def fsdp_numel(self, dp_size: int) -> int:
        """Elements one rank holds after FSDP2 shards the runtime's dim (dim 0 padded to a multiple of ``dp_size``)."""
        if not self.tp_shape:
            return 1
        dim = fsdp_shard_dim(self.tp_shape, dp_size)
        rest = math.prod(size for d, size in enumerate(self.tp_shape) if d != dim)
        return math.ceil(self.tp_shape[dim] / dp_size) * rest

    def padded_numel(self, dp_size: int) -> int:
        """Elements of the TP shard as FSDP2 gathers it: its shard dim padded to a multiple of ``dp_size``."""
        return self.fsdp_numel(dp_size) * dp_size


def read_parameter_shards(module: nn.Module) -> list[ParameterShard]:
    """Every parameter of ``module`` once (tied ones once), with its TP-local shape."""
    from torch.distributed.tensor import DTensor

    from plangen.styles.padded_heads import hugging_face_shape

    shards = []
    for name, param in module.named_parameters():
        if isinstance(param, DTensor):
            local = tuple(param.to_local().shape)
            sharded = any(p.is_shard() for p in param.placements)
        else:
            local, sharded = tuple(param.shape), False
        # The model's own elements: zero heads padding the query heads (plangen.styles.padded_heads) are held
        # (the local shape) but are not the model's, so the ideal does not count them.
        whole = math.prod(hugging_face_shape(module, name, tuple(param.shape)))
        shards.append(ParameterShard(name, whole, local, sharded))
    return shards


def sharded_fraction(model: nn.Module, repeats: Mapping[str, int] | None = None) -> float:
    """The share of ``model``'s parameter elements that TP shards (held as a DTensor with a Shard placement).

    By element count, over every parameter once (tied ones once); 0 for a model without parameters.
    ``repeats``: submodule name -> how many identical submodules it stands for, when the copies were
    left out of the model to save time (:func:`plangen.commands.catalog.build_sharded_fraction`).
    """
    repeats = repeats or {}

    def weight(name: str) -> int:
        return next((n for prefix, n in repeats.items() if name.startswith(prefix + ".")), 1)

    shards = read_parameter_shards(model)
    whole = sum(weight(s.name) * s.global_numel for s in shards)
    sharded = sum(weight(s.name) * s.global_numel for s in shards if s.tp_sharded)
    return sharded / whole if whole else 0.0


def read_left_whole(
    model: nn.Module, replicated: Iterable[Replicated], repeats: Mapping[str, int] | None = None
) -> list[tuple[str, float, str]]:
    """What TP leaves whole on every rank, grouped by the plan's :class:`~plangen.plan.Replicated`
    entries: ``(pattern, share of the parameters, why)``, largest first. Parameters under no entry
    are grouped as ``"other"`` with no reason."""
    repeats = repeats or {}
    entries = list(replicated)

    def weight(name: str) -> int:
        return next((n for prefix, n in repeats.items() if name.startswith(prefix + ".")), 1)

    def entry_of(name: str) -> Replicated | None:
        parts = name.split(".")
        owners = [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]  # nearest module first
        return next((e for owner in owners for e in entries if key_matches(e.pattern, owner)), None)

    shards = read_parameter_shards(model)
    whole = sum(weight(s.name) * s.global_numel for s in shards) or 1
    groups: dict[tuple[str, str], int] = {}
    for shard in shards:
        if not shard.tp_sharded:
            entry = entry_of(shard.name)
            key = (entry.pattern, entry.why) if entry else ("other", "")
            groups[key] = groups.get(key, 0) + weight(shard.name) * shard.global_numel
    found = [(pattern, numel / whole, why) for (pattern, why), numel in groups.items()]
    return sorted(found, key=lambda item: -item[1])


def build_memory_cost(shards: list[ParameterShard], settings: CostSettings) -> MemoryCost:
    dp, tp, element = settings.dp_size, settings.tp_size, settings.master_bytes
    local = sum(s.fsdp_numel(dp) for s in shards)
    replicated = sum(s.fsdp_numel(dp) for s in shards if not s.tp_sharded)
    whole = sum(s.global_numel for s in shards)
    copies = 1 + 1 + ADAMW_STATES  # parameter, gradient, optimizer states
    return MemoryCost(
        parameters=local * element,
        gradients=local * element,
        optimizer=ADAMW_STATES * local * element,
        replicated=copies * replicated * element,
        ideal=round(copies * whole * element / (dp * tp)),
        model_parameters=whole,
        local_parameters=local,
        tp_sharded_parameters=sum(s.global_numel for s in shards if s.tp_sharded),
    )

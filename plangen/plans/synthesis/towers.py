"""Further stacks of attention + MLP layers outside the text decoder: vision and audio encoders
(Git's image encoder, Moss's audio tower) and second decoder stacks (HRM's ``H_module``).

Their layers are sharded with the decoder's styles: attention by heads (non-causal attention splits
over heads exactly as causal attention does), MLPs by their intermediate, each block's output
all-reduced. They stay tensor-parallel only: under sequence parallelism their sequence (patches,
audio frames) is not the decoder's, so their blocks take and return whole activations.

A tower with a config of its own (vision, audio) is sharded only for the classes whose check feeds
it inputs (:data:`plangen.model.tower_inputs.TOWER_INPUTS`): the sweep proves a plan by running it, and
text alone never reaches such a tower. The others keep it whole, saying so.

What a tower holds outside its layers (patch and position embeddings, convolutions, its norms)
stays whole: it runs once per input, not once per layer, and is small beside the layers.

Apart from :mod:`plangen.plans.synthesis.analysis` (which hands in its layer walker) so that module stays
within its size; this one imports nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from plangen.plan import Replicated
from plangen.plans.families.dims import ModelDims, dims_of_config, has_parameters
from plangen.plans.synthesis.findings import BlockPart, Findings
from plangen.plans.families.core import ShardedBlock
from plangen.plans.families.split import SplitBlock
from plangen.model.tower_inputs import TOWER_INPUTS

__all__ = ["Towers", "analyze_towers", "tower_kept_reason"]

# (layer, its path, the tower's sizes, where to record) -> None: analysis._analyze_layer.
LayerWalker = Callable[[nn.Module, str, ModelDims, Findings], None]

# The blocks a tower's layers may shard: the plain ones, whose styles need no decoder-wide state
# (no routing, no recurrent state, no per-head inputs handed in by the decoder).
_TOWER_BLOCKS = (ShardedBlock, SplitBlock)


@dataclass(frozen=True)
class TowerStack:
    path: str  # the ModuleList of the tower's layers
    owner: str  # the outermost module holding it but not the text decoder (git.image_encoder)
    dims: ModelDims  # the tower's own sizes (its config's), the text decoder's where it has none
    modal: bool  # it has a config of its own (vision, audio): text alone does not reach it


@dataclass
class Towers:
    stacks: list[TowerStack] = field(default_factory=list)
    blocks: list[BlockPart] = field(default_factory=list)
    kept: list[Replicated] = field(default_factory=list)
    # The outermost module of each tower -> why what it holds outside its sharded layers (or, for a
    # tower left whole, all of it) stays whole.
    reasons: dict[str, str] = field(default_factory=dict)


def _inside(path: str, outer: str) -> bool:
    return outer == "" or path == outer or path.startswith(outer + ".")


def _owner(path: str, decoder_path: str) -> str:
    """The outermost ancestor of ``path`` (below the root) that does not hold the decoder layers."""
    parts = path.split(".")
    for depth in range(1, len(parts) + 1):
        candidate = ".".join(parts[:depth])
        if not _inside(decoder_path, candidate):
            return candidate
    return path


def _tower_dims(model: nn.Module, path: str, text: ModelDims) -> tuple[ModelDims, bool]:
    """The sizes of the nearest config on the way up from ``path`` (a vision or audio config), else the
    text decoder's (a second stack of the decoder itself: the model's own config)."""
    parts = path.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        config = getattr(model.get_submodule(".".join(parts[:depth])), "config", None)
        dims = dims_of_config(config) if config is not None and config is not getattr(model, "config", None) else None
        if dims is not None:
            return dims, True
    return text, False


def _candidate_stacks(model: nn.Module, decoder_path: str) -> list[tuple[str, nn.ModuleList]]:
    found: list[tuple[str, nn.ModuleList]] = []
    for name, module in model.named_modules():
        if not (isinstance(module, nn.ModuleList) and len(module) and all(has_parameters(c) for c in module)):
            continue
        if _inside(name, decoder_path) or _inside(decoder_path, name):
            continue
        if len({type(c) for c in module}) != 1 or any(name.startswith(p + ".") for p, _ in found):
            continue  # one kind of layer per stack; lists inside a tower's layers are the layers' business
        found.append((name, module))
    return found


def analyze_towers(model: nn.Module, decoder_path: str, text: ModelDims, walk: LayerWalker) -> Towers:
    """Every further stack of layers in which ``walk`` recognises an attention or MLP block to shard."""
    towers = Towers()
    unrun: dict[str, list[str]] = {}  # owner -> its towers the check cannot run
    for path, layers in _candidate_stacks(model, decoder_path):
        dims, modal = _tower_dims(model, path, text)
        found = Findings()
        for index, layer in enumerate(layers):
            walk(layer, f"{path}.{index}", dims, found)
        sharded = [part for part in found.blocks if isinstance(part.block, _TOWER_BLOCKS)]
        if not sharded:
            continue
        owner = _owner(path, decoder_path)
        if modal and type(model).__name__ not in TOWER_INPUTS:
            unrun.setdefault(owner, []).append(f"{type(layers[0]).__name__} layers at {path}")
            towers.reasons[owner] = (
                "{cls} holds towers (" + "; ".join(unrun[owner]) + ") that the numerical check cannot run (no "
                "inputs built for them in plangen.model.tower_inputs): sharded, they would be unproven"
            )
            continue
        towers.stacks.append(TowerStack(path, owner, dims, modal))
        towers.reasons[owner] = (
            "{cls}, in the " + owner + " tower outside its sharded layers (patch or position embeddings, "
            "convolutions, norms): whole on every rank, run once per input, not once per layer"
        )
        towers.blocks += sharded
        towers.kept += found.kept
        towers.kept += [
            Replicated(
                part.path,
                "a block of a tower that only plain attention and MLP styles "
                "shard (no routing or recurrent state outside the text decoder)",
                "other",
            )
            for part in found.blocks
            if not isinstance(part.block, _TOWER_BLOCKS)
        ]
        towers.kept += [
            Replicated(norm, "a tower's norm, on its whole hidden state on every rank: nothing to shard", "norms")
            for norm in found.norms
        ]
    return towers


def tower_kept_reason(path: str, module: nn.Module, reasons: dict[str, str]) -> str | None:
    """Why a module of a tower outside its sharded layers stays whole, or None where ``path`` is in no tower."""
    owner = next((o for o in reasons if _inside(path, o)), None)
    return None if owner is None else reasons[owner].format(cls=type(module).__name__)

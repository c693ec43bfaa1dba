"""Apply a plan with TP: the one step the runtime, ``plangen cost`` and ``plangen verify --run`` share.

    LoRA -> tie -> check -> parallelize_module -> re-tie

A plan written for the base model is first translated onto its peft LoRA layers, if it has any
(:func:`plangen.runtime.lora.resolve_lora_styles`: base layers and adapters placed to match).
Tied embeddings first get a vocabulary sharding at both ends (a plan may shard one end only), the
plan is checked against the model before anything is sharded (every rank fails the same way, before
any rank communicates), then torch applies it, and the embedding and head that ``parallelize_module``
split into two parameters become one again.
"""

from __future__ import annotations

from typing import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from plangen.runtime.lora import resolve_lora_styles
from plangen.plans.checks import PlanError, check_packed_without_fsdp, check_plan_fits, resolve_tied_styles
from plangen.model.module_tree import tied_embeddings


def apply_tp(
    model: nn.Module, tp_mesh: DeviceMesh, styles: Mapping[str, ParallelStyle], *, dp_size: int = 1
) -> dict[str, ParallelStyle]:
    """Shard ``model`` over ``tp_mesh`` with ``styles``; returns the styles applied (ties completed).

    ``dp_size``: the FSDP2 size the model will be sharded over next (packed projections refuse it).
    Raises :class:`~plangen.plans.checks.PlanError` before changing anything when the plan does not fit.
    """
    styles = resolve_lora_styles(model, styles, tp_mesh.size())
    styles = resolve_tied_styles(model, styles)
    check_plan_fits(model, styles, tp_mesh.size())
    check_packed_without_fsdp(model, styles, dp_size)
    tied = tied_embeddings(model)
    shared = find_shared_parameters(model)
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    parallelize_module(model, tp_mesh, styles)
    apply_frozen(model, frozen)
    if tied is not None:
        apply_retie(model, *tied)
    apply_shared_retie(model, shared)
    return styles


def find_shared_parameters(model: nn.Module) -> list[list[tuple[str, str]]]:
    """(module path, name) of every parameter that several modules hold: BERT's output bias is both
    ``cls.predictions.bias`` and ``cls.predictions.decoder.bias``."""
    holders: dict[int, list[tuple[str, str]]] = {}
    for path, module in model.named_modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((path, name))
    return [group for group in holders.values() if len(group) > 1]


def apply_shared_retie(model: nn.Module, shared: list[list[tuple[str, str]]]) -> None:
    """A parameter that several modules held is one again: ``parallelize_module`` replaced it where a
    style sharded it and left the stale original at the others (two holders sharded alike get one of
    the two copies, so their gradients add up as in the unsharded model)."""
    for group in shared:
        held = {id(p): p for p in (getattr(model.get_submodule(path), name) for path, name in group)}
        if len(held) == 1:
            continue
        sharded = [p for p in held.values() if isinstance(p, DTensor)]
        layouts = {(tuple(p.placements), tuple(p.shape)) for p in sharded}
        # The one plain tensor left is the stale original; sharded two ways, no one parameter can be both.
        if len(layouts) != 1:
            names = ", ".join(f"{path}.{name}" if path else name for path, name in group)
            raise PlanError(f"shared parameter {names} got different layouts: shard it in one place only")
        for path, name in group:
            setattr(model.get_submodule(path), name, sharded[0])


def apply_frozen(model: nn.Module, frozen: set[str]) -> None:
    """Frozen weights stay frozen: torch's ``SequenceParallel`` (and so ``ReplicatedWithGradAllReduce``)
    makes each weight it replicates a new, trainable ``nn.Parameter``; a frozen norm (LoRA freezes the
    whole base model) would then get a gradient, a gradient reduction, and optimizer steps."""
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)


def apply_retie(model: nn.Module, emb_path: str, head_path: str) -> None:
    """``parallelize_module`` replaces each weight by its own DTensor parameter: make them one again.

    Nothing to do after the tied pair of styles (:mod:`plangen.styles.tied`), which shares one."""
    emb, head = model.get_submodule(emb_path), model.get_submodule(head_path)
    if head.weight is emb.weight:
        return
    e, h = emb.weight, head.weight
    same_layout = (
        isinstance(e, DTensor) == isinstance(h, DTensor)
        and e.shape == h.shape
        and (not isinstance(e, DTensor) or tuple(e.placements) == tuple(h.placements))
    )
    if not same_layout:
        raise PlanError(
            f"tied weights {emb_path}.weight and {head_path}.weight got different layouts "
            f"({getattr(e, 'placements', 'plain')} vs {getattr(h, 'placements', 'plain')}): shard both on the vocabulary"
        )
    head.weight = emb.weight

"""The runtime: apply a parallel plan through DTensor TP, then FSDP2.

A drop-in for NeMo RL's ``nemo_rl.models.dtensor.parallelize`` (same names and signatures, its
misspelled aliases included), correct where that one is not: tied embeddings stay tied, per-head
norms get their gradient summed over TP, the gradient norm counts TP-replicated weights once, and
bad input fails before any collective with the numbers.

Order of work in :func:`parallelize_model`:
  1. resolve the plan (custom > hand-written for the class > synthesized and proven > Hugging Face),
     pure, logged;
  2. check it against the model (keys that match nothing, head counts vs TP size), still local;
  3. apply TP (``parallelize_module``), then re-tie tied embeddings that TP split apart;
  4. activation checkpointing of the decoder layers;
  5. FSDP2: each decoder layer, then the root without resharding after forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from plangen.grad_norm import clip_grad_by_total_norm_, get_grad_norm, to_local_if_dtensor
from plangen.heads import largest_legal_tp_size, tp_size_problem  # noqa: F401 - public here too
from plangen.matching import find_matching_modules, find_unmatched_keys
from plangen.plan_checks import (  # noqa: F401 - shared with plangen verify; importable here as before
    PlanError,
    check_heads_divisible,
    check_packed_without_fsdp,
    check_plan_fits,
    covering_style as _covering_style,
    find_transformer_layers,
    resolve_tied_styles,
    shards_attention as _shards_attention,
    tied_embeddings as _tied_embeddings,
)
from plangen.plan import build_parallel_styles
from plangen.plan_source import PlanLike, load_custom_plan
from plangen.plans import CHECKPOINT_FILTERS, HAND_WRITTEN
from plangen.plans.proven import is_proven
from plangen.plans.synthesize import build_synthesized_plan
from plangen.hf_plan import collect_hf_tp_plan, get_hf_tp_plan
from plangen.styles import RotaryEmbedParallel, translate_parallel_style

logger = logging.getLogger("plangen")

PlanFunction = Callable[[nn.Module, bool], dict[str, ParallelStyle]]


# ---------------------------------------------------------------------------------------------
# Level 2 of the priority: hand-written plans by class, NeMo RL's registry shape.


def _styles_from_registry(class_name: str) -> PlanFunction:
    def plan_function(model: nn.Module, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
        return build_parallel_styles(HAND_WRITTEN[class_name](model, sequence_parallel))

    plan_function.__name__ = f"parallelize_{class_name}"
    return plan_function


def _build_parallelize_functions() -> dict[type, PlanFunction]:
    import transformers

    functions: dict[type, PlanFunction] = {}
    for class_name in HAND_WRITTEN:
        cls = getattr(transformers, class_name, None)
        if cls is not None:
            functions[cls] = _styles_from_registry(class_name)
    return functions


PARALLELIZE_FUNCTIONS: dict[type, PlanFunction] = _build_parallelize_functions()
PARALLIZE_FUNCTIONS = PARALLELIZE_FUNCTIONS  # NeMo RL's spelling


# ---------------------------------------------------------------------------------------------
# 1. Resolve


@dataclass(frozen=True)
class ResolvedPlan:
    styles: dict[str, ParallelStyle]
    source: str  # "custom" | "optimized" | "synthesized" | "hf"
    reason: str


def resolve_parallel_plan(
    model: nn.Module,
    sequence_parallel: bool = False,
    custom_parallel_plan: Optional[PlanLike] = None,
) -> ResolvedPlan:
    """Pick the plan by priority: custom, the class's hand-written ("optimized") plan, the plan
    synthesized from the module tree where the numerical sweep proved it for the class, then
    Hugging Face's; with none of them, a :class:`PlanError` pointing to ``plangen init``."""
    cls = type(model)
    if custom_parallel_plan is not None:
        styles = load_custom_plan(custom_parallel_plan)
        what = custom_parallel_plan if isinstance(custom_parallel_plan, str) else type(custom_parallel_plan).__name__
        return ResolvedPlan(styles, "custom", f"custom_parallel_plan given ({what})")
    if cls in PARALLELIZE_FUNCTIONS:
        styles = PARALLELIZE_FUNCTIONS[cls](model, sequence_parallel)
        return ResolvedPlan(styles, "optimized", f"optimized plan registered for {cls.__name__}")
    if is_proven(cls.__name__, sequence_parallel):
        try:
            plan = build_synthesized_plan(model, sequence_parallel)
        except ValueError as err:  # this instance's config differs in kind from the proven one
            logger.info("plangen: %s", err)
        else:
            return ResolvedPlan(
                build_parallel_styles(plan), "synthesized",
                f"plan synthesized from the module tree of {cls.__name__} (numerically proven for the class)",
            )
    if sequence_parallel:
        raise PlanError(
            f"sequence_parallel=True but {cls.__name__} has no optimized plan (hand-written or proven synthesized) "
            "and Hugging Face plans have no sequence parallel: pass a custom_parallel_plan "
            f"(plangen init {cls.__name__} --sequence-parallel) or sequence_parallel=False"
        )
    try:
        collect_hf_tp_plan(model)
    except ValueError:
        raise PlanError(
            f"no plan for {cls.__name__} at TP>1: write a custom plan with `plangen init {cls.__name__}` and pass "
            "it as custom_parallel_plan (the class has no hand-written plan, no proven synthesized plan and no "
            "Hugging Face plan), or use TP=1"
        ) from None
    styles = get_hf_tp_plan(model)
    return ResolvedPlan(styles, "hf", f"no custom or optimized plan for {cls.__name__}: using its Hugging Face plan")


# ---------------------------------------------------------------------------------------------
# 2. Check (no collectives: every rank fails the same way, before any rank communicates):
# check_plan_fits, check_packed_without_fsdp, in plangen.plan_checks (shared with plangen verify)


# ---------------------------------------------------------------------------------------------
# 3. Apply TP, keeping tied embeddings one parameter (resolve_tied_styles: plangen.plan_checks)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, styles: Mapping[str, ParallelStyle]) -> None:
    tied = _tied_embeddings(model)
    parallelize_module(model, tp_mesh, dict(styles))
    if tied is not None:
        apply_retie(model, *tied)


def apply_retie(model: nn.Module, emb_path: str, head_path: str) -> None:
    """``parallelize_module`` replaces each weight by its own DTensor parameter: make them one again."""
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


def apply_sequence_length_check(model: nn.Module, tp_size: int) -> None:
    """Sequence parallel needs the sequence length to divide by the TP size: say so before it breaks."""

    def check(module: nn.Module, args: tuple, kwargs: dict) -> None:
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if isinstance(tokens, torch.Tensor) and tokens.dim() >= 2 and tokens.shape[1] % tp_size:
            raise ValueError(
                f"sequence parallel: sequence length {tokens.shape[1]} is not divisible by the TP size {tp_size}; "
                "pad the batch to a multiple of it"
            )

    model.register_forward_pre_hook(check, with_kwargs=True)


# ---------------------------------------------------------------------------------------------
# 4-5. Activation checkpointing and FSDP2


def apply_activation_checkpointing(layers: list[nn.Module]) -> None:
    from torch.distributed._composable import checkpoint

    # The composable API keeps parameter names unchanged (a wrapper module would rename them).
    for layer in layers:
        checkpoint(layer)


def apply_fsdp(
    model: nn.Module,
    layers: list[nn.Module],
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    cpu_offload: bool = False,
) -> FSDPModule:
    # Only the root casts its outputs (the logits) to float32: a layer that did would hand float32
    # activations to the next low-precision layer, and the output head's matmul would fail on
    # mixed dtypes (it does in NeMo RL's version, without autocast).
    layer_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)
    offload_policy: OffloadPolicy = CPUOffloadPolicy(pin_memory=False) if cpu_offload else OffloadPolicy()
    # A 2-D dp_mesh (replicate, shard) makes fully_shard do HSDP.
    for layer in layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=layer_policy, offload_policy=offload_policy)
    # The root's parameters (embeddings, head) are used again at once in backward: keep them.
    return fully_shard(
        model, mesh=dp_mesh, mp_policy=root_policy, offload_policy=offload_policy, reshard_after_forward=False
    )


# ---------------------------------------------------------------------------------------------
# The orchestrator


def parallelize_model(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    tp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    custom_parallel_plan: Optional[PlanLike] = None,
) -> FSDPModule:
    """Apply TP with the plan of highest priority, then FSDP2; returns the FSDP2-wrapped model."""
    tp_size = tp_mesh.size()
    layers = find_transformer_layers(model)
    if tp_size > 1:
        resolved = resolve_parallel_plan(model, sequence_parallel, custom_parallel_plan)
        logger.info("plangen: using the %s plan: %s", resolved.source, resolved.reason)
        styles = resolve_tied_styles(model, resolved.styles)
        check_plan_fits(model, styles, tp_size)
        check_packed_without_fsdp(model, styles, dp_mesh.size())
        apply_tp(model, tp_mesh, styles)
        if sequence_parallel:
            apply_sequence_length_check(model, tp_size)
    elif custom_parallel_plan is not None:
        logger.info("plangen: TP size is 1: the custom plan is not applied")
    if activation_checkpointing:
        keep = CHECKPOINT_FILTERS.get(type(model).__name__, lambda layer: True)
        apply_activation_checkpointing([layer for layer in layers if keep(layer)])
    return apply_fsdp(model, layers, dp_mesh, param_dtype, cpu_offload)


_parallelize_model = parallelize_model  # NeMo RL's name

__all__ = [
    "PARALLELIZE_FUNCTIONS",
    "PARALLIZE_FUNCTIONS",
    "PlanError",
    "ResolvedPlan",
    "RotaryEmbedParallel",
    "_parallelize_model",
    "apply_fsdp",
    "apply_tp",
    "clip_grad_by_total_norm_",
    "get_grad_norm",
    "get_hf_tp_plan",
    "parallelize_model",
    "resolve_parallel_plan",
    "to_local_if_dtensor",
    "translate_parallel_style",
]


"""The runtime: apply a parallel plan through DTensor TP, then FSDP2.

A drop-in for NeMo RL's ``nemo_rl.models.dtensor.parallelize`` (same names and signatures, its
misspelled aliases included), correct where that one is not: tied embeddings stay tied, per-head
norms get their gradient summed over TP, the gradient norm counts TP-replicated weights once, and
bad input fails before any collective with the numbers.

Order of work in :func:`parallelize_model`:
  1. choose the plan (custom > hand-written for the class > synthesized and proven > Hugging Face:
     :func:`plangen.plans.choice.choose_plan`; for a peft model, the wrapped model's), pure, logged;
  2-3. apply TP (:func:`plangen.runtime.tensor_parallel.apply_tp`): complete tied embeddings, check the plan
     against the model (keys that match nothing, head counts vs TP size) before anything is sharded,
     ``parallelize_module``, then re-tie what TP split apart; on a peft LoRA model the plan's keys
     are first translated onto the LoRA layers' base layers and adapters (:mod:`plangen.runtime.lora`);
  4. activation checkpointing of the decoder layers;
  4b. with ``compile=True``, ``torch.compile`` of each decoder layer (``fullgraph=True``), torchtitan's
     order: after TP and checkpointing, before FSDP2 (:mod:`plangen.runtime.compile`, ``docs/compile.md``);
  5. FSDP2: each decoder layer, then the root without resharding after forward; each parameter
     sharded on dim 0 over DP, or on another dim where padding its TP-local dim 0 to a multiple of
     DP would add more than 1 % (:mod:`plangen.runtime.fsdp_shard`).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.runtime.compile import apply_compile
from plangen.runtime.fsdp_inputs import apply_dtensor_input_grads, keep_filled_inputs
from plangen.runtime.fsdp_shard import build_shard_placement_fn, dp_shard_size
from plangen.runtime.grad_norm import clip_grad_by_total_norm_, get_grad_norm, to_local_if_dtensor
from plangen.model.heads import largest_legal_tp_size, tp_size_problem  # noqa: F401 - public here too
from plangen.plans.hf_plan import get_hf_tp_plan
from plangen.runtime.lora import find_lora_base, resolve_plan_model
from plangen.model.module_tree import find_matching_modules, find_separable_units, find_unmatched_keys  # noqa: F401 - public here too
from plangen.plans.checks import (  # noqa: F401 - shared with plangen verify; importable here as before
    PlanError,
    check_heads_divisible,
    check_packed_without_fsdp,
    check_plan_fits,
    resolve_tied_styles,
)
from plangen.model.module_tree import find_transformer_layers  # noqa: F401 - importable here as before
from plangen.plan.source import PlanLike
from plangen.plans import CHECKPOINT_FILTERS
from plangen.plans.choice import ChosenPlan, NoPlanError, choose_plan
from plangen.plan import check_variant
from plangen.runtime.nemo_compat import (  # noqa: F401 - NeMo RL's names, answered by plangen's plans
    SequenceParallelAllGatherActivation,
    _parallelize_gemma3,
    _parallelize_llama,
    _parallelize_qwen,
    get_logprobs_from_vocab_parallel_logits,
)
from plangen.styles import ColwiseParallelWithGather, RotaryEmbedParallel, translate_parallel_style
from plangen.runtime.tensor_parallel import apply_retie, apply_tp  # noqa: F401 - the runtime's step 3

logger = logging.getLogger("plangen")

PlanFunction = Callable[[nn.Module, bool], dict[str, ParallelStyle]]

# The runtime's own name for the plan choice (one implementation: plangen.plans.choice).
resolve_parallel_plan = choose_plan


# ---------------------------------------------------------------------------------------------
# NeMo RL's class-keyed registry, as a view of plangen's hand-written plans (built on first use:
# looking the classes up imports their modeling modules).


def _styles_from_registry(class_name: str) -> PlanFunction:
    def plan_function(model: nn.Module, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
        from plangen.styles import build_parallel_styles
        from plangen.plans import HAND_WRITTEN

        return build_parallel_styles(HAND_WRITTEN[class_name](model, sequence_parallel))

    plan_function.__name__ = f"parallelize_{class_name}"
    return plan_function


def _build_parallelize_functions() -> dict[type, PlanFunction]:
    import transformers

    from plangen.plans import HAND_WRITTEN

    functions: dict[type, PlanFunction] = {}
    for class_name in HAND_WRITTEN:
        cls = getattr(transformers, class_name, None)
        if cls is not None:
            functions[cls] = _styles_from_registry(class_name)
    return functions


_LAZY_REGISTRY: dict[type, PlanFunction] = {}


def __getattr__(name: str):
    if name in ("PARALLELIZE_FUNCTIONS", "PARALLIZE_FUNCTIONS"):  # the second is NeMo RL's spelling
        if not _LAZY_REGISTRY:
            _LAZY_REGISTRY.update(_build_parallelize_functions())
        return _LAZY_REGISTRY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# 1. Choose the plan: plangen.plans.choice.choose_plan (custom > hand-written > proven synthesized
#    > Hugging Face), pure, logged by the orchestrator.
# 2-3. Check it against the model and apply TP, keeping tied embeddings one parameter:
#    plangen.runtime.tensor_parallel.apply_tp (the checks are plangen.plans.checks', shared with verify).


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


# The keyword arguments transformers' decoder layers take their KV cache by (HF's own
# GradientCheckpointingLayer drops the same ones under its checkpointing).
KV_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def apply_activation_checkpointing(layers: list[nn.Module]) -> None:
    from plangen.stack.torch_compat import composable_checkpoint as checkpoint

    # The composable API keeps parameter names unchanged (a wrapper module would rename them).
    for layer in layers:
        # Registered before checkpoint's own hook, which keeps the call's arguments for the replay.
        layer.register_forward_pre_hook(_drop_kv_cache, with_kwargs=True, prepend=True)
        checkpoint(layer)


def _drop_kv_cache(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """A checkpointed layer's call without its KV cache when backward will replay it.

    The replay in backward would write the layer's keys and values into the cache a second time,
    and the cache, kept by the replay's arguments, holds them until backward ends: a layer's
    recomputed keys, values and more per layer (Llama-3.1-8B, TP 8, SP, 8k tokens: ~96 MiB per
    layer at the backward peak, docs/cost.md). Without gradients nothing replays (generation in
    train mode): the cache stays.
    """
    if not (module.training and torch.is_grad_enabled()):
        return None
    dropped = {name: None for name in KV_CACHE_KWARGS if kwargs.get(name) is not None}
    if kwargs.get("use_cache"):
        dropped["use_cache"] = False
    return (args, {**kwargs, **dropped}) if dropped else None


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
    # float32 at least; float64 parameters (a numerical check's) are reduced and returned in float64.
    wide = torch.float64 if param_dtype == torch.float64 else torch.float32
    layer_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=wide)
    root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=wide, output_dtype=wide)
    offload_policy: OffloadPolicy = CPUOffloadPolicy(pin_memory=False) if cpu_offload else OffloadPolicy()
    # Dim 0, except where a TP-local dim 0 pads more than 1 % to a multiple of DP (one expert per TP
    # rank, 7 experts over DP 2): padding would fill ranks there (plangen.runtime.fsdp_shard).
    placement = build_shard_placement_fn(dp_shard_size(dp_mesh))
    # A 2-D dp_mesh (replicate, shard) makes fully_shard do HSDP.
    for layer in find_separable_units(model, layers):
        fully_shard(
            layer, mesh=dp_mesh, mp_policy=layer_policy, offload_policy=offload_policy, shard_placement_fn=placement
        )
        apply_dtensor_input_grads(layer)  # an input the layer ignores (Zamba2's embeddings under SP)
        keep_filled_inputs(layer)  # a dict the layers fill for each other (Gemma 3n's shared KV on 5.8)
    # The root's parameters (embeddings, head) are used again at once in backward: keep them.
    return fully_shard(
        model,
        mesh=dp_mesh,
        mp_policy=root_policy,
        offload_policy=offload_policy,
        reshard_after_forward=False,
        shard_placement_fn=placement,
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
    plan_variant: str = "optimized",
    *,
    compile: bool = False,
) -> FSDPModule:
    """Apply TP with the plan of highest priority, then FSDP2; returns the FSDP2-wrapped model.

    ``plan_variant``: ``"stable"`` applies the plan without cross-rank sums in the forward
    (:mod:`plangen.plans.variants`, NeMo RL's numerically stable plan); not with a custom plan.
    ``compile``: compile each decoder layer with ``torch.compile(fullgraph=True)`` before FSDP2
    (:func:`plangen.runtime.compile.apply_compile`; what it leaves eager is logged; with activation
    checkpointing each checkpointed layer's forward compiles, the checkpoint's hooks eager around it)."""
    check_variant(plan_variant)  # a typo fails at once, at any TP size
    tp_size = tp_mesh.size()
    layers = find_transformer_layers(model)
    # A peft model: the plan is the wrapped model's (apply_tp translates it onto the LoRA layers).
    _, base = find_lora_base(model)
    if tp_size > 1:
        chosen = choose_plan(resolve_plan_model(model), sequence_parallel, custom_parallel_plan, variant=plan_variant)
        logger.info("plangen: using the %s plan: %s", chosen.source, chosen.reason)
        apply_tp(model, tp_mesh, chosen.build_styles(), dp_size=dp_mesh.size())
        if sequence_parallel:
            apply_sequence_length_check(model, tp_size)
    elif custom_parallel_plan is not None:
        logger.info("plangen: TP size is 1: the custom plan is not applied")
    if activation_checkpointing:
        keep = CHECKPOINT_FILTERS.get(type(base).__name__, lambda layer: True)
        apply_activation_checkpointing([layer for layer in layers if keep(layer)])
    if compile:
        apply_compile(model, layers)
    return apply_fsdp(model, layers, dp_mesh, param_dtype, cpu_offload)


_parallelize_model = parallelize_model  # NeMo RL's name


def _parallelize_nm5_h(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    tp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    custom_parallel_plan: Optional[PlanLike] = None,
) -> FSDPModule:
    """NeMo RL's NemotronH entry point: :func:`parallelize_model`, which gives NemotronH its
    hand-written plan (MLP and attention TP, Mamba mixers replicated), with sequence parallel and a
    custom plan allowed (NeMo RL's asserts both off). Here, not in plangen.runtime.nemo_compat: it runs the
    runtime, which lower modules never import."""
    if type(model).__name__ != "NemotronHForCausalLM":
        raise TypeError(
            f"_parallelize_nm5_h takes a NemotronHForCausalLM, not {type(model).__name__}: use parallelize_model"
        )
    return parallelize_model(
        model,
        dp_mesh,
        tp_mesh,
        param_dtype,
        sequence_parallel,
        activation_checkpointing,
        cpu_offload,
        custom_parallel_plan,
    )


__all__ = [  # noqa: F822 - the two tables are the module's __getattr__'s
    "PARALLELIZE_FUNCTIONS",
    "PARALLIZE_FUNCTIONS",
    "ChosenPlan",
    "NoPlanError",
    "ColwiseParallelWithGather",
    "PlanError",
    "RotaryEmbedParallel",
    "SequenceParallelAllGatherActivation",
    "_parallelize_gemma3",
    "_parallelize_llama",
    "_parallelize_model",
    "_parallelize_nm5_h",
    "_parallelize_qwen",
    "apply_fsdp",
    "apply_tp",
    "clip_grad_by_total_norm_",
    "get_grad_norm",
    "get_hf_tp_plan",
    "get_logprobs_from_vocab_parallel_logits",
    "parallelize_model",
    "choose_plan",
    "resolve_parallel_plan",
    "to_local_if_dtensor",
    "translate_parallel_style",
]

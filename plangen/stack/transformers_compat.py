"""What differs between the transformers releases plangen runs on, in one place.

Every fact here is read from the installed transformers (its source, its config classes), never
from a version number alone, and is written down per release as found in each one's modeling code:

* **Experts' sentinel routes.** :class:`plangen.styles.experts.ExpertsParallel` (whole experts per
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

* **5.5.x experts, right.** Measured once as wrong (the MoE plans' gradients off on 5.5.4, cause
  not found, so :class:`~plangen.styles.experts.ExpertsParallel` refused 5.5.x), they are exact there now,
  on this rank's routes alone as on 5.8.x: at TP 2 and DP 2 x TP 2 (SP), torch 2.11.0 + 5.5.4,
  Qwen3-MoE, Mixtral (whole and split experts), gpt-oss, DeepSeek-V2/V3, Qwen2-MoE, GLM-4-MoE,
  LongCat-Flash and Llama 4 within 1.2e-7 of the unsharded model, with eager, batched_mm and
  grouped_mm experts. The refusal is gone.

* **batched_mm's index clamp.** 5.8.x's ``batched_mm`` experts forward clamps
  ``top_k_index.reshape(-1)`` in place: a view of the router's ``topk`` indices, which ``topk``'s
  backward reads, so every backward through it fails (an in-place modification error), sharded or
  not; 5.5.x and 5.24.0 on clamp a copy. plangen's step measurement runs batched_mm on CPU (the
  cost model, ``plangen cost``): :func:`guard_routing_index` gives such experts a copy of the index.

* **Hybrid layer kinds.** NemotronH and Zamba2 name each layer's kind in ``layers_block_type``:
  5.5.x and 5.8.x ``"mamba"`` / ``"attention"``, 5.24.0 on ``"linear_attention"`` /
  ``"full_attention"`` (transformers' own ``_LEGACY_LAYER_TYPE_REMAP``, which also reads old
  configs). Plans read the kinds through :func:`layer_kinds` (the newer names whatever built
  the config); configs written by plangen or its tests spell them as the installed config
  class does (:func:`installed_layer_kinds`: its own default's spelling).

* **Hugging Face plan styles.** 5.25.0 adds ``unit_colwise``/``unit_rowwise`` (by whole heads over a
  (heads, replicas) view of the TP mesh): translated in :data:`plangen.styles.HF_STYLE_SPECS`,
  the table of every release's style names, as colwise/rowwise (exact where the TP size divides
  the heads).

* **A router read by its weight.** 5.8.x's DeepSeek-V2 MoE block computes its router logits as
  ``F.linear(hidden_states.float(), self.gate.weight.float())``, never calling ``self.gate``
  (5.24.0 on call it, a ``DeepseekV2TopkRouter``): hooks on the router never run, and
  :class:`~plangen.styles.moe_blocks.MoeBlockParallel`'s count-once of the router's whole input
  gradient was lost (``embed_tokens.weight``'s gradient off by 9.3e-5 at TP 2, 2.8e-4 at TP 4:
  the router's share counted TP times). :func:`reads_child_weight` says where a block's forward
  reads a child's weight itself; the style then counts the input of each ``F.linear`` on that
  weight once (:func:`plangen.styles.tp_sums.count_once_where_weight_is_read`).

* **The Hugging Face plan's composition.** From the release with ``transformers.distributed``'s
  ``DistributedMixin`` (5.24.0 on), ``post_init`` starts a model's plan from its class ``_tp_plan``
  (``{"lm_head": "colwise_gather_output"}``) and puts ``embed_tokens: embedding_rowwise`` before the
  base model's config plan. 5.5.x and 5.8.x compose the config's plan and the children's only: their
  own TP leaves the head and the embedding whole. :func:`plan_composes_head_and_embedding` says which;
  :func:`plangen.plans.hf_plan.compose_hf_tp_plan` mirrors the installed one, so the "hf" tier is the plan
  the installed transformers would apply. The plan utilities moved too (:func:`hf_parallel_utils`).

* **Zero-compute experts computed by the block.** LongCat-Flash's router also picks
  ``zero_expert_num`` identity experts (a route's output is its input, weighted). 5.24.0 computes them
  inside the experts module (an ``identity_expert`` child beside ``gate_up_proj`` rows for them), which
  :class:`~plangen.styles.experts.ExpertsParallel` shares 1/tp per rank. 5.25.0's experts module holds the
  real experts only (``use_experts_implementation``) and the MoE block computes
  ``identity_output = hidden_states * identity_weights`` itself and adds it to the experts' output:
  under :class:`~plangen.styles.moe_blocks.MoeBlockParallel`, whose output is a partial sum reduced
  over TP, every rank's whole identity output was summed TP times (the plan's logits off by 1.3e-2 at
  TP 2). :func:`block_identity_experts` says where a block computes them itself; the style then hands
  the block each rank's 1/tp share of the identity routes' weights (their gradient whole).

* **grouped_mm's fallback under torch.compile.** Where ``torch._grouped_mm`` cannot run (on CPU, or
  weights other than bfloat16), the ``grouped_mm`` experts call transformers' custom op
  ``transformers::grouped_mm_fallback``. 5.5.x and 5.8.x register its backward as Python
  (``offs.tolist()``, a loop over the groups), which AOTAutograd traces into the compiled backward:
  ``GuardOnDataDependentSymNode: Could not guard on data-dependent expression`` (any MoE layer compiled
  with its experts, sharded or not). 5.24.0 on make the backward an opaque custom op too
  (``transformers::grouped_mm_fallback_backward``). :func:`experts_compile_blocker` says where;
  :func:`plangen.runtime.compile.compile_units` then leaves those experts eager and compiles the rest of the
  layer around them.

5.25.0's Falcon attention views its packed ``query_key_value`` as heads by a shape held in a local,
then splits it on the head dim (multi-query: ``split([num_heads, 1, 1], dim=-2)``) or views it
again as KV groups (``new_decoder_architecture``: ``view(*shape, num_kv_heads, -1, head_dim)``):
:mod:`plangen.plans.source.packed` reads both as it reads 5.24.0's one view (Falcon-7B's 71 heads
padded, its KV group size made the rank's share with them: :mod:`plangen.styles.padded_heads`).
Not read: its multi-head form (``multi_query=False``, ``unflatten(-2, (num_heads, 3)).unbind(-2)``,
Falcon-RW's), kept whole.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

# The Mamba/attention kinds' older names (5.5.x-5.8.x), as transformers' remap (5.24.0 on) maps them.
LEGACY_LAYER_KINDS = {"mamba": "linear_attention", "attention": "full_attention"}


@functools.cache
def plan_composes_head_and_embedding() -> bool:
    """Whether the installed transformers' ``post_init`` adds the class ``_tp_plan`` (the head) and
    ``embed_tokens: embedding_rowwise`` to a model's TP plan (its ``DistributedMixin``)."""
    try:
        from transformers.distributed.mixin import DistributedMixin
    except ImportError:
        return False
    return hasattr(DistributedMixin, "init_parallel_plans")


def hf_parallel_utils() -> Any:
    """The installed transformers' module of TP plan utilities (``ALL_PARALLEL_STYLES``,
    ``replace_layer_number_by_wildcard``): ``transformers.distributed.parallel_utils`` from 5.24.0,
    ``transformers.integrations.tensor_parallel`` before."""
    try:
        from transformers.distributed import parallel_utils
    except ImportError:
        from transformers.integrations import tensor_parallel as parallel_utils
    return parallel_utils


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


@functools.cache
def uses_experts_interface(module: Any) -> bool:
    """``module`` is packed experts whose forward is transformers' experts interface
    (``use_experts_implementation``: its ``has_gate``/``is_transposed``; 5.24.0 on also its
    ``_is_expert_parallel``)."""
    return hasattr(module, "_is_expert_parallel") or (hasattr(module, "has_gate") and hasattr(module, "is_transposed"))


@functools.cache
def grouped_mm_backward_is_opaque() -> bool:
    """Whether transformers' grouped_mm fallback has its backward as a custom op (5.24.0 on), which
    torch.compile keeps opaque, rather than Python it traces (5.5.x, 5.8.x)."""
    import torch

    try:
        import transformers.integrations.moe  # noqa: F401 - registers transformers' custom ops
    except ImportError:
        return True  # no experts interface at all
    return hasattr(torch.ops.transformers, "grouped_mm_fallback_backward")


def experts_compile_blocker(module: Any) -> str | None:
    """Why ``module`` (transformers' packed experts) cannot be compiled with a backward, or None."""
    if not uses_experts_interface(module) or grouped_mm_backward_is_opaque():
        return None
    if getattr(getattr(module, "config", None), "_experts_implementation", None) != "grouped_mm":
        return None
    import transformers

    return (
        f"transformers {transformers.__version__}'s grouped_mm fallback has a Python backward "
        "(offs.tolist()) that torch.compile cannot trace"
    )


def experts_split_over_ranks(module: Any) -> bool:
    """Whether :class:`~plangen.styles.experts.ExpertsParallel` splits these experts right on the installed
    release: through the experts interface, with the sentinel route where the release computes it
    (``_is_expert_parallel``), else on this rank's routes alone."""
    if hasattr(module, "_is_expert_parallel"):
        return True
    return not experts_take_sentinels() and uses_experts_interface(module)


@functools.cache
def batched_mm_clamps_index_in_place() -> bool:
    """Whether the installed ``batched_mm`` experts forward clamps its caller's index tensor in place."""
    try:
        from transformers.integrations.moe import batched_mm_experts_forward

        source = inspect.getsource(batched_mm_experts_forward)
    except (ImportError, OSError, TypeError):
        return False
    return "expert_ids.clamp_(" in source


def guard_routing_index(model: Any) -> None:
    """Where :func:`batched_mm_clamps_index_in_place`: each experts module of ``model`` that takes
    transformers' routing gets a copy of its index (a forward pre-hook), so the router's is untouched."""
    if not batched_mm_clamps_index_in_place():
        return

    def copy_index(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if len(args) > 1:
            args = (args[0], args[1].clone(), *args[2:])
        for name in ("top_k_index", "router_indices"):
            if name in kwargs:
                kwargs = {**kwargs, name: kwargs[name].clone()}
        return args, kwargs

    for module in model.modules():
        if uses_experts_interface(module):
            module.register_forward_pre_hook(copy_index, with_kwargs=True)


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


__all__ = [
    "LEGACY_LAYER_KINDS",
    "batched_mm_clamps_index_in_place",
    "block_identity_experts",
    "experts_take_sentinels",
    "guard_routing_index",
    "installed_layer_kinds",
    "layer_kind",
    "layer_kinds",
]


def reads_child_weight(module: Any, child: str) -> bool:
    """Whether ``module``'s forward (its class's, as installed) reads ``self.<child>.weight`` itself
    instead of calling the child (5.8.x's DeepSeek-V2 MoE block and its router)."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    return f"self.{child}.weight" in source


def block_identity_experts(block: Any) -> int:
    """How many zero-compute (identity) experts a MoE ``block`` routes to and computes itself, in its
    own forward (5.25.0's LongCat-Flash: routes with an index of ``num_routed_experts`` or more, their
    output ``hidden_states`` times their summed weights, added to the experts'), else 0 (5.24.0
    computes them inside its experts module)."""
    count, routed = getattr(block, "zero_expert_num", 0), getattr(block, "num_routed_experts", None)
    if not isinstance(count, int) or count <= 0 or not isinstance(routed, int):
        return 0
    try:
        source = inspect.getsource(type(block).forward)
    except (OSError, TypeError):
        return 0
    return count if "self.zero_expert_num" in source and ">= self.num_routed_experts" in source else 0

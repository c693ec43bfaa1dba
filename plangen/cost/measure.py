"""Run one training step of a shrunk model under a plan and record its TP collectives.

A single-process fake process group (``init_process_group("fake")``) runs TP at any size without
workers; torch's ``CommDebugMode`` (:class:`plangen.distributed.comm.CollectiveCounter`) sees every collective
that DTensor, the plan's styles and the loss issue, with the size of its result. The step is what
training runs: forward, loss (vocabulary-parallel when the logits are sharded on the vocabulary,
otherwise cross-entropy on whole logits), backward; in the compute dtype, so each collective
carries the bytes it would in training (activations in bf16, the loss's statistics in float32).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from plangen.distributed.comm import CollectiveCounter
from plangen.cost.probe_configs import (
    DIMENSION_KEYS,
    config_value,
    config_with_base_sizes,
    config_with_extra_layer,
    config_with_more_layers,
    config_with_tokens,
    dimension_value,
    is_int,
    prompt_tokens,
    read_dimensions,
    scaled_config,
    state_space_heads,
)
from plangen.cost.scaling import PROBE_GROUPS, Probe, Sample
from plangen.cost.settings import CostError
from plangen.cost.widths import derived_width_keys
from plangen.distributed.fake_group import quiet_fake_tensor_log, quiet_partial_matches, tp_mesh
from plangen.model.resolve import text_config
from plangen.model.pad_layout import pads_query_heads
from plangen.stack.transformers_compat import guard_routing_index

StylesBuilder = Callable[[nn.Module], Mapping[str, Any]]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Base sizes of the measured batch; the sequence is a multiple of the TP size (sequence parallel).
BASE_BATCH = 3  # odd, so token counts rarely equal a width (sizes must tell collectives apart)
BASE_SEQ_PER_RANK = 2
# Token ids stay below the tiny vocabulary's top ids, where shrink_config moves special tokens.
SPECIAL_TOKEN_SPAN = 32


# CollectiveCounter sizes c10d collectives too (their result is a list of tensors): the name stays
# for the callers that asked for sizes.
PayloadCounter = CollectiveCounter


# ---------------------------------------------------------------------------------------------
# One step


def step_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position (rolled targets keep the sequence length)."""
    from plangen.loss import vocab_parallel_cross_entropy

    targets = torch.roll(ids, -1, dims=1)
    if isinstance(logits, DTensor):
        placements = tuple(logits.placements)
        if len(placements) == 1 and placements[0].is_shard() and placements[0].dim % logits.ndim == logits.ndim - 1:
            return vocab_parallel_cross_entropy(logits, targets)
        # Any other layout must be made whole for the loss: a cost of the plan, so it is counted.
        logits = logits.full_tensor()
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def reduce_partial_grads(model: nn.Module) -> None:
    """Bring gradients left ``Partial`` over TP to their parameter's layout, as FSDP2 does after backward.

    A replicated weight used on sharded data (a norm under sequence parallel, a per-head norm) ends
    backward with a ``Partial`` gradient; FSDP2's post-backward redistributes it to the parameter's
    placements (one all-reduce per such parameter) before reduce-scattering over DP.
    """
    for param in model.parameters():
        grad = param.grad
        if (
            isinstance(param, DTensor)
            and isinstance(grad, DTensor)
            and tuple(grad.placements) != tuple(param.placements)
        ):
            grad.redistribute(placements=param.placements)


def measurement_kernels(model_class: type) -> dict[str, str]:
    """Kernels for the shrunk model that run on CPU at the odd base widths; none changes what TP sends.

    Transformers' grouped_mm experts need 16-byte strides on CPU, which odd widths in bf16 do not
    have; eager experts compute the same per expert. Attention stays the class's default (sdpa)
    except where the class has no sdpa (gpt-oss): eager there, as a config asking sdpa would fail.
    """
    kernels = {"experts_implementation": "batched_mm"}
    if not getattr(model_class, "_supports_sdpa", True):
        kernels["attn_implementation"] = "eager"
    return kernels


@dataclass(frozen=True)
class StepRun:
    samples: list[Sample]  # each with the index of the decoder layer it ran in (None: outside them)
    layers: int
    kinds: tuple[str, ...] = ()  # each decoder layer's kind (layer_kind), in order


def layer_kind(layer: nn.Module) -> str:
    """What a decoder layer is, whatever its sizes: its modules (names and classes) and parameter
    names. Layers of one kind issue the same collectives; a hybrid stack (Qwen3.5's linear and full
    attention, DeepSeek's dense and MoE layers) has several, in other proportions when shrunk."""
    # List indices dropped: a kind does not depend on how many experts or heads' modules a list holds.
    modules = sorted({f"{_unindexed(name)}:{type(m).__name__}" for name, m in layer.named_modules()})
    kind = ",".join(modules) + "|" + ",".join(sorted({_unindexed(name) for name, _ in layer.named_parameters()}))
    overridden = _overridden_keys(layer)
    return f"{kind}|{overridden}" if overridden else kind


def _overridden_keys(layer: nn.Module) -> str:
    """The per-layer attributes a heterogeneous config (transformers' ``per_layer_config``) sets apart
    for this layer: Gemma 4's full-attention layers have the sliding ones' modules, another head_dim,
    so per-head collectives of other sizes. The keys, not the values: the same whatever the sizes."""
    config, index = getattr(layer, "config", None), getattr(layer, "layer_idx", None)
    keys = getattr(config, "per_layer_attributes", None)
    if not keys or not is_int(index):
        return ""
    own = config.per_layer_config[index]
    return ",".join(sorted(key for key in keys if getattr(own, key) != config_value(config, key)))


def _unindexed(name: str) -> str:
    return ".".join("#" if part.isdigit() else part for part in name.split("."))


class LayerCollectiveCounter(CollectiveCounter):
    """A :class:`CollectiveCounter` that also notes, per collective, the decoder layer running
    (``layer_at()``: an index or None), so that each layer kind's collectives can be told apart."""

    def __init__(self, layer_at: Callable[[], int | None]) -> None:
        super().__init__()
        self.layer_at = layer_at
        self.layers: list[int | None] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.records)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.layers.extend([self.layer_at()] * (len(self.records) - before))
        return out


def run_step(
    model_class: type,
    config: Any,
    build_styles: StylesBuilder,
    tp_size: int,
    dtype: str,
    batch: int,
    seq: int,
) -> StepRun:
    """Forward, loss and backward of a model built from ``config`` under the plan; its collectives."""
    from plangen.stack.torch_compat import mod_tracker

    from plangen.cost.depth import running_layer
    from plangen.plans.checks import PlanError
    from plangen.model.module_tree import find_transformer_layers
    from plangen.runtime.tensor_parallel import apply_tp

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_class._from_config(
            copy.deepcopy(config), dtype=TORCH_DTYPES[dtype], **measurement_kernels(model_class)
        )
        guard_routing_index(model)  # 5.8.x's batched_mm clamps the router's indices in place
        vocab = text_config(config).vocab_size
        ids = torch.randint(0, max(2, vocab - SPECIAL_TOKEN_SPAN), (batch, seq))
    decoder_layers = find_transformer_layers(model)
    layers, kinds = len(decoder_layers), tuple(layer_kind(layer) for layer in decoder_layers)
    ids_of = {id(layer): i for i, layer in enumerate(decoder_layers)}
    layer_names = {name: ids_of[id(m)] for name, m in model.named_modules() if id(m) in ids_of}
    tracker = mod_tracker()

    def layer_at() -> int | None:
        return running_layer(tracker.parents, layer_names, tracker.is_bw)

    try:
        with quiet_partial_matches():
            apply_tp(model, tp_mesh(tp_size), build_styles(model))
    except (PlanError, ValueError) as error:
        raise CostError(str(error)) from None
    model.train()
    # Position ids are passed, as NeMo RL's training loop does: plans that keep the residual stream
    # local and sequence-sharded (NeMo's) would otherwise give rotary embeddings a short sequence.
    positions = torch.arange(seq).expand(batch, seq)
    try:
        with tracker, quiet_fake_tensor_log():
            with LayerCollectiveCounter(layer_at) as forward:
                loss = step_loss(model(input_ids=ids, position_ids=positions).logits, ids)
            with LayerCollectiveCounter(layer_at) as backward:
                loss.backward()
                reduce_partial_grads(model)
    except Exception as error:  # the plan's, not the measurement's: say so in one line
        raise CostError(
            f"the plan fails a training step of a shrunk {type(model).__name__} at TP {tp_size}: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        ) from None
    samples = [Sample("forward", op, n, at) for (op, n), at in zip(forward.records, forward.layers)]
    samples += [Sample("backward", op, n, at) for (op, n), at in zip(backward.records, backward.layers)]
    return StepRun(samples, layers, kinds)


@dataclass(frozen=True)
class Measurement:
    """The runs the scaling formula needs, and the shrunk sizes they were made at."""

    base: StepRun
    probes: list[Probe]
    doubled: StepRun
    dimensions: dict[str, int]
    # A hybrid stack's runs with one more layer of each kind (config_with_extra_layer), by kind.
    extra: dict[str, StepRun] = field(default_factory=dict)
    # Kinds of the repeated blocks num_hidden_layers does not count (towers' layers, tower_kinds):
    # left out of the runs' layers above, to be left out of the real model's too.
    towers: frozenset[str] = frozenset()


def tower_kinds(base: StepRun, doubled: StepRun) -> frozenset[str]:
    """The layer kinds the run with twice the layers has no more of: blocks outside the decoder
    stack whose count is another config's (Phi-4-multimodal's vision and audio encoder layers)."""
    return frozenset(k for k in base.kinds if doubled.kinds.count(k) <= base.kinds.count(k))


def without_kinds(run: StepRun, kinds: frozenset[str]) -> StepRun:
    """``run`` with the blocks of ``kinds`` taken for no decoder layers: what runs in them counts as
    outside the layers (once per step), and the layers are renumbered."""
    keep = [i for i, kind in enumerate(run.kinds) if kind not in kinds]
    index = {old: new for new, old in enumerate(keep)}
    samples = [s if s.layer is None else replace(s, layer=index.get(s.layer)) for s in run.samples]
    return StepRun(samples, len(keep), tuple(run.kinds[i] for i in keep))


def _replicates_kv_heads(text: Any, tp_size: int) -> bool:
    kv = config_value(text, "num_key_value_heads")
    return isinstance(kv, int) and kv % tp_size != 0


def fits_experts(text: Any) -> bool:
    """Whether the probe that scales the top-k leaves at least as many experts as a token is routed to."""
    factors = next(group for group in PROBE_GROUPS if "topk" in group)
    experts, topk = dimension_value(text, "experts"), dimension_value(text, "topk")
    if not (is_int(experts) and is_int(topk)):
        return False
    return topk * factors["topk"] <= experts * factors.get("experts", 1)


def measure_tp_collectives(
    model_class: type, tiny_config: Any, build_styles: StylesBuilder, tp_size: int, dtype: str
) -> Measurement:
    """Base run, one run per probe group, one run with twice the layers (see :mod:`plangen.cost.scaling`)."""
    batch, seq = BASE_BATCH, BASE_SEQ_PER_RANK * tp_size
    tiny_config = config_with_base_sizes(tiny_config, tp_size)
    dims = read_dimensions(tiny_config, batch, seq)

    def run(config: Any, b: int = batch, s: int = seq) -> StepRun:
        return run_step(model_class, config, build_styles, tp_size, dtype, b, s)

    text = text_config(tiny_config)
    # Only dimensions the config states can be probed (a derived head size would follow hidden).
    probeable = {"batch", "seq"} | {n for n in DIMENSION_KEYS if isinstance(dimension_value(text, n), int)}
    if prompt_tokens(text):
        probeable.add("tokens")
    # A width the class derives from others (DBRX's hidden size, heads x head size) follows them.
    derived = derived_width_keys(tiny_config)
    probeable -= {n for n in DIMENSION_KEYS if derived & set(DIMENSION_KEYS[n])}
    if isinstance(getattr(type(text), "head_dim", None), property):
        probeable.discard("head_dim")  # Falcon's: hidden // heads, a property; it follows them
    mixer = state_space_heads(text)
    if mixer is not None and mixer[1] == "head_dim" and not is_int(config_value(text, "num_attention_heads")):
        # Mamba-2's head_dim is its mixer's: scaled, the heads would no longer span expand x hidden.
        probeable.discard("head_dim")
    if _replicates_kv_heads(text, tp_size):
        # More TP ranks than KV heads (plangen.styles.kv_heads): scaled heads would divide by the TP size and
        # leave that layout. Nothing is lost: the shrunk model keeps the real head counts there
        # (plangen.model.shrink keeps a KV count below the TP size), so the heads need no scaling.
        probeable.discard("heads")
    heads = config_value(text, "num_attention_heads")
    if is_int(heads) and pads_query_heads(heads) and heads % tp_size:
        # Falcon-7B's odd query heads, padded with zero heads (plangen.styles.padded_heads): doubled, they would
        # divide by the TP size and leave the padded layout. Measured at the shrunk model's count.
        probeable.discard("heads")
    if "topk" in probeable and not fits_experts(text):
        # k x its prime above the expert count x theirs: only where the shrunk model routes each token
        # to nearly every expert (E < 1.4 k). plangen.model.shrink caps k at 2 and E at no less than 4, so k is
        # the real model's there (E = k <= 2, or DBRX's ffn_config.moe_top_k, which it keeps): nothing to scale.
        probeable.discard("topk")
    base = run(tiny_config)
    probes = []
    for group in PROBE_GROUPS:
        factors = {name: f for name, f in group.items() if name in probeable}
        if not factors:
            continue
        config_factors = {k: v for k, v in factors.items() if k in DIMENSION_KEYS}
        config, probed_seq = scaled_config(tiny_config, config_factors), seq * factors.get("seq", 1)
        if "tokens" in factors:
            config = config_with_tokens(config, probed_seq, dims["tokens"] * factors["tokens"])
        probed = run(config, batch * factors.get("batch", 1), probed_seq)
        probes.append(Probe(factors, probed.samples))
    doubled = run(config_with_more_layers(tiny_config))
    # Towers' layers do not double with the decoder's: counted as decoder layers, they left a negative
    # fixed part, and their kinds' extra-layer run indexed per-layer lists past the decoder's layers
    # (Phi-4-multimodal: IndexError). The step is text only, so nothing runs in them anyway.
    towers = tower_kinds(base, doubled)
    if towers:
        base, doubled = without_kinds(base, towers), without_kinds(doubled, towers)
    extra = {}
    # A hybrid stack: one run per kind, with one more layer like its first of that kind.
    for kind in dict.fromkeys(base.kinds) if len(set(base.kinds)) > 1 else ():
        config = config_with_extra_layer(tiny_config, base.kinds.index(kind))
        if config is not None:
            extra[kind] = run(config)
    return Measurement(base, probes, doubled, dims, extra, towers)

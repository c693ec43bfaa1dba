"""Hand-written Megatron-style plans for dense decoder families (Llama, Mistral, Qwen2/3, Gemma3, OLMo-2/3).

Without sequence parallel (SP), each decoder layer costs two all-reduces in the forward (after
``o_proj`` and ``down_proj``). With SP the residual stream stays a sequence-sharded DTensor
(``Shard(1)``, global shape visible to the model, so rotary positions and masks stay right): each
block gathers its input once (``PrepareModuleInput`` on ``self_attn`` and ``mlp``) and
reduce-scatters its output once (row-parallel ``o_proj``/``down_proj`` with ``Shard(1)`` output):
two all-gathers and two reduce-scatters per layer, the Megatron minimum.

The output head is vocabulary-parallel: logits leave as a DTensor sharded on the vocabulary, to be
consumed by :func:`plangen.loss.vocab_parallel_cross_entropy` (no full-vocabulary gather).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.model.heads import head_counts
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.registry import register_plan
from plangen.plans.layouts import SEQ, row_parallel_output


def build_dense_decoder_plan(
    prefix: str,
    *,
    sequence_parallel: bool,
    layer_norms: tuple[str, ...],
    per_head_norms: bool,
    replicate_kv: bool = False,
    projection_norms: bool = False,
    lm_head: str | None = "lm_head",
    scaled_embedding: bool = False,
) -> Plan:
    """A plan for ``{prefix}.embed_tokens``, ``{prefix}.layers.*``, ``{prefix}.norm`` and the head.

    ``per_head_norms`` adds ``self_attn.q_norm``/``k_norm``: they see only this rank's heads, so
    their weight gradient must be summed over TP. ``replicate_kv`` (grouped-query attention, see
    :func:`grouped_query`): the attention block and its k/v projections take the styles of
    :mod:`plangen.styles.kv_heads`, so a TP size above the KV heads replicates them. ``projection_norms``
    adds the q/k norms as norms over the whole q and k projections (OLMo-2): sharded with the heads,
    statistics summed over TP. ``scaled_embedding``: the embedding module scales its own lookup
    (Gemma3): the scale is applied to each rank's partial lookup before the one reduction
    (``ScaledEmbeddingParallel``; ``TiedEmbeddingParallel(local_lookup=True)`` where it is tied).
    """
    p = f"{prefix}." if prefix else ""
    layer = f"{p}layers.*"
    sp = sequence_parallel
    entries: list[PlanEntry] = []
    replicated: list[Replicated] = []

    def add(pattern: str, style: str, group: str, why: str, **kwargs: object) -> None:
        entries.append(PlanEntry(pattern, style, kwargs, group, why))

    add(
        f"{p}embed_tokens",
        "ScaledEmbeddingParallel" if scaled_embedding else "RowwiseParallel",
        "embeddings",
        "vocab-parallel embedding; "
        + ("reduce-scatter into the sequence-sharded residual" if sp else "all-reduce")
        + ("; its own scale applied to the partial lookup first" if scaled_embedding else ""),
        input_layouts=Replicate(),
        output_layouts=SEQ if sp else Replicate(),
        use_local_output=not sp,
    )
    # The block input enters as one Replicate DTensor shared by q/k/v (and gate/up): their input
    # gradients add up as Partial and are reduced once per block, not once per projection.
    # PrepareAttentionInput and KVHeadsColwiseParallel (plangen.styles.kv_heads) read the head counts when
    # applied: where the TP size exceeds the KV heads, each rank computes the one its query heads use.
    add(
        f"{layer}.self_attn",
        "PrepareAttentionInput" if replicate_kv else "PrepareModuleInput",
        "attention",
        ("one all-gather of the sequence per attention block" if sp else "no communication")
        + "; one gradient reduction per block in backward",
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": SEQ if sp else Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=False,
    )
    for proj in ("q_proj", "k_proj", "v_proj"):
        kv = replicate_kv and proj != "q_proj"
        add(
            f"{layer}.self_attn.{proj}",
            "KVHeadsColwiseParallel" if kv else "ColwiseParallel",
            "attention",
            "column-parallel over KV heads; replicated where TP exceeds them"
            if kv
            else "column-parallel: each rank computes its own heads",
            input_layouts=Replicate(),
            output_layouts=Shard(-1),
            use_local_output=True,
        )
    if per_head_norms:
        for norm in ("q_norm", "k_norm"):
            add(
                f"{layer}.self_attn.{norm}",
                "ReplicatedWithGradAllReduce",
                "attention",
                "per-head norm sees only local heads: its weight gradient is summed over TP",
                sequence_dim=2,
                use_local_output=True,
            )
    if projection_norms:
        for norm in ("q_norm", "k_norm"):
            add(
                f"{layer}.self_attn.{norm}",
                "ShardedNormParallel",
                "attention",
                "norm over the whole projection, sharded with its heads: one all-reduce of B·S values each way",
            )
    add(
        f"{layer}.self_attn.o_proj",
        "RowwiseParallel",
        "attention",
        "row-parallel: " + row_parallel_output(sp)[1],
        **row_parallel_output(sp)[0],
    )
    add(
        f"{layer}.mlp",
        "PrepareModuleInput",
        "mlp",
        ("one all-gather of the sequence per MLP block" if sp else "no communication")
        + "; one gradient reduction per block in backward",
        input_layouts=(SEQ if sp else Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output=False,
    )
    for proj in ("gate_proj", "up_proj"):
        add(
            f"{layer}.mlp.{proj}",
            "ColwiseParallel",
            "mlp",
            "column-parallel",
            input_layouts=Replicate(),
            output_layouts=Shard(-1),
            use_local_output=True,
        )
    add(
        f"{layer}.mlp.down_proj",
        "RowwiseParallel",
        "mlp",
        "row-parallel: " + row_parallel_output(sp)[1],
        **row_parallel_output(sp)[0],
    )
    for norm in (*(f"{layer}.{n}" for n in layer_norms), f"{p}norm"):
        if sp:
            add(
                norm,
                "SequenceParallel",
                "norms",
                "norm on the local sequence shard",
                sequence_dim=1,
                use_local_output=False,
            )
        else:
            replicated.append(Replicated(norm, "sees the full hidden state on every rank: nothing to shard", "norms"))
    if lm_head is not None:
        add(
            lm_head,
            "ColwiseParallel",
            "output",
            "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
            input_layouts=SEQ if sp else Replicate(),
            output_layouts=Shard(-1),
            use_local_output=False,
        )
    return Plan(tuple(entries), "hand-written", tuple(replicated), sequence_parallel)


def text_prefix(model: nn.Module) -> str:
    """Where the decoder stack lives: ``model`` for causal LMs, deeper for multimodal classes."""
    for prefix in ("model.language_model", "language_model.model", "model"):
        module: nn.Module | None = model
        for part in prefix.split("."):
            module = getattr(module, part, None)
            if not isinstance(module, nn.Module):
                break
        else:
            if hasattr(module, "layers") and hasattr(module, "embed_tokens"):
                return prefix
    raise ValueError(f"cannot find the decoder stack of {type(model).__name__}")


def grouped_query(model: nn.Module) -> bool:
    """Fewer KV heads than query heads: a TP size above the KV heads needs them replicated."""
    counts = head_counts(model.config) if hasattr(model, "config") else None
    return counts is not None and counts[1] < counts[0]


LLAMA_NORMS = ("input_layernorm", "post_attention_layernorm")
OLMO2_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")  # after each block, before the residual add
GEMMA3_NORMS = (*LLAMA_NORMS, "pre_feedforward_layernorm", "post_feedforward_layernorm")


@register_plan(
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
)
def plan_llama_like(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_dense_decoder_plan(
        text_prefix(model),
        sequence_parallel=sequence_parallel,
        layer_norms=LLAMA_NORMS,
        per_head_norms=False,
        replicate_kv=grouped_query(model),
    )


@register_plan("Qwen3ForCausalLM")
def plan_qwen3(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_dense_decoder_plan(
        text_prefix(model),
        sequence_parallel=sequence_parallel,
        layer_norms=LLAMA_NORMS,
        per_head_norms=True,
        replicate_kv=grouped_query(model),
    )


@register_plan("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
def plan_gemma3(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_dense_decoder_plan(
        text_prefix(model),
        sequence_parallel=sequence_parallel,
        layer_norms=GEMMA3_NORMS,
        per_head_norms=True,
        replicate_kv=grouped_query(model),
        scaled_embedding=True,
    )


@register_plan("Olmo2ForCausalLM", "Olmo3ForCausalLM")
def plan_olmo2(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_dense_decoder_plan(
        text_prefix(model),
        sequence_parallel=sequence_parallel,
        layer_norms=OLMO2_NORMS,
        per_head_norms=False,
        projection_norms=True,
    )

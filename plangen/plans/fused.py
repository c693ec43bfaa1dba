"""Hand-written Megatron-style plans for decoders with fused projections (Phi-3: ``qkv_proj``, ``gate_up_proj``).

A fused projection is the only consumer of its block's input, so its column-parallel style also
prepares that input: with sequence parallel (SP) it gathers the sequence once per block and
reduce-scatters the input gradient once; without SP it reduces the input gradient once per block.
The fused weights are re-laid out so each rank holds its own heads' q, k, v and its own slice of
gate and up (:class:`plangen.fused_styles.FusedColwiseParallel`); the state dict keeps the Hugging
Face layout. The attention module's head counts are made local (:class:`LocalHeadCounts`) because
Phi-3 slices ``qkv`` by them. Per layer: two all-reduces, or with SP two all-gathers and two
reduce-scatters, the Megatron minimum, as in :mod:`plangen.plans.dense`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.models import text_config
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.dense import LLAMA_NORMS, SEQ, _text_prefix
from plangen.plans.registry import register_plan
from plangen.plans.layouts import row_parallel_output


def build_fused_decoder_plan(
    prefix: str,
    *,
    sequence_parallel: bool,
    qkv_parts: tuple[int, int, int],
    head_attributes: tuple[str, ...],
    layer_norms: tuple[str, ...],
    attention: str = "self_attn",
    qkv: str = "qkv_proj",
    out: str = "o_proj",
    mlp: str = "mlp",
    gate_up: str = "gate_up_proj",
    down: str = "down_proj",
    embedding: str = "embed_tokens",
    final_norm: str = "norm",
    lm_head: str | None = "lm_head",
    layers: str = "layers",
) -> Plan:
    """A plan for a decoder whose attention has one fused ``[q; k; v]`` projection of parts
    ``qkv_parts`` (heads, kv heads, kv heads) and whose MLP has one fused ``[gate; up]``."""
    p = f"{prefix}." if prefix else ""
    layer = f"{p}{layers}.*"
    sp = sequence_parallel
    block_input = SEQ if sp else Replicate()
    entries: list[PlanEntry] = []
    replicated: list[Replicated] = []

    def add(pattern: str, style: str, group: str, why: str, **kwargs: object) -> None:
        entries.append(PlanEntry(pattern, style, kwargs, group, why))

    add(
        f"{p}{embedding}",
        "RowwiseParallel",
        "embeddings",
        "vocab-parallel embedding; " + ("reduce-scatter into the sequence-sharded residual" if sp else "all-reduce"),
        input_layouts=Replicate(),
        output_layouts=SEQ if sp else Replicate(),
        use_local_output=not sp,
    )
    gathers = "one all-gather of the sequence, " if sp else ""
    add(
        f"{layer}.{attention}",
        "LocalHeadCounts",
        "attention",
        "slices the fused qkv by head counts: make them this rank's",
        attributes=head_attributes,
    )
    add(
        f"{layer}.{attention}.{qkv}",
        "FusedColwiseParallel",
        "attention",
        f"each rank holds its own heads' q, k, v; {gathers}one input-gradient reduction per block",
        part_sizes=qkv_parts,
        input_layouts=block_input,
        use_local_output=True,
    )
    add(
        f"{layer}.{attention}.{out}",
        "RowwiseParallel",
        "attention",
        "row-parallel: " + row_parallel_output(sp)[1],
        **row_parallel_output(sp)[0],
    )
    add(
        f"{layer}.{mlp}.{gate_up}",
        "FusedColwiseParallel",
        "mlp",
        f"each rank holds its own slice of gate and of up; {gathers}one input-gradient reduction per block",
        part_sizes=(1, 1),
        input_layouts=block_input,
        use_local_output=True,
    )
    add(
        f"{layer}.{mlp}.{down}",
        "RowwiseParallel",
        "mlp",
        "row-parallel: " + row_parallel_output(sp)[1],
        **row_parallel_output(sp)[0],
    )
    for norm in (*(f"{layer}.{n}" for n in layer_norms), f"{p}{final_norm}"):
        if sp:
            add(norm, "SequenceParallel", "norms", "norm on the local sequence shard", sequence_dim=1, use_local_output=False)
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


def _heads(model: nn.Module) -> tuple[int, int]:
    config = text_config(model.config)
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


@register_plan("Phi3ForCausalLM")
def plan_phi3(model: nn.Module, sequence_parallel: bool) -> Plan:
    heads, kv_heads = _heads(model)
    return build_fused_decoder_plan(
        _text_prefix(model),
        sequence_parallel=sequence_parallel,
        qkv_parts=(heads, kv_heads, kv_heads),
        # Phi3Attention slices qkv at config.num_attention_heads * head_dim and num_key_value_heads * head_dim.
        head_attributes=("num_key_value_heads", "config.num_attention_heads", "config.num_key_value_heads"),
        layer_norms=LLAMA_NORMS,
    )


@register_plan("Phi4MultimodalForCausalLM")
def plan_phi4_multimodal(model: nn.Module, sequence_parallel: bool) -> Plan:
    """Phi-4-multimodal's text decoder is Phi-3's (the same fused qkv_proj sliced by the config's head
    counts, the same gate_up_proj): Phi-3's plan. Its image and audio towers (embed_tokens_extend)
    stay whole: no check runs them yet (plangen.tower_inputs)."""
    if sequence_parallel:
        raise ValueError(
            f"{type(model).__name__}: no sequence-parallel plan: embed_tokens_extend merges image and audio "
            "features into the embedding's output, which sequence parallel would leave sequence-sharded; "
            "use sequence_parallel=False"
        )
    plan = plan_phi3(model, False)
    towers = Replicated("model.embed_tokens_extend", "the image and audio towers, which no numerical check runs "
                        "yet (no inputs built for them in plangen.tower_inputs): whole", "other")
    return Plan(plan.entries, plan.source, (*plan.replicated, towers), False)


def build_conv1d_decoder_plan(
    model: nn.Module,
    *,
    sequence_parallel: bool,
    embedding: str,
    head_attributes: tuple[str, ...],
    norms: tuple[str, ...],
    layer: str = "transformer.h.*",
) -> Plan:
    """GPT-2-style decoders: ``Conv1D`` projections (weights ``[in, out]``), a fused ``c_attn``
    ``[q; k; v]`` of equal parts, learned position embeddings, the head tied to the embedding."""
    if sequence_parallel:
        raise ValueError(
            f"{type(model).__name__}: no sequence-parallel plan: its learned position embedding is added to the"
            " token embedding outside any module a style can lay out; use sequence_parallel=False"
        )
    entries: list[PlanEntry] = []

    def add(pattern: str, style: str, group: str, why: str, **kwargs: object) -> None:
        entries.append(PlanEntry(pattern, style, kwargs, group, why))

    add(embedding, "RowwiseParallel", "embeddings", "vocab-parallel embedding; all-reduce",
        input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True)
    add(f"{layer}.attn", "LocalHeadCounts", "attention", "splits the fused c_attn by split_size: make it this rank's",
        attributes=head_attributes)
    add(f"{layer}.attn.c_attn", "FusedColwiseParallel", "attention",
        "each rank holds its own heads' q, k, v; one input-gradient reduction per block",
        part_sizes=(1, 1, 1), input_layouts=Replicate(), use_local_output=True)
    add(f"{layer}.attn.c_proj", "Conv1DRowwiseParallel", "attention", "row-parallel: one all-reduce",
        input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)
    add(f"{layer}.mlp.c_fc", "Conv1DColwiseParallel", "mlp", "column-parallel; one input-gradient reduction per block",
        input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    add(f"{layer}.mlp.c_proj", "Conv1DRowwiseParallel", "mlp", "row-parallel: one all-reduce",
        input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)
    add("lm_head", "ColwiseParallel", "output", "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
        input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    replicated = [Replicated(n, "sees the full hidden state on every rank: nothing to shard", "norms") for n in norms]
    replicated.append(Replicated(
        embedding.rsplit(".", 1)[0] + (".wpe" if embedding.endswith("wte") else ".positions_embed"),
        "learned position embedding, small: kept whole", "embeddings"))
    return Plan(tuple(entries), "hand-written", tuple(replicated), sequence_parallel)


@register_plan("GPT2LMHeadModel")
def plan_gpt2(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_conv1d_decoder_plan(
        model,
        sequence_parallel=sequence_parallel,
        embedding="transformer.wte",
        head_attributes=("num_heads", "split_size"),
        norms=("transformer.h.*.ln_1", "transformer.h.*.ln_2", "transformer.ln_f"),
    )


@register_plan("OpenAIGPTLMHeadModel")
def plan_openai_gpt(model: nn.Module, sequence_parallel: bool) -> Plan:
    return build_conv1d_decoder_plan(
        model,
        sequence_parallel=sequence_parallel,
        embedding="transformer.tokens_embed",
        head_attributes=("n_head", "split_size"),
        norms=("transformer.h.*.ln_1", "transformer.h.*.ln_2"),
    )

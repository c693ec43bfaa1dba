"""Hand-written Megatron-style plans for decoders with fused projections (Phi-3: ``qkv_proj``, ``gate_up_proj``).

A fused projection is the only consumer of its block's input, so its column-parallel style also
prepares that input: with sequence parallel (SP) it gathers the sequence once per block and
reduce-scatters the input gradient once; without SP it reduces the input gradient once per block.
The fused weights are re-laid out so each rank holds its own heads' q, k, v and its own slice of
gate and up (:class:`plangen.styles.fused.FusedColwiseParallel`); the state dict keeps the Hugging
Face layout. The attention module's head counts are made local (:class:`LocalHeadCounts`) because
Phi-3 slices ``qkv`` by them. Per layer: two all-reduces, or with SP two all-gathers and two
reduce-scatters, the Megatron minimum, as in :mod:`plangen.plans.dense`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.model.resolve import text_config
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.dense import LLAMA_NORMS, SEQ, text_prefix
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


def _heads(model: nn.Module) -> tuple[int, int]:
    config = text_config(model.config)
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


@register_plan("Phi3ForCausalLM")
def plan_phi3(model: nn.Module, sequence_parallel: bool) -> Plan:
    heads, kv_heads = _heads(model)
    return build_fused_decoder_plan(
        text_prefix(model),
        sequence_parallel=sequence_parallel,
        qkv_parts=(heads, kv_heads, kv_heads),
        # Phi3Attention slices qkv at config.num_attention_heads * head_dim and num_key_value_heads * head_dim.
        head_attributes=("num_key_value_heads", "config.num_attention_heads", "config.num_key_value_heads"),
        layer_norms=LLAMA_NORMS,
    )


_PHI4_IMAGE = "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*"
_PHI4_AUDIO = "model.embed_tokens_extend.audio_embed.encoder"


@register_plan("Phi4MultimodalForCausalLM")
def plan_phi4_multimodal(model: nn.Module, sequence_parallel: bool) -> Plan:
    """Phi-4-multimodal's text decoder is Phi-3's (the same fused qkv_proj sliced by the config's head
    counts, the same gate_up_proj): Phi-3's plan. Its towers (embed_tokens_extend), run by the checks'
    images and audio (plangen.model.tower_inputs), are sharded TP only as plangen.plans.synthesis.towers shards towers:
    the SigLIP image encoder's and the conformer's attention by heads, their MLPs by the intermediate."""
    if sequence_parallel:
        raise ValueError(
            f"{type(model).__name__}: no sequence-parallel plan: embed_tokens_extend merges image and audio "
            "features into the embedding's output, which sequence parallel would leave sequence-sharded; "
            "use sequence_parallel=False"
        )
    plan = plan_phi3(model, False)
    return Plan((*plan.entries, *_phi4_tower_entries()), plan.source, (*plan.replicated, *_PHI4_TOWERS_KEPT), False)


def _phi4_tower_entries() -> list[PlanEntry]:
    rowwise = dict(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True)
    colwise = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    fused = dict(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True)
    once = "one input-gradient reduction per block in backward"
    entries = [
        PlanEntry(
            f"{_PHI4_IMAGE}.self_attn",
            "PrepareModuleInput",
            dict(
                input_kwarg_layouts={"hidden_states": Replicate()},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=False,
            ),
            "attention",
            f"the image encoder's attention (views by -1 heads): {once}",
        ),
        *(
            PlanEntry(
                f"{_PHI4_IMAGE}.self_attn.{p}",
                "ColwiseParallel",
                colwise,
                "attention",
                "column-parallel: this rank's heads",
            )
            for p in ("q_proj", "k_proj", "v_proj")
        ),
        PlanEntry(
            f"{_PHI4_IMAGE}.self_attn.out_proj", "RowwiseParallel", rowwise, "attention", "row-parallel: all-reduce"
        ),
        PlanEntry(
            f"{_PHI4_IMAGE}.mlp",
            "PrepareModuleInput",
            dict(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=False),
            "mlp",
            f"the image encoder's MLP: {once}",
        ),
        PlanEntry(f"{_PHI4_IMAGE}.mlp.fc1", "ColwiseParallel", colwise, "mlp", "column-parallel: this rank's slice"),
        PlanEntry(f"{_PHI4_IMAGE}.mlp.fc2", "RowwiseParallel", rowwise, "mlp", "row-parallel: all-reduce"),
        # The conformer adds a relative-position bias of one value per head (bias_values) to the mask it
        # hands every layer: each rank's attention takes its heads' slice of it, and the bias table,
        # whose gradient each rank then computes for its heads only, has it summed over TP.
        PlanEntry(
            f"{_PHI4_AUDIO}.relative_attention_bias_layer.bias_values",
            "AllReduceParamGrads",
            {},
            "other",
            "one bias per head, sliced to this rank's heads in each layer: its gradient summed over TP",
        ),
        PlanEntry(
            f"{_PHI4_AUDIO}.encoders.*.self_attn",
            "PrepareAttentionInputOutput",
            dict(
                input_layouts=(Replicate(), None),
                desired_input_layouts=(Replicate(), None),
                output_layouts=Replicate(),
                desired_output_layouts=Replicate(),
                use_local_output=True,
                head_inputs=("attention_mask",),
            ),
            "attention",
            f"the conformer's attention (views by -1 heads): {once}; its all-heads mask (with the bias) sliced to its heads",
        ),
        *(
            PlanEntry(
                f"{_PHI4_AUDIO}.encoders.*.self_attn.{p}",
                "ColwiseParallel",
                colwise,
                "attention",
                "column-parallel: this rank's heads",
            )
            for p in ("q_proj", "k_proj", "v_proj")
        ),
        PlanEntry(
            f"{_PHI4_AUDIO}.encoders.*.self_attn.o_proj",
            "RowwiseParallel",
            rowwise,
            "attention",
            "row-parallel: all-reduce",
        ),
    ]
    for mlp in ("feed_forward_in", "feed_forward_out"):  # layer_norm, then gate_up_proj packed [up; gate] (chunk(2))
        entries += [
            PlanEntry(
                f"{_PHI4_AUDIO}.encoders.*.{mlp}.gate_up_proj",
                "FusedColwiseParallel",
                fused,
                "mlp",
                "each rank holds its own slice of up and of gate; one input-gradient reduction per block",
            ),
            PlanEntry(
                f"{_PHI4_AUDIO}.encoders.*.{mlp}.down_proj",
                "RowwiseParallel",
                rowwise,
                "mlp",
                "row-parallel: all-reduce",
            ),
        ]
    return entries


_PHI4_TOWERS_KEPT = (
    Replicated(
        "model.embed_tokens_extend.audio_embed.encoder.encoders.*.conv",
        "the conformer's convolution module "
        "(GLU pointwise conv, depthwise conv, then two channel-mixing pointwise convs with an activation between "
        "them): split by channels it would need a collective between those two, a third per block",
        "other",
    ),
    Replicated(
        "model.embed_tokens_extend",
        "outside the towers' attention and MLPs (patch and position embeddings, "
        "the conformer's subsampling convs, norms, the image pooling head, the projections into the text): "
        "whole on every rank, run once per input, not once per layer",
        "other",
    ),
)


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

    add(
        embedding,
        "RowwiseParallel",
        "embeddings",
        "vocab-parallel embedding; all-reduce",
        input_layouts=Replicate(),
        output_layouts=Replicate(),
        use_local_output=True,
    )
    add(
        f"{layer}.attn",
        "LocalHeadCounts",
        "attention",
        "splits the fused c_attn by split_size: make it this rank's",
        attributes=head_attributes,
    )
    add(
        f"{layer}.attn.c_attn",
        "FusedColwiseParallel",
        "attention",
        "each rank holds its own heads' q, k, v; one input-gradient reduction per block",
        part_sizes=(1, 1, 1),
        input_layouts=Replicate(),
        use_local_output=True,
    )
    add(
        f"{layer}.attn.c_proj",
        "Conv1DRowwiseParallel",
        "attention",
        "row-parallel: one all-reduce",
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    )
    add(
        f"{layer}.mlp.c_fc",
        "Conv1DColwiseParallel",
        "mlp",
        "column-parallel; one input-gradient reduction per block",
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=True,
    )
    add(
        f"{layer}.mlp.c_proj",
        "Conv1DRowwiseParallel",
        "mlp",
        "row-parallel: one all-reduce",
        input_layouts=Shard(-1),
        output_layouts=Replicate(),
        use_local_output=True,
    )
    add(
        "lm_head",
        "ColwiseParallel",
        "output",
        "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
        input_layouts=Replicate(),
        output_layouts=Shard(-1),
        use_local_output=False,
    )
    replicated = [Replicated(n, "sees the full hidden state on every rank: nothing to shard", "norms") for n in norms]
    replicated.append(
        Replicated(
            embedding.rsplit(".", 1)[0] + (".wpe" if embedding.endswith("wte") else ".positions_embed"),
            "learned position embedding, small: kept whole",
            "embeddings",
        )
    )
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

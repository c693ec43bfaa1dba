"""Hand-written plans for mixture-of-experts decoders: attention as the dense plans shard it, the
experts split over TP on the expert dimension (:class:`plangen.styles.experts.ExpertsParallel`).

Every MLP block, MoE or dense, ends the same way: its branches (the routed experts, the shared
experts, a dense MLP's ``down_proj``) leave local partial sums, and the block's own style reduces
them once: one all-reduce of B·S·H per layer, or with sequence parallel one all-gather of the
block's input and one reduce-scatter of its output. Where shared experts sit beside the routed
ones the block reduces its input's gradient once for all branches too
(:mod:`plangen.styles.moe_blocks`), where each branch reduced its own. The router runs replicated on every token, so
the routing and the auxiliary load-balancing loss are exactly the unsharded model's.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from plangen.model.resolve import text_config
from plangen.styles.experts import EXPERTS_PARALLEL_WHY, INPUT_GRAD_LEFT_WHY, expert_count
from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.registry import register_plan
from plangen.plans.dense import LLAMA_NORMS, SEQ, text_prefix, build_dense_decoder_plan, grouped_query
from plangen.plans.fused import build_fused_decoder_plan
from plangen.plans.families.latent import has_query_latent, latent_attention_entries, shards_query_latent

# Names transformers gives the parts of a MoE block.
SHARED_EXPERTS = ("shared_experts", "shared_expert")
ROUTERS = ("gate", "router")
DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


def _block_parts(model: nn.Module, layer_prefix: str) -> tuple[set[str], set[str], set[str], set[str]]:
    """Children of ``layers.*.mlp``: shared experts, routers, other replicated linears (a shared
    expert's gate), dense-MLP projections."""
    shared, routers, gates, dense = set(), set(), set(), set()
    head = f"{layer_prefix}."
    for name, module in model.named_modules():
        if not name.startswith(head):
            continue
        parts = name[len(head) :].split(".")
        if len(parts) != 3 or parts[1] != "mlp":  # <layer index>.mlp.<child>
            continue
        child = parts[2]
        if child in SHARED_EXPERTS:
            shared.add(child)
        elif child in DENSE_MLP and isinstance(module, nn.Linear):
            dense.add(child)
        elif child in ROUTERS:
            routers.add(child)
        elif isinstance(module, nn.Linear):
            gates.add(child)
    return shared, routers, gates, dense


def build_moe_decoder_plan(
    model: nn.Module,
    *,
    sequence_parallel: bool,
    layer_norms: tuple[str, ...] = LLAMA_NORMS,
    per_head_norms: bool,
    block_outputs: int = 1,
    latent_attention: bool = False,
) -> Plan:
    """``block_outputs``: how many values the MoE block returns (gpt-oss's: the hidden state and the
    router scores, which the layer drops): the first is reduced, the others pass through untouched."""
    prefix = text_prefix(model)
    dense_plan = build_dense_decoder_plan(
        prefix,
        sequence_parallel=sequence_parallel,
        layer_norms=layer_norms,
        per_head_norms=per_head_norms,
        replicate_kv=grouped_query(model),
    )
    layer = f"{prefix}.layers.*"
    sp = sequence_parallel
    # The dense plan's MLP entries assume a gate/up/down MLP in every layer: the MoE block replaces them.
    entries = [e for e in dense_plan.entries if not e.pattern.startswith(f"{layer}.mlp")]
    replicated = list(dense_plan.replicated)
    if latent_attention:  # MLA replaces the dense plan's q/k/v/o entries
        attention = f"{layer}.self_attn"
        entries = [e for e in entries if not e.pattern.startswith(attention)]
        query = has_query_latent(model)
        latent, kept = latent_attention_entries(
            attention,
            sequence_parallel=sp,
            query_latent=query,
            shard_query_latent=query and shards_query_latent(text_config(model.config)),
        )
        entries[1:1] = latent  # after the embedding, as the file groups them
        replicated += kept
    shared, routers, gates, dense = _block_parts(model, f"{prefix}.layers")

    def add(pattern: str, style: str, why: str, **kwargs: object) -> None:
        entries.append(PlanEntry(pattern, style, kwargs, "mlp", why))

    # The block reduces its branches' input gradients once (MoeBlockParallel): each branch (the
    # routed experts, shared experts) leaves its own partial, the router's and gates' count once.
    # Without shared experts that still matters under SP: the experts' partial gradient is
    # reduce-scattered by the gather's backward, where an all-reduce of B·S·H came before it.
    once = len(routers) == 1
    parts = ["the experts", *(["shared experts"] if shared else []), *(["dense projections"] if dense else [])]
    branches = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]
    add(
        f"{layer}.mlp",
        "MoeBlockParallel" if once else "PrepareModuleInputOutput",
        ("one all-gather of the sequence in, one reduce-scatter out" if sp else "one all-reduce of the summed branches")
        + f": {branches} leave partial sums, reduced once here"
        + (
            f"; their input gradients summed locally and reduced once (the router's{' and gates' if gates else ''} "
            "counted once)"
            if once
            else ""
        ),
        **(dict(router=next(iter(routers)), gates=tuple(sorted(gates))) if once else {}),
        input_layouts=(SEQ if sp else Replicate(),),
        desired_input_layouts=(Replicate(),),
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_input=True,
        # torch passes an output whose layout is None through and never reads its desired layout.
        output_layouts=(Partial(), *(None,) * (block_outputs - 1)),
        desired_output_layouts=(SEQ if sp else Replicate(), *(Replicate(),) * (block_outputs - 1)),
        use_local_output=not sp,
    )
    left = f"; {INPUT_GRAD_LEFT_WHY}"
    add(
        f"{layer}.mlp.experts",
        "ExpertsParallel",
        EXPERTS_PARALLEL_WHY + (left if once else ""),
        output_layouts=Partial(),
        **(dict(sum_input_grad=False) if once else {}),
    )
    for owner in sorted(shared) + ([""] if dense else []):
        path = f"{layer}.mlp.{owner}." if owner else f"{layer}.mlp."
        what = "shared experts" if owner else "dense MLP (layers without experts)"
        if owner:  # transformers' MoE blocks call their shared experts with the hidden state, positionally
            add(
                f"{layer}.mlp.{owner}",
                "PartialGradInput" if once else "PrepareModuleInput",
                "shared experts: one Replicate DTensor input, so gate and up "
                + ("add their partial input gradients on it" + left if once else "reduce their input gradient once"),
                input_layouts=(Replicate(),),
                desired_input_layouts=(Replicate(),),
                input_kwarg_layouts=None,
                desired_input_kwarg_layouts=None,
                use_local_output=False,
            )
        for proj in ("gate_proj", "up_proj"):
            add(
                f"{path}{proj}",
                "ColwiseParallel",
                f"{what}: column-parallel",
                input_layouts=Replicate(),
                output_layouts=Shard(-1),
                use_local_output=True,
            )
        add(
            f"{path}down_proj",
            "RowwiseParallel",
            f"{what}: row-parallel, partial sum out (reduced by the block)",
            input_layouts=Shard(-1),
            output_layouts=Partial(),
            use_local_output=True,
        )
    for gate in sorted(gates):
        add(
            f"{layer}.mlp.{gate}",
            "AllReduceOutputGrad",
            "replicated gate scaling the shared experts' partial output: its output gradient is summed over TP",
        )
    for router in sorted(routers):
        replicated.append(
            Replicated(f"{layer}.mlp.{router}", "the router sees every token on every rank: routing stays exact", "mlp")
        )
    return Plan(tuple(entries), "hand-written", tuple(replicated), sequence_parallel)


def _check_experts(model: nn.Module) -> None:
    if not any(expert_count(m) for m in model.modules()):
        raise ValueError(f"{type(model).__name__}: no packed experts module found (transformers 5.x layout expected)")


@register_plan("Qwen3MoeForCausalLM")
def plan_qwen3_moe(model: nn.Module, sequence_parallel: bool) -> Plan:
    _check_experts(model)
    return build_moe_decoder_plan(model, sequence_parallel=sequence_parallel, per_head_norms=True)


@register_plan("MixtralForCausalLM", "Qwen2MoeForCausalLM")
def plan_mixtral_like(model: nn.Module, sequence_parallel: bool) -> Plan:
    _check_experts(model)
    return build_moe_decoder_plan(model, sequence_parallel=sequence_parallel, per_head_norms=False)


@register_plan("Glm4MoeForCausalLM")
def plan_glm4_moe(model: nn.Module, sequence_parallel: bool) -> Plan:
    # Dense first layers (first_k_dense_replace) share the MoE block's style; q/k norms, when the
    # config has them, are one head wide.
    _check_experts(model)
    per_head = bool(getattr(model.config, "use_qk_norm", False))
    return build_moe_decoder_plan(model, sequence_parallel=sequence_parallel, per_head_norms=per_head)


@register_plan("GptOssForCausalLM")
def plan_gpt_oss(model: nn.Module, sequence_parallel: bool) -> Plan:
    # Attention with biases on q/k/v (column-parallel, split with the heads) and o_proj (row-parallel:
    # added once, after the reduction), one learned sink logit per head (split with the heads by the
    # block's own style), sliding-window layers (masks are built on the whole sequence either way).
    # The MoE block returns (hidden, router scores); experts carry per-expert biases, split with them.
    _check_experts(model)
    plan = build_moe_decoder_plan(model, sequence_parallel=sequence_parallel, per_head_norms=False, block_outputs=2)
    attention = f"{text_prefix(model)}.layers.*.self_attn"
    entries = tuple(
        replace(e, style="AttentionSinksParallel", why=f"{e.why}; the sinks (one per head) split with the heads")
        if e.pattern == attention
        else e
        for e in plan.entries
    )
    return replace(plan, entries=entries)


@register_plan("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
def plan_deepseek(model: nn.Module, sequence_parallel: bool) -> Plan:
    # Dense first layers, shared experts, and multi-head latent attention sharded by heads (with or
    # without a query latent: V2-Lite has q_proj).
    _check_experts(model)
    return build_moe_decoder_plan(
        model, sequence_parallel=sequence_parallel, per_head_norms=False, latent_attention=True
    )


@register_plan("Llama4ForCausalLM")
def plan_llama4(model: nn.Module, sequence_parallel: bool) -> Plan:
    # Attention as Llama's (its q/k L2 norm has no weight; chunked and NoPE layers differ only in
    # masks and rotary, built outside the layers). MoE layers (config.moe_layers) run every expert on
    # every token: EveryTokenMoeParallel splits them on the expert dim and reduces the block once; a
    # shared expert column/row-parallel beside them. Dense layers (Maverick interleaves them) as Llama's MLP.
    config = text_config(model.config)
    prefix = text_prefix(model)
    sp = sequence_parallel
    dense_plan = build_dense_decoder_plan(
        prefix,
        sequence_parallel=sp,
        layer_norms=LLAMA_NORMS,
        per_head_norms=False,
        replicate_kv=grouped_query(model),
    )
    layer = f"{prefix}.layers.*"
    entries = [e for e in dense_plan.entries if not e.pattern.startswith(f"{layer}.mlp")]
    mlp_entries = [e for e in dense_plan.entries if e.pattern.startswith(f"{layer}.mlp")]
    replicated = list(dense_plan.replicated)
    count = config.num_hidden_layers
    moe_layers = sorted(set(config.moe_layers))
    # One pattern for every layer where all are alike; per layer index where MoE and dense layers mix.
    every = len(moe_layers) == count
    moe_at = ["*"] if every else [str(i) for i in moe_layers]
    dense_at = [] if every else [str(i) for i in range(count) if i not in moe_layers]

    def add(pattern: str, style: str, why: str, **kwargs: object) -> None:
        entries.append(PlanEntry(pattern, style, kwargs, "mlp", why))

    for at in dense_at:
        entries += [
            replace(e, pattern=e.pattern.replace(f"{layer}.mlp", f"{prefix}.layers.{at}.feed_forward"))
            for e in mlp_entries
        ]
    for at in moe_at:
        block = f"{prefix}.layers.{at}.feed_forward"
        add(
            block,
            "EveryTokenMoeParallel",
            "each rank holds E/tp whole experts and scores of them; "
            + (
                "one all-gather of the sequence in, one reduce-scatter out"
                if sp
                else "one all-reduce of the summed branches"
            )
            + " (the router logits pass through); the experts' and the shared expert's input gradients reduced once",
            input_grad_once=True,
            input_layouts=(SEQ if sp else Replicate(),),
            desired_input_layouts=(Replicate(),),
            input_kwarg_layouts=None,
            desired_input_kwarg_layouts=None,
            use_local_input=True,
            output_layouts=(Partial(), None),
            # The block returns [B·S, H]: under SP a Partial DTensor, reduce-scattered onto the
            # sequence where the layer adds it to the sequence-sharded residual.
            desired_output_layouts=(Partial() if sp else Replicate(), Replicate()),
            use_local_output=not sp,
        )
        add(
            f"{block}.shared_expert",
            "PartialGradInput",
            "shared expert: one Replicate DTensor input, gate and up add their partial input gradients on it"
            " (reduced once by the block)",
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            input_kwarg_layouts=None,
            desired_input_kwarg_layouts=None,
            use_local_output=False,
        )
        for proj in ("gate_proj", "up_proj"):
            add(
                f"{block}.shared_expert.{proj}",
                "ColwiseParallel",
                "shared expert: column-parallel",
                input_layouts=Replicate(),
                output_layouts=Shard(-1),
                use_local_output=True,
            )
        add(
            f"{block}.shared_expert.down_proj",
            "RowwiseParallelOwnOutput",
            "shared expert: row-parallel, partial sum out (reduced by the block); its output is a copy,"
            " which the block adds the routed experts' sum into in place",
            input_layouts=Shard(-1),
            output_layouts=Partial(),
            use_local_output=True,
        )
        replicated.append(
            Replicated(
                f"{block}.router",
                "the router scores every expert for every token on every "
                "rank: routing stays exact (the block keeps this rank's experts' scores)",
                "mlp",
            )
        )
    return Plan(tuple(entries), "hand-written", tuple(replicated), sp)


# LongCat-Flash's decoder layer holds its sublayers in ModuleLists: two latent attentions, two dense
# MLPs and their norms, indexed 0 and 1; the MoE block (a shortcut from the first sublayer's norm to
# the layer's output) is one.
_LONGCAT_LISTS = ("self_attn", "input_layernorm", "post_attention_layernorm")


@register_plan("LongcatFlashForCausalLM")
def plan_longcat_flash(model: nn.Module, sequence_parallel: bool) -> Plan:
    # Both latent attentions by heads (MLA, with LoRA scales that are single numbers), both dense MLPs
    # column/row-parallel, the experts split on each expert's intermediate: beside its real experts
    # the router picks zero-compute identity experts, computed on every rank as a 1/tp share
    # (plangen.styles.experts.choose_expert_layout).
    _check_experts(model)
    prefix = text_prefix(model)
    layer = f"{prefix}.layers.*"
    plan = build_moe_decoder_plan(
        model, sequence_parallel=sequence_parallel, per_head_norms=False, latent_attention=True
    )

    def listed(pattern: str) -> str:
        for part in _LONGCAT_LISTS:
            head = f"{layer}.{part}"
            if pattern == head or pattern.startswith(f"{head}."):
                return f"{head}.*{pattern[len(head) :]}"
        return pattern

    dense = build_dense_decoder_plan(
        prefix, sequence_parallel=sequence_parallel, layer_norms=LLAMA_NORMS, per_head_norms=False
    )
    mlps = [
        replace(e, pattern=f"{layer}.mlps.*{e.pattern[len(f'{layer}.mlp') :]}", why=f"dense MLPs: {e.why}")
        for e in dense.entries
        if e.pattern == f"{layer}.mlp" or e.pattern.startswith(f"{layer}.mlp.")
    ]
    return replace(
        plan,
        entries=tuple(replace(e, pattern=listed(e.pattern)) for e in plan.entries) + tuple(mlps),
        replicated=tuple(replace(r, pattern=listed(r.pattern)) for r in plan.replicated),
    )


@register_plan("JetMoeForCausalLM")
def plan_jetmoe(model: nn.Module, sequence_parallel: bool) -> Plan:
    # JetMoE's experts (JetMoeParallelExperts) are one [E, out, in] weight applied per expert to the
    # tokens sorted by expert, called with per-expert token counts rather than top-k ids, in its MoE
    # and in its mixture of attention heads (MoA: each expert a query projection of num_key_value_heads
    # heads and its output projection; k and v shared, packed in kv_proj). Each expert is split
    # Megatron-style: input_linear by output features (the MoA's query heads, the MoE's [gate; up]
    # re-laid out), output_linear by input features; kv_proj split by heads with them. The routers
    # run replicated on every token: routing and the auxiliary loss are exact.
    #
    # Each block (self_attention, mlp) ends as a dense row-parallel layer does, in one reduction of
    # B·S·H (RoutedBlockParallel: an all-reduce; under SP RoutedBlockSequenceParallel: a
    # reduce-scatter onto the sequence-sharded residual, the sequence gathered in once): its experts
    # leave partial sums through the gates and the scatter back (both linear), summed over the top k
    # locally, and the block's bias is added once after the reduction. Reducing each output_linear's
    # routed tokens instead costs k times that. The block's input gradient is reduced once for all
    # its readers (kv_proj, the routed tokens, the router, counted once), and the gates' gradient,
    # partial like the outputs they scale, is all-reduced (B·S·k), so the router's gradients and the
    # auxiliary loss stay exact. Under SP the norms and the residual stream are sequence-sharded.
    sp = sequence_parallel
    prefix = text_prefix(model)
    layer = f"{prefix}.layers.*"
    dense = build_dense_decoder_plan(prefix, sequence_parallel=sp, layer_norms=LLAMA_NORMS, per_head_norms=False)
    blocks = (f"{layer}.self_attn", f"{layer}.mlp")  # the dense plan's attention and MLP: JetMoE's differ
    entries = [e for e in dense.entries if not e.pattern.startswith(blocks)]
    replicated = list(dense.replicated)
    attention, mlp = f"{layer}.self_attention", f"{layer}.mlp"
    block_style = "RoutedBlockSequenceParallel" if sp else "RoutedBlockParallel"
    reduced = (
        "sequence parallel: the sequence gathered in once, the experts' partial sums reduce-scattered out"
        if sp
        else "the experts' partial sums (the top k summed locally) all-reduced once, B·S·H"
    )
    seq = dict(sequence_dim=1) if sp else {}
    after = "the bias added once on the shard" if sp else "the bias added once after"
    regions = [
        PlanEntry(
            f"{attention}",
            block_style,
            dict(
                input_kwarg="hidden_states",
                bias="experts.bias",
                router="experts.router",
                reads_gathered=("kv_proj",),
                **seq,
            ),
            "attention",
            f"{reduced}, {after} (its attention weights and router logits pass through)",
        ),
        PlanEntry(f"{mlp}", block_style, dict(seq), "mlp", f"{reduced}, {after}"),
    ]
    summed, reduction = dict(sum_output=False), "its partial sums left to the block"
    inputs, input_grad = dict(sum_input_grad=False), INPUT_GRAD_LEFT_WHY
    ours = [
        *regions,
        PlanEntry(
            f"{attention}.kv_proj",
            "FusedColwiseParallel",
            dict(part_sizes=(1, 1), input_layouts=Replicate(), use_local_output=True),
            "attention",
            "packed [k; v] split by heads: each rank its share of both, the heads its query experts read",
        ),
        PlanEntry(
            f"{attention}.experts",
            "LocalHeadCounts",
            dict(attributes=("hidden_size",)),
            "attention",
            "the attention experts' query width (all their heads) made this rank's: map() sizes its output by it",
        ),
        PlanEntry(
            f"{attention}.experts.input_linear",
            "GroupedColwiseParallel",
            dict(inputs),
            "attention",
            f"each attention expert's query heads split over TP; {input_grad}",
        ),
        PlanEntry(
            f"{attention}.experts.output_linear",
            "GroupedRowwiseParallel",
            dict(summed),
            "attention",
            f"each attention expert's output projection by its heads: {reduction}",
        ),
        PlanEntry(
            f"{mlp}.input_linear",
            "GroupedColwiseParallel",
            dict(part_sizes=(1, 1), **inputs),
            "mlp",
            f"each expert's [gate; up] split over TP, each rank its share of both; {input_grad}",
        ),
        PlanEntry(
            f"{mlp}.output_linear",
            "GroupedRowwiseParallel",
            dict(summed),
            "mlp",
            f"each expert's down projection by its intermediate: {reduction}",
        ),
    ]
    entries[1:1] = ours  # after the embedding, as the file groups them
    why = "the router sees every token on every rank: routing stays exact"
    replicated += [Replicated(f"{attention}.experts.router", why, "attention"), Replicated(f"{mlp}.router", why, "mlp")]
    return Plan(tuple(entries), "hand-written", tuple(replicated), sp)


@register_plan("DbrxForCausalLM")
def plan_dbrx(model: nn.Module, sequence_parallel: bool) -> Plan:
    # DBRX: each block a norm-attention-norm wrapper (norm_1, attention with one fused Wqkv [q; k; v],
    # the residual add, norm_2) and a MoE block (ffn: router, experts as flat [E * ffn, H] weights
    # w1/v1/w2 in experts.mlp). Attention as Phi-3's fused qkv (one KV head, as the default config
    # has: the KV head computed whole on every rank, MultiQueryColwiseParallel); clip_qkv clamps
    # elementwise, on this rank's q/k/v alike. The experts: whole experts per rank, or each expert's
    # ffn rows split where the TP size does not divide them (plangen.styles.flat_experts), reduced
    # once by the MoE block as every other MoE plan does.
    config = model.config
    heads, kv_heads = config.n_heads, config.attn_config.kv_n_heads
    sp = sequence_parallel
    layer = "transformer.blocks.*"
    wrapper = f"{layer}.norm_attn_norm"
    one_kv_head = kv_heads == 1
    plan = build_fused_decoder_plan(
        "transformer",
        sequence_parallel=sp,
        qkv_parts=(heads, kv_heads, kv_heads),
        # DbrxAttention splits Wqkv's output at hidden_size and kv heads * head_dim and repeats each KV
        # head num_key_value_groups times.
        head_attributes=("hidden_size", "num_key_value_groups" if one_kv_head else "num_key_value_heads"),
        layer_norms=("norm_attn_norm.norm_1", "norm_attn_norm.norm_2"),
        attention="norm_attn_norm.attn",
        qkv="Wqkv",
        out="out_proj",
        mlp="ffn",
        embedding="wte",
        final_norm="norm_f",
        layers="blocks",
    )
    ffn, router = f"{layer}.ffn", "router"
    entries = [e for e in plan.entries if not e.pattern.startswith(ffn)]  # the fused plan's gate_up/down
    if one_kv_head:
        qkv = f"{wrapper}.attn.Wqkv"
        entries = [
            replace(
                e,
                style="MultiQueryColwiseParallel",
                why="each rank holds its own query heads and the one KV"
                " head whole (its rows gathered per forward); one input-gradient reduction per block",
                kwargs=dict(part_sizes=(heads, 1, 1), shared_parts=(1, 2), input_layouts=e.kwargs["input_layouts"]),
            )
            if e.pattern == qkv
            else e
            for e in entries
        ]
    entries.append(
        PlanEntry(
            ffn,
            "MoeBlockParallel",
            dict(
                router=router,
                gates=(),
                input_layouts=(SEQ if sp else Replicate(),),
                desired_input_layouts=(Replicate(),),
                input_kwarg_layouts=None,
                desired_input_kwarg_layouts=None,
                use_local_input=True,
                output_layouts=(Partial(),),
                desired_output_layouts=(SEQ if sp else Replicate(),),
                use_local_output=not sp,
            ),
            "mlp",
            ("one all-gather of the sequence in, one reduce-scatter out" if sp else "one all-reduce")
            + ": the experts leave partial sums, reduced once here; their input gradient reduced once too (the router's"
            " counted once)",
        )
    )
    entries.append(
        PlanEntry(
            f"{ffn}.experts",
            "FlatExpertsParallel",
            dict(output_layouts=Partial(), sum_input_grad=False),
            "mlp",
            "each rank holds E/tp whole experts (a Shard(0) of each flat [E * ffn, H] weight) where the TP size divides"
            f" E, else its slice of every expert's ffn rows, and computes the routes to them; partial sum out; {INPUT_GRAD_LEFT_WHY}",
        )
    )
    replicated = (
        *plan.replicated,
        Replicated(f"{ffn}.{router}", "the router sees every token on every rank: routing stays exact", "mlp"),
    )
    return replace(plan, entries=tuple(entries), replicated=replicated)

"""Custom plans in the three shapes a user may point custom_parallel_plan at."""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from plangen.styles import ReplicatedWithGradAllReduce

_LAYER = "model.layers.*"

# A dict at a dotted path; lm_head gathers the logits, so the model returns plain full logits.
llama_gathered_logits = {
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    **{f"{_LAYER}.self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
    f"{_LAYER}.self_attn.o_proj": RowwiseParallel(),
    **{f"{_LAYER}.mlp.{p}": ColwiseParallel() for p in ("gate_proj", "up_proj")},
    f"{_LAYER}.mlp.down_proj": RowwiseParallel(),
    "lm_head": ColwiseParallel(output_layouts=Replicate()),
}


def qwen3_plan_function():
    """A zero-argument function returning the plan (loaded from this file by path)."""
    plan = {k: v for k, v in llama_gathered_logits.items() if k != "lm_head"}
    plan[f"{_LAYER}.self_attn.q_norm"] = ReplicatedWithGradAllReduce()
    plan[f"{_LAYER}.self_attn.k_norm"] = ReplicatedWithGradAllReduce()
    plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def hf_plan_of_llama():
    """Llama's Hugging Face plan, translated: exercises the translation under FSDP2 + TP."""
    from plangen.styles import translate_parallel_style
    from transformers import LlamaConfig

    return {
        ("model." + k if not k.startswith("lm_head") else k): translate_parallel_style(v)
        for k, v in {**LlamaConfig.base_model_tp_plan, "lm_head": "colwise_gather_output"}.items()
    }


def opt_plan_with_global_head_counts():
    """OPT's synthesized TP plan as it was before its head counts were made local: the attention
    then views one rank's heads by the global ``self.num_heads`` (``view(bsz, -1, num_heads,
    head_dim)`` folds the missing heads into the sequence). Must fail the parity check: it pins the
    cause of OPT's silently wrong logits (tests/test_synthesized_distributed.py)."""
    from dataclasses import replace

    from plangen.model.resolve import build_meta_model, resolve_model
    from plangen.styles import build_parallel_styles
    from plangen.plans.synthesis.synthesize import build_synthesized_plan
    from plangen.model.shrink import shrink_config

    resolved = resolve_model("opt")
    model = build_meta_model(shrink_config(resolved.config, 2), resolved.model_class)
    plan = build_synthesized_plan(model, False)
    entries = tuple(
        replace(e, style="PrepareModuleInput", kwargs={k: v for k, v in e.kwargs.items() if k != "head_attributes"})
        if e.style == "PrepareAttentionInput"
        else e
        for e in plan.entries
    )
    assert any("head_attributes" in e.kwargs for e in plan.entries), "OPT's plan no longer makes its head counts local"
    return build_parallel_styles(replace(plan, entries=entries))


def falcon_plan_without_pad_mask():
    """The synthesized plan of the 5-head multi-query Falcon (tests/tiny_configs.py) with the output
    projection's pad mask removed: the forward is still exact, but the pad columns get gradients and
    the steps make them non-zero. Must fail the parity check: it pins why the mask is there
    (plangen.styles.padded_heads; tests/test_synthesized_distributed.py)."""
    from plangen.styles.kv_heads import PrepareAttentionInput
    from plangen.styles.padded_heads import PAD_MASK
    from plangen.styles import build_parallel_styles
    from plangen.plans.synthesis.synthesize import build_synthesized_plan
    from tiny_configs import build_tiny

    class WithoutPadMask(PrepareAttentionInput):
        def _apply(self, module, device_mesh):
            module = super()._apply(module, device_mesh)
            for child in module.children():
                if getattr(child, PAD_MASK, None) is not None:
                    getattr(child, PAD_MASK).remove()
            return module

    styles = build_parallel_styles(build_synthesized_plan(build_tiny("falcon-mqa-5h"), False))
    padded = [p for p, s in styles.items() if isinstance(s, PrepareAttentionInput) and s.padded_heads]
    assert padded, "the 5-head Falcon's plan no longer pads its heads"
    for pattern in padded:
        styles[pattern].__class__ = WithoutPadMask
    return styles


def bloom_plan_with_plain_alibi_slice():
    """Bloom's synthesized TP plan with its ALiBi cut as MPT's is, a plain slice of its first dim (the
    layer's input laid out Shard(0)) instead of each batch row's heads' rows: ``alibi`` stacks every
    batch row's heads, ``[batch x heads, 1, seq]``, so a plain slice hands rank 0 the first batch rows'
    every head. Must fail the parity check, with no error: it pins why the attention's input style
    keeps this rank's heads' rows (tests/test_synthesized_distributed.py)."""
    from dataclasses import replace

    from plangen.model.resolve import build_meta_model, resolve_model
    from plangen.plan import PlanEntry
    from plangen.styles import build_parallel_styles
    from plangen.plans.families.per_head_inputs import PerHeadInput, per_head_input_entry
    from plangen.plans.synthesis.synthesize import build_synthesized_plan
    from plangen.model.shrink import shrink_config

    resolved = resolve_model("bloom")
    config = shrink_config(resolved.config, 2, attn_implementation="eager")  # Bloom has no sdpa
    plan = build_synthesized_plan(build_meta_model(config, resolved.model_class), False)
    rows = [e for e in plan.entries if e.kwargs.get("batch_head_inputs")]
    assert rows, "Bloom's plan no longer keeps its heads' ALiBi rows"
    entries: list[PlanEntry] = [
        replace(e, kwargs={k: v for k, v in e.kwargs.items() if k != "batch_head_inputs"}) if e in rows else e
        for e in plan.entries
    ]
    entries.append(per_head_input_entry("transformer.h.*", PerHeadInput("alibi", 0, "the ALiBi bias")))
    return build_parallel_styles(replace(plan, entries=tuple(entries)))

"""Synthesized plans against the unsharded model, for real: gloo, four processes, one launch.

Classes with no hand-written plan, old and new, dense (GLM-4 among them), BERT-style split blocks, Qwen3.5's gated-delta-net linear attention (left-padded)
and its attention's per-head output gates (Qwen3.5-MoE, Qwen3-Next, LFM3), LFM's short-conv mixers split by channels, fused (GLM's packed gate|up;
GPT-NeoX's, Persimmon's, CodeGen's, MPT's and Bloom's packed q|k|v (their ALiBi cut to each rank's heads), DiffLlama's paired heads, GPT-BigCode's and Falcon-7B's multi-query one, their full state
dict read and loaded back at DP 2 x TP 2), with
OLMoE's whole-projection norms (sharded with the heads), MoE (experts split over TP), Mamba1 mixers
split by channels (Mamba, FalconMamba, Jamba; their full state dict at DP 2 x TP 2, and the stable
variant, which keeps them whole), RecurrentGemma's recurrent blocks split by their RG-LRU heads, xLSTM's mLSTM layers by heads, convolution layers, tied and untied; each at TP=2 and DP=2 x TP=2, sequence parallel off and
on (off only for the BERT family, which has none): logits, loss, every gradient and the gradient norms within 1e-5 of the single-process reference (fp32), and every parameter after three AdamW
steps (eps 1e-6, see train_steps in tests/distributed/cases.py). The plan is forced to the
synthesized one, and the committed sweep results (plangen/plans/proven.json, which the runtime
reads) must agree.
"""

from __future__ import annotations

import sys

import pytest

from conftest import cases_read_by, launched, slow_unless, stack_can_run, stack_cannot_run


CLASSES = {
    # model_type: (class, tied embeddings)
    "olmo": ("OlmoForCausalLM", False),  # parameter-free LayerNorms
    "olmoe": ("OlmoeForCausalLM", False),  # q/k norms over all heads, sharded with them; MoE
    "glm": ("GlmForCausalLM", False),  # packed gate|up re-laid out per rank (FusedColwiseParallel)
    "glm4": ("Glm4ForCausalLM", False),  # the same gate|up, with norms after attention and after the MLP
    "cohere": ("CohereForCausalLM", True),  # attention and MLP in parallel on one norm, logit scale
    "phi": ("PhiForCausalLM", False),  # biases, fc1/fc2, partial rotary, parallel residual
    "starcoder2": ("Starcoder2ForCausalLM", True),  # LayerNorm with bias, c_fc/c_proj
    # Dense then MoE layers, shared experts, multi-head latent attention by heads (DeepSeek-V3's layout;
    # DeepSeek-V3 itself has a hand-written plan now).
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", False),
    "jamba": ("JambaForCausalLM", False),  # Mamba1 mixers split by channels + attention layers, dense + MoE MLPs
    # Mamba1 mixers split by channels (plangen.styles.mamba1): in_proj's packed x|gate per rank.
    "mamba": ("MambaForCausalLM", True),
    "falcon_mamba": ("FalconMambaForCausalLM", True),  # weightless dt/B/C norms
    "lfm2": ("Lfm2ForCausalLM", True),  # w1/w2/w3, out_proj, q_layernorm: recognised by data flow
    "gemma": ("GemmaForCausalLM", True),  # scaled embeddings
    # BART-family decoders: k/v read through cross-attention's alias, fc1/fc2 in the layer itself,
    # learned position embeddings (SP: their output laid out as a Replicate DTensor), post-norm.
    "bart": ("BartForCausalLM", True),
    "opt": ("OPTForCausalLM", True),  # views by self.num_heads: made this rank's count
    "xglm": ("XGLMForCausalLM", True),  # views by self.num_heads and self.embed_dim; sinusoidal positions
    # reshape(bsz, tgt_len, embed_dim) by the input's own width: handed this rank's slice of the hidden
    # dimension (SP: an all-to-all to it), each of q/k/v all-gathers it.
    "trocr": ("TrOCRForCausalLM", True),
    # The same for its cross-attention; its n-gram self-attention too (it also views by the width after
    # out_proj, whose output is reduce-scattered to the slice and gathered at the block's end), its
    # bucket-major relative_pos_embeddings re-laid out per rank, its all-heads masks sliced, and its
    # predict stream's relative positions computed for all heads (plangen.styles.bucketed_attention).
    "prophetnet": ("ProphetNetForCausalLM", True),
    # Doge: the dynamic mask's dt_proj reads every KV head's values (row-parallel, reduce-scattered to
    # this rank's heads), its A split with the heads; the layer's residual scales stay whole (SP:
    # Replicate DTensors against the sequence-sharded residual, gradient summed over TP).
    "doge": ("DogeForCausalLM", False),
    # Built from a completed default config (plangen.model.default_configs): shared experts, dense first layer.
    "dots1": ("Dots1ForCausalLM", False),
    # Dots3-Note: its sliding layers' own MLA sizes shrunk consistently (head_dim = nope + rope), shared
    # experts, a dense first layer; its attention (latent, a sparse indexer on some layers) whole.
    "dots3_note": ("Dots3NoteForCausalLM", False),
    # Qwen4-Exp from a completed default config (its QSA indexer): gated delta nets by heads, experts split,
    # the shared expert by its intermediate; 4 hyper-connected residual streams, whole, keep it from SP.
    "qwen4_exp": ("Qwen4ExpForCausalLM", False),
    # Short-conv mixers split by channels (packed [B; C; x] re-laid out per rank), MoE with a routing bias.
    "lfm2_moe": ("Lfm2MoeForCausalLM", True),
    # The same short conv, and attention with a sigmoid output gate of one value per head (g_proj).
    "lfm3": ("Lfm3ForCausalLM", True),
    "granitemoe_swa": ("GraniteMoeSWAForCausalLM", False),  # attention sinks split with the heads; MoE
    # A router over routed and shared experts ([E + S, H], a learned global_scale) whole on every rank,
    # shared experts of 3-D weights split by their intermediate (SharedExpertsParallel), scaled per
    # token by the router; no SP (its normed embedding is not vocabulary-sharded).
    "inkling_text": ("InklingForCausalLM", False),
    # A router MLP scoring the experts and a skip expert from a router state each layer hands the next
    # (whole on every rank), top-1; its convolutional attention whole. No SP (its own residual-stream
    # parameters outside any module).
    "zaya": ("ZayaForCausalLM", True),
    "axk1": ("AXK1ForCausalLM", False),  # MLA + MoE whose output norm takes the branches' partial sums
    # Dense MLA whose query latent is split over TP (a large share of the class: plangen.plans.families.latent):
    # q_a_proj column-parallel, q_a_layernorm's statistics summed over TP, the latent all-gathered into
    # q_b_proj; the KV latent and the shared rope key whole. Its full state dict at DP 2 x TP 2.
    "youtu": ("YoutuForCausalLM", True),
    # The BERT family as causal decoders: q/k/v and the projection back in sibling modules
    # (attention.self, attention.output), the MLP in intermediate/output, post-norms after the
    # residual add, the output bias tied too. RoFormer's attention stays replicated (it reshapes with
    # its built-in width): its MLP is sharded.
    "bert": ("BertLMHeadModel", True),
    "roberta": ("RobertaForCausalLM", True),
    "roformer": ("RoFormerForCausalLM", True),
    # RemBERT's head reads output_embedding_size features from a projection outside the layers:
    # vocabulary-parallel all the same (its input is whole on every rank).
    "rembert": ("RemBertForCausalLM", False),
    # BigBird: its model rebuilds attention.self as full attention at the first (short) forward,
    # moving the column-parallel q/k/v into it: the head counts made local from the parent.
    "big_bird": ("BigBirdForCausalLM", True),
    # X-MOD: the MLP halves paired through apply_chunking_to_forward's helper; the language adapters
    # after the row-parallel reduction are their own column/row-parallel MLPs.
    "xmod": ("XmodForCausalLM", True),
    # Packed q|k|v split as the forward splits it (plangen.plans.source.packed), state dict round trip at DP>1:
    "gpt_neox": ("GPTNeoXForCausalLM", False),  # viewed per head: whole heads per rank, plain Shard(0)
    "persimmon": ("PersimmonForCausalLM", False),  # view(b, s, num_heads, 3, d): head counts made local, q/k norms
    "codegen": ("CodeGenForCausalLM", False),  # mp_num blocks of [q; v; k]: whole blocks per rank
    "falcon": ("FalconForCausalLM", True),  # mlp_output += attention_output: the MLP's output is a copy
    "mpt": ("MptForCausalLM", True),  # chunk(3): [q; k; v] re-laid out per rank; ALiBi bias sliced to its heads
    # view(b, s, num_heads, 3, d): whole heads per rank, num_heads made local; its ALiBi, [batch x heads, 1, seq]
    # for all heads, cut to each batch row's local heads' rows by the attention's input style (left-padded:
    # each row's bias differs). Its attention and MLP add the residual themselves: under SP a DTensor.
    "bloom": ("BloomForCausalLM", True),
    "gpt_neo": ("GPTNeoForCausalLM", True),  # attention inside a wrapper, its head count made local
    # Multi-query split((embed_dim, kv_dim, kv_dim)): query heads by rank, the one KV head gathered whole
    "gpt_bigcode": ("GPTBigCodeForCausalLM", True),
    # Gated-delta-net linear attention by heads (plangen.styles.linear_attention): packed [q; k; v]
    # re-laid out for the conv's channels, A_log/dt_bias with their heads, head counts made local.
    # Its attention layers' q_proj holds each head's query and output gate together (recognize_gated).
    "qwen3_5": ("Qwen3_5ForCausalLM", False),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", False),  # the same attention and mixer beside MoE layers
    # The same mixer with Qwen3-Next's in_proj_qkvz / in_proj_ba grouped per key head (a plain row
    # split keeps whole groups), beside MoE layers.
    "qwen3_next": ("Qwen3NextForCausalLM", False),
    # Mamba2 mixers split by heads, one B/C group gathered whole per forward (plangen.styles.mamba2);
    # attention layers and MoE beside them.
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", False),
    # Layers that reuse an earlier layer's keys and values (no k/v projections: q by heads, their
    # KV grouping this rank's), and MLPs whose gate keeps a Gaussian top-k by statistics over the
    # whole intermediate (summed over TP: plangen.styles.sparsity). AltUp keeps it from SP.
    "gemma3n_text": ("Gemma3nForCausalLM", True),
    # Gemma 4's per-layer inputs (table, projection, each layer's gate): under SP on the sequence shard.
    "gemma4_text": ("Gemma4ForCausalLM", True),
    # Differential attention: heads paired i, i + H/2, so q/k/v in two halves (whole pairs per rank),
    # the lambdas replicated with their gradient summed over TP (plangen.styles.attention).
    "diffllama": ("DiffLlamaForCausalLM", False),
    # q/k/v/o are MoshiLinear wrappers of one nn.Linear (use_flexible_linear=False): the inner linear sharded.
    "moshi": ("MoshiForCausalLM", False),
    # RecurrentGemma's recurrent blocks by their RG-LRU heads (plangen.styles.recurrent): linear_x/y
    # column-parallel, conv_1d's channels and the block-diagonal gates with them, linear_out row-parallel.
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", True),
    # xLSTM's mLSTM layers by heads: q/k/v/ogate and the per-head igate/fgate column-parallel, the
    # multi-head norm's weight with its heads, config.num_heads/qk_dim/v_dim made local.
    "xlstm": ("xLSTMForCausalLM", False),
    # Layer stacks outside the text decoder (plangen.plans.synthesis.towers), TP only, run by their inputs
    # (plangen.model.tower_inputs): Git's CLIP-style image encoder (pixel values; the patches precede the
    # text in the logits), Moss's Whisper-style audio tower (mel features, one audio token per row),
    # whose attention views by self.num_heads in a helper method (made this rank's).
    "git": ("GitForCausalLM", False),
    "moss_transcribe_diarize": ("MossTranscribeDiarizeForConditionalGeneration", True),
    # GOT-OCR2's SAM-style encoder (pixel values; one image token per row): its packed qkv viewed as
    # (…, 3, heads, -1) re-laid out per rank, its relative-position tables replicated, gradient summed.
    "got_ocr2": ("GotOcr2ForConditionalGeneration", True),
}
# The towers those cases must run: every parameter of their layers gets a gradient in the check.
TOWERS = {
    "git": "git.image_encoder.vision_model.encoder.layers.",
    "moss_transcribe_diarize": "model.audio_tower.layers.",
    "got_ocr2": "model.vision_tower.layers.",
}
# No sequence parallel: the BERT family's (RemBERT's, X-MOD's) position and token-type embeddings are
# added to the token embedding inside the embeddings module, where no style can lay the sum out on
# sequence shards (ProphetNet's positions likewise); Gemma 3n's AltUp is not recognised, so nothing
# gives it the whole sequence.
TP_ONLY = {
    "bert",
    "roberta",
    "roformer",
    "rembert",
    "xmod",
    "big_bird",
    "prophetnet",
    "gemma3n_text",
    "inkling_text",
    "inkling",
    "zaya",
    "qwen4_exp",
    *TOWERS,
}
# Tiny configs of other layouts of those classes (tests/tiny_configs.py): name -> tied embeddings.
TINY_CASES = {
    "falcon-gqa": True,  # Falcon-40B's q|k|v grouped per KV head: whole groups, num_heads and num_kv_heads local
    "falcon_h1-mup": False,  # FalconH1's MuP multipliers per in_proj part: its mup_vector cut to each rank's features
    "falcon-mqa": True,  # Falcon-7B's multi-query view(b, s, num_heads + 2, d): query heads by rank, one KV head whole
    # Falcon-7B's odd query head count in small (5): padded with a zero head (plangen.styles.padded_heads), the pad
    # exactly 0 after the steps (case_problem), its full state dict Hugging Face's.
    "falcon-mqa-5h": True,
    # xLSTM with 4 heads, for its full state dict at DP 2 x TP 2: the shrunk model's 2 heads leave one
    # igate/fgate row per TP rank, fewer than the DP size, which torch's full-state-dict load of the
    # FSDP2-over-TP (_StridedShard) parameter refuses (an assertion in _StridedShard._shard_tensor).
    "xlstm-4h": False,
    # RecurrentGemma's released layout (two recurrent blocks, then local attention): the recurrent
    # blocks' plan entries per layer, beside the attention's; the sweep's shrunk model has recurrent ones only.
    "recurrent_gemma-mixed": True,
    # Inkling with 8 routed and 2 shared experts (the sweep's shrunk model has 4 and 1), a dense first
    # layer (kept whole) and sliding-window and full attention layers; no SP (see inkling_text).
    "inkling": False,
    # Qwen3-Next's shared expert as wide as its expert count (Qwen3-Next-80B-A3B's 512 and 512; Qwen4-Exp's
    # default config too): sharded as a shared expert, not kept whole as a router (counted once per rank).
    "qwen3_next-shared-as-wide-as-experts": False,
}
# Tiny configs built with eager attention (xLSTM refuses sdpa).
EAGER = {"xlstm-4h"}
# Left-padded batches: the mask the linear-attention mixer multiplies its (Replicate DTensor) input by;
# Bloom's ALiBi, built from it, then differs from batch row to batch row.
PADDED = {"qwen3_5", "bloom"}
# Cases that also read the full state dict at DP>1 and load the Hugging Face weights back (fused layouts):
# under SP where the class has it (the same parameters: one case reads it for both).
STATE_DICT = {
    "qwen3_5",
    "qwen3_next",
    "lfm2_moe",
    "lfm3",
    "gpt_neox",
    "persimmon",
    "codegen",
    "mpt",
    "bloom",
    "falcon-gqa",
    "gpt_bigcode",
    "falcon-mqa",
    "falcon-mqa-5h",
    "jamba",
    "mamba",
    "granitemoehybrid",
    "diffllama",
    "recurrent_gemma",
    "xlstm-4h",
    "inkling_text",
    "glm4",
    "prophetnet",  # ProphetNet's bucket-major relative_pos_embeddings, re-laid out per rank
    "youtu",
}  # its query latent's down-projection and norm sharded, the KV latent's whole
# The stable variant of the runtime's (proven) plan: Mamba1 mixers kept whole (plangen.plans.variants);
# Jamba's with left padding, which the mixer masks. RecurrentGemma's: linear_out column-parallel on its
# gathered input, the conv and the RG-LRU still split (nothing sums across ranks there).
# Youtu's: its query latent's norm all-gathered and normalised whole (GatheredNormParallel), not summed.
STABLE = {
    "mamba-stable": "mamba",
    "jamba-stable": "jamba",
    "recurrent_gemma-stable": "recurrent_gemma",
    "youtu-stable": "youtu",
}
MESHES = ("tp2", "dp2tp2")
# Forward reduce-scatters outside SP: Doge's dt_proj, one per layer (two tiny layers); ProphetNet's
# n-gram self-attention's out_proj, once for the main and once for the predict streams per layer.
HEAD_GATE_REDUCE_SCATTERS = {"doge": 2, "prophetnet": 4}


def _cases() -> list[dict]:
    return (
        [
            {
                "name": f"{t}{'-sp' if sp else ''}",
                "model_type": t,
                "plan_kind": "synthesized",
                "sp": sp,
                "adam_eps": 1e-6,
                **({"state_dict": True} if t in STATE_DICT and sp == (t not in TP_ONLY) else {}),
                **({"pad": True} if t in PADDED else {}),
            }
            for t in CLASSES
            for sp in ((False,) if t in TP_ONLY else (False, True))
        ]
        + [
            {
                "name": f"{t}{'-sp' if sp else ''}",
                "model": t,
                "plan_kind": "synthesized",
                "sp": sp,
                "adam_eps": 1e-6,
                **({"state_dict": True} if t in STATE_DICT and sp == (t not in TP_ONLY) else {}),
                **({"attn": "eager"} if t in EAGER else {}),
            }
            for t in TINY_CASES
            for sp in ((False,) if t in TP_ONLY else (False, True))
        ]
        + [
            {
                "name": name,
                "model_type": t,
                "variant": "stable",
                "adam_eps": 1e-6,
                **({"pad": True} if t == "jamba" else {}),
            }
            for name, t in STABLE.items()
        ]
    )


# OPT's plan without its local head counts (tests/custom_plans.py): what made it silently wrong.
GLOBAL_HEADS = {
    "name": "opt-global-heads",
    "model_type": "opt",
    "plan": "custom_plans.opt_plan_with_global_head_counts",
    "adam_eps": 1e-6,
}
# The stable variant of the plan the runtime picks for Qwen3.5 (its proven synthesized one): the gated
# delta nets' out_proj column-parallel on its gathered input, left-padded.
GDN_STABLE = {"name": "qwen3_5-stable", "model_type": "qwen3_5", "variant": "stable", "pad": True, "adam_eps": 1e-6}
# The 5-head Falcon's padded plan without the output projection's pad mask (tests/custom_plans.py).
UNMASKED_PAD = {
    "name": "falcon-mqa-5h-unmasked",
    "model": "falcon-mqa-5h",
    "plan": "custom_plans.falcon_plan_without_pad_mask",
    "adam_eps": 1e-6,
}
# Bloom's plan with its ALiBi cut by a plain slice of its first dim, as MPT's is (tests/custom_plans.py).
PLAIN_ALIBI = {
    "name": "bloom-plain-alibi-slice",
    "model_type": "bloom",
    "plan": "custom_plans.bloom_plan_with_plain_alibi_slice",
    "pad": True,
    "adam_eps": 1e-6,
}
CONTROLS = (GLOBAL_HEADS, GDN_STABLE, UNMASKED_PAD, PLAIN_ALIBI)
CASES = {
    mesh: [*_cases(), GLOBAL_HEADS, UNMASKED_PAD, PLAIN_ALIBI, *([GDN_STABLE] if mesh == "dp2tp2" else [])]
    for mesh in MESHES
}
CASE_IDS = [f"{mesh}/{c['name']}" for mesh in MESHES for c in CASES[mesh] if c not in CONTROLS]


# The default run: one class per layout kind at DP 2 x TP 2 (FSDP2 and TP together), with sequence
# parallel where the class has it, and at TP 2 alone a BART-family and a hybrid class. The rest repeats
# those plans' styles and is marked slow (-m "slow or not slow"); the sweep (scripts/sweep_plans.py)
# checks every class all four ways.
DP2_DEFAULT = {
    # dense with and without SP, packed gate|up, parallel attention and MLP, the BERT and BART families,
    # OPT's local head counts, TrOCR's width-sliced reshape
    "olmo",
    "olmo-sp",
    "glm-sp",
    "glm4-sp",
    "cohere-sp",
    "bert",
    "bart-sp",
    "opt",
    "trocr-sp",
    # packed q|k|v: per-head (GPT-NeoX; Bloom, its ALiBi rows cut per rank), CodeGen's groups, plain (MPT),
    # grouped and multi-query (Falcon), paired heads (DiffLlama), each with its full state dict
    "gpt_neox-sp",
    "bloom-sp",
    "codegen-sp",
    "mpt-sp",
    "falcon-gqa-sp",
    "falcon-mqa-sp",
    "falcon-mqa-5h-sp",
    "diffllama-sp",
    # ProphetNet's bucket-major relative-position projection, with its full state dict
    "prophetnet",
    # latent attention with its query latent split over TP (Youtu), with its full state dict
    "youtu-sp",
    # MoE: whole-projection norms (OLMoE), routed and shared 3-D experts (Inkling), a router MLP (Zaya)
    "olmoe-sp",
    "inkling",
    "zaya",
    # gated delta nets (left-padded), Mamba1 (and in Jamba beside attention and MoE, its stable
    # variant), short convs, RG-LRU blocks, mLSTM heads
    "qwen3_5-sp",
    "falcon_mamba-sp",
    "jamba-sp",
    "jamba-stable",
    "lfm2-sp",
    "recurrent_gemma-sp",
    "xlstm-4h-sp",
    # a tower outside the decoder, run by its pixels
    "git",
}
TP2_DEFAULT = {"bart", "jamba", "falcon-mqa-5h"}
TOWERS_DEFAULT = ["git"]


def _in_default_run(case_id: str) -> bool:
    mesh, name = case_id.split("/")
    return name in (TP2_DEFAULT if mesh == "tp2" else DP2_DEFAULT)


DEFAULT_IDS = {c for c in CASE_IDS if _in_default_run(c)}


def test_every_default_case_is_a_case():
    assert {f"dp2tp2/{n}" for n in DP2_DEFAULT} | {f"tp2/{n}" for n in TP2_DEFAULT} == DEFAULT_IDS


def installed(params: list) -> list:
    """``params`` (case ids), those of a model type or class the installed transformers lacks (Zaya,
    Inkling's text model on 5.8.1) skipped with that reason, and left out of the launch (a skipped test reads no case)."""
    import transformers

    from absent import has_model
    from tiny_configs import TINY

    out = []
    for p in params:
        value, marks = (p.values[0], list(p.marks)) if hasattr(p, "values") else (p, [])
        stem = value.split("/")[1].removesuffix("-sp")
        model_type = STABLE.get(stem, stem)
        # A tiny model's own type (tests/tiny_configs.py), else the class the case is named after.
        needed = (
            [TINY[stem]["model_type"]]
            if stem in TINY
            else [model_type, CLASSES[model_type][0]]
            if model_type in CLASSES
            else []
        )
        missing = [n for n in needed if not has_model(n)]
        if missing:
            why = f"transformers {transformers.__version__} has no {missing[0]}"
            p = pytest.param(value, marks=[*marks, pytest.mark.skip(reason=why)])
        out.append(p)
    return out


def _state_dict_case(model_type: str) -> str:
    return f"dp2tp2/{model_type}{'' if model_type in TP_ONLY else '-sp'}"


# The classes whose state-dict case the default run has (the case that reads it, not its name's stem).
STATE_DICT_DEFAULT = [t for t in sorted(STATE_DICT) if _state_dict_case(t) in DEFAULT_IDS]


def _needs(test: str, params: dict) -> list[str]:
    if test == "test_the_check_runs_the_towers_it_shards":
        return [f"dp2tp2/{params['model_type']}"]
    if test == "test_packed_state_dict_is_the_hugging_face_one_at_dp2":
        return [_state_dict_case(params["model_type"])]
    if test == "test_stable_variant_of_the_gated_delta_net_plan_matches_unsharded_model":
        return [f"dp2tp2/{GDN_STABLE['name']}"]
    if test == "test_pad_heads_without_the_mask_get_gradients_and_drift":
        return [f"{params['mesh']}/{UNMASKED_PAD['name']}"]
    if test == "test_opt_heads_viewed_by_the_global_head_count_are_silently_wrong":
        return [f"{params['mesh']}/{GLOBAL_HEADS['name']}"]
    if test == "test_bloom_alibi_cut_by_a_plain_slice_is_silently_wrong":
        return [f"{params['mesh']}/{PLAIN_ALIBI['name']}"]
    return []


def LAUNCH(items) -> tuple:
    # One launch for every selected case, started in the background at collection (conftest). Its
    # time limit allows for sharing the cores with the other tests meanwhile.
    return "tests/distributed/cases.py:run_cases", 4, cases_read_by(items, sys.modules[__name__], CASES, _needs), 1500


@pytest.fixture(scope="module")
def results(request) -> list[dict]:
    return launched(request)


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", installed(stack_can_run(slow_unless(CASE_IDS, DEFAULT_IDS))))
def test_synthesized_plan_matches_unsharded_model(results, case_id):
    from distributed.cases import case_problem

    for rank, per_case in enumerate(results):
        problem = case_problem(per_case[case_id])
        assert problem is None, f"rank {rank}: {per_case[case_id].get('trace', problem)}"


@pytest.mark.distributed
@pytest.mark.parametrize("case_id", installed(stack_can_run(slow_unless(CASE_IDS, DEFAULT_IDS))))
def test_synthesized_plan_is_what_it_claims(results, case_id):
    r = results[0][case_id]
    model_type = case_id.split("/")[1].removesuffix("-sp")
    sequence_parallel = case_id.endswith("-sp")
    assert r["logits_type"] == "DTensor" and r["logits_placements"] == ["S(2)"]  # vocabulary-parallel
    # FSDP2 all-gathers in the forward but never reduce-scatters: a forward reduce-scatter is SP's,
    # or a head gate's (Doge's dt_proj: one per layer, onto this rank's heads).
    if sequence_parallel:
        assert "reduce_scatter_tensor" in r["forward_collectives"]
    else:
        assert r["forward_collectives"].get("reduce_scatter_tensor", 0) == HEAD_GATE_REDUCE_SCATTERS.get(model_type, 0)
    model_type = STABLE.get(model_type, model_type)
    assert r["tied"] == (CLASSES[model_type][1] if model_type in CLASSES else TINY_CASES[model_type])


@pytest.mark.distributed
@pytest.mark.parametrize("model_type", slow_unless(sorted(TOWERS), TOWERS_DEFAULT))
def test_the_check_runs_the_towers_it_shards(results, model_type):
    """A tower no input reaches gets no gradient on either side, and the parity check would pass on it
    unproven: Git's and Moss's cases feed theirs, so every parameter of their layers is compared."""
    r = results[0][f"dp2tp2/{model_type}"]
    assert not [n for n in r["unreached"] if n.startswith(TOWERS[model_type])], r["unreached"]
    assert r["worst_grad"] is not None


@pytest.mark.distributed
@pytest.mark.parametrize("model_type", slow_unless(sorted(STATE_DICT), STATE_DICT_DEFAULT))
def test_packed_state_dict_is_the_hugging_face_one_at_dp2(results, model_type):
    for rank, per_case in enumerate(results):
        sd = per_case[_state_dict_case(model_type)]["state_dict"]
        assert sd == {"names": [], "shapes": [], "read": 0.0, "loaded": 0.0, "plain_names": [], "plain_read": 0.0}, (
            f"rank {rank}: {sd}"
        )


@pytest.mark.parametrize("model_type", CLASSES)
def test_committed_sweep_agrees(model_type):
    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.plans.proven import code_digest, is_proven

    class_name = CLASSES[model_type][0]
    code = code_digest(build_catalog_model(Architecture(class_name, model_type)))  # the installed code's proof
    assert is_proven(class_name, False, code), f"{class_name}: run scripts/sweep_plans.py"
    # SP proven where the plan has it and the installed torch can run the model's own code under it.
    assert is_proven(class_name, True, code) == (model_type not in TP_ONLY and not stack_cannot_run(f"{model_type}-sp"))


@pytest.mark.distributed
@pytest.mark.parametrize("mesh", slow_unless(MESHES, ["dp2tp2"]))
def test_opt_heads_viewed_by_the_global_head_count_are_silently_wrong(results, mesh):
    """The cause of OPT's failed check: no error, the logits simply differ (by ~0.1 on the tiny model)."""
    from distributed.cases import case_problem

    for per_case in results:
        result = per_case[f"{mesh}/opt-global-heads"]
        assert "error" not in result, result.get("trace", result["error"])
        assert result["logits"] > 1e-2, case_problem(result)


@pytest.mark.distributed
@pytest.mark.parametrize("mesh", slow_unless(MESHES, ["dp2tp2"]))
def test_bloom_alibi_cut_by_a_plain_slice_is_silently_wrong(results, mesh):
    """The negative control of Bloom's ALiBi rows (PrepareAttentionInput's batch_head_inputs): cut as
    MPT's bias is, by a plain slice of its first dim, each rank gets the first batch rows' every head,
    and the logits differ with no error (dropping the cut altogether fails on the shapes instead)."""
    from distributed.cases import case_problem

    for per_case in results:
        result = per_case[f"{mesh}/{PLAIN_ALIBI['name']}"]
        assert "error" not in result, result.get("trace", result["error"])
        # ~8e-4 on the tiny model (small weights, two heads' slopes 2^-4 and 2^-8), 80x the tolerance.
        assert result["logits"] > 1e-4 and result["grad"] > 1e-4, case_problem(result)


@pytest.mark.distributed
def test_stable_variant_of_the_gated_delta_net_plan_matches_unsharded_model(results):
    """The runtime's Qwen3.5 plan as the stable variant (plangen.plans.variants maps the mixers like
    attention): DP 2 x TP 2 against the unsharded model, and its forward sums nothing but the
    vocab-parallel embedding's exact all-reduce."""
    from distributed.cases import case_problem

    from plangen.distributed.comm import merge_c10d_counts

    for rank, per_case in enumerate(results):
        result = per_case[f"dp2tp2/{GDN_STABLE['name']}"]
        assert case_problem(result) is None, f"rank {rank}: {result.get('trace', case_problem(result))}"
        # One all-reduce in forward: the embedding's (exact); the optimized plan adds two per layer.
        assert merge_c10d_counts(result["forward_collectives"]).get("all_reduce") == 1, result["forward_collectives"]


@pytest.mark.distributed
@pytest.mark.parametrize("mesh", slow_unless(MESHES, ["dp2tp2"]))
def test_pad_heads_without_the_mask_get_gradients_and_drift(results, mesh):
    """The negative control of the padded heads (plangen.styles.padded_heads): without the output projection's
    input mask the forward is still exact, but its pad columns get the pad heads' outputs' gradients and
    the AdamW steps make them non-zero: the check fails on the pad."""
    from conftest import falcon_attention_left_whole
    from distributed.cases import case_problem
    from tiny_configs import build_tiny

    if (why := falcon_attention_left_whole(build_tiny("falcon-mqa-5h"))) is not None:
        pytest.skip(f"{why}: no pad heads to leave unmasked")

    for per_case in results:
        result = per_case[f"{mesh}/{UNMASKED_PAD['name']}"]
        assert "error" not in result, result.get("trace", result["error"])
        assert result["logits"] < 1e-5  # the first forward: the pad columns are still zero
        assert result["pad"] > 1e-6 and "pad heads" in case_problem(result), result

"""Layer stacks outside the text decoder (plangen.plans.synthesis.towers): vision and audio towers, a second
decoder stack. Their attention is sharded by heads and their MLPs by the intermediate, TP only; a
tower the check cannot run stays whole, saying why. Their parity with the unsharded model, towers
run (Git's pixel values, Moss's audio features: plangen.model.tower_inputs), is in
tests/test_synthesized_distributed.py and the sweep."""

from __future__ import annotations

import pytest
import torch

from plangen.commands.catalog import Architecture, build_full_size_model, measure_sharded_share
from plangen.model.resolve import resolve_model
from plangen.plans.synthesis.synthesize import build_synthesized_plan
from plangen.model.shrink import build_tiny_model


def _tiny(model_type: str):
    return build_tiny_model(resolve_model(model_type), seed=0)


def _styles(plan) -> dict[str, str]:
    return {e.pattern: e.style for e in plan.entries}


def test_git_image_encoder_layers_are_sharded_by_heads_and_intermediate():
    styles = _styles(build_synthesized_plan(_tiny("git"), sequence_parallel=False))
    layers = "git.image_encoder.vision_model.encoder.layers.*"
    assert {k: v for k, v in styles.items() if k.startswith(layers)} == {
        f"{layers}.self_attn": "PrepareModuleInput",
        f"{layers}.self_attn.k_proj": "ColwiseParallel",
        f"{layers}.self_attn.v_proj": "ColwiseParallel",
        f"{layers}.self_attn.q_proj": "ColwiseParallel",
        f"{layers}.self_attn.out_proj": "RowwiseParallel",
        f"{layers}.mlp": "PrepareModuleInput",
        f"{layers}.mlp.fc1": "ColwiseParallel",
        f"{layers}.mlp.fc2": "RowwiseParallel",
    }
    replicated = {r.pattern: r.why for r in build_synthesized_plan(_tiny("git"), False).replicated}
    assert (
        "in the git.image_encoder tower outside its sharded layers"
        in replicated["git.image_encoder.vision_model.embeddings"]
    )


def test_moss_audio_attention_views_by_a_helper_get_their_head_count_made_local():
    """Moss's audio attention views q/k/v in ``self._shape`` by ``self.num_heads``: read from the helper,
    the block's style makes the count this rank's (without it the view folds the missing heads into the
    sequence and raises, or at another size silently mixes them)."""
    from plangen.plans.source.shape import read_shape_sizes

    model = _tiny("moss_transcribe_diarize")
    attention = model.model.audio_tower.layers[0].self_attn
    assert {"num_heads", "head_dim"} <= read_shape_sizes(type(attention)).attributes
    plan = build_synthesized_plan(model, sequence_parallel=False)
    entry = next(e for e in plan.entries if e.pattern == "model.audio_tower.layers.*.self_attn")
    assert entry.style == "PrepareAttentionInput" and entry.kwargs["head_attributes"] == ("num_heads",)
    styles = _styles(plan)
    assert styles["model.audio_tower.layers.*.fc1"] == "ColwiseParallel"
    assert styles["model.audio_tower.layers.*.fc2"] == "RowwiseParallel"


def test_a_second_decoder_stack_is_sharded_like_the_first():
    styles = _styles(build_synthesized_plan(_tiny("hrm_text"), sequence_parallel=False))
    for stack in ("model.L_module", "model.H_module"):
        assert styles[f"{stack}.layers.*.self_attn.q_proj"] == "ColwiseParallel"
        assert styles[f"{stack}.layers.*.mlp.down_proj"] == "RowwiseParallel"


def test_got_ocr2_packed_qkv_is_re_laid_out_by_heads_and_its_relative_positions_summed():
    """GOT-OCR2's SAM-style attention views its packed qkv as (b, s, 3, num_attention_heads, -1): [q; k; v]
    one after another (plangen.plans.source.packed), re-laid out per rank; its rel_pos_h/rel_pos_w
    (one row per head feature, no heads axis) are read by every head: replicated, gradient summed."""
    styles = {e.pattern: e for e in build_synthesized_plan(_tiny("got_ocr2"), sequence_parallel=False).entries}
    layers = "model.vision_tower.layers.*"
    attention, qkv = styles[f"{layers}.attn"], styles[f"{layers}.attn.qkv"]
    assert attention.style == "PrepareAttentionInput"
    assert attention.kwargs["head_attributes"] == ("num_attention_heads",)
    assert attention.kwargs["shared_tables"] == ("rel_pos_h", "rel_pos_w")
    assert (qkv.style, qkv.kwargs["part_sizes"]) == ("FusedColwiseParallel", (1, 1, 1))
    assert styles[f"{layers}.attn.proj"].style == "RowwiseParallel"
    assert (styles[f"{layers}.mlp.lin1"].style, styles[f"{layers}.mlp.lin2"].style) == (
        "ColwiseParallel",
        "RowwiseParallel",
    )


def test_got_ocr2_tiny_encoder_keeps_a_global_and_a_windowed_layer_on_few_patches():
    vision = _tiny("got_ocr2").config.vision_config
    assert (vision.num_hidden_layers, list(vision.global_attn_indexes)) == (2, [1])
    assert (vision.image_size // vision.patch_size, vision.window_size) == (4, 2)


@pytest.mark.parametrize(
    "model_type, owner, towers",
    [
        ("got_ocr2", "model.vision_tower", ("GotOcr2VisionLayer layers at model.vision_tower.layers",)),
    ],
)
def test_a_tower_the_check_cannot_run_stays_whole_with_the_reason(monkeypatch, model_type, owner, towers):
    from plangen.model.tower_inputs import TOWER_INPUTS

    model = _tiny(model_type)
    monkeypatch.delitem(TOWER_INPUTS, type(model).__name__)  # as before its inputs were built
    plan = build_synthesized_plan(model, sequence_parallel=False)
    assert not [e.pattern for e in plan.entries if e.pattern.startswith(owner + ".")]
    why = {r.pattern: r.why for r in plan.replicated}[owner]
    assert why.startswith(f"{type(model.get_submodule(owner)).__name__} holds towers ({'; '.join(towers)})")
    assert "that the numerical check cannot run (no inputs built for them in plangen.model.tower_inputs)" in why


def test_tower_inputs_run_the_towers_and_the_text_logits_are_the_last_positions():
    from plangen.model.tower_inputs import build_tower_inputs, text_logits

    for model_type, tower in (
        ("git", "git.image_encoder"),
        ("moss_transcribe_diarize", "model.audio_tower"),
        ("got_ocr2", "model.vision_tower"),
    ):
        model = _tiny(model_type)
        ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0))
        ids, inputs = build_tower_inputs(model, ids)
        logits = model(input_ids=ids, **inputs).logits
        assert text_logits(logits, ids).shape[:2] == ids.shape
        text_logits(logits, ids).sum().backward()
        assert all(
            p.grad is not None and p.grad.abs().sum() > 0
            for n, p in model.get_submodule(tower).named_parameters()
            if ".layers." in n
        )


@pytest.mark.parametrize("model_type", ["got_ocr2", "phi4_multimodal"])
def test_the_tower_inputs_reach_the_text_logits(model_type):
    """A changed pixel (or feature) of one row changes that row's text logits, and only that row's:
    the tower's output is merged into its own row's text stream."""
    from plangen.model.tower_inputs import build_tower_inputs, text_logits

    model = _tiny(model_type)
    ids, inputs = build_tower_inputs(model, torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        before = text_logits(model(input_ids=ids, **inputs).logits, ids)
        changed = {k: v.clone() for k, v in inputs.items()}
        first = next(k for k, v in changed.items() if v.is_floating_point())
        changed[first][0] += 1.0
        after = text_logits(model(input_ids=ids, **changed).logits, ids)
    assert (after[0] - before[0]).abs().max() > 1e-3
    assert torch.equal(after[1], before[1])
    if model_type == "phi4_multimodal":  # the audio features too, on the audio token
        changed = {k: v.clone() for k, v in inputs.items()}
        changed["audio_input_features"][0] += 1.0
        with torch.no_grad():
            after = text_logits(model(input_ids=ids, **changed).logits, ids)
        assert (after[0] - before[0]).abs().max() > 1e-3 and torch.equal(after[1], before[1])


def test_phi4_multimodal_towers_are_sharded_by_its_hand_written_plan():
    """The SigLIP image encoder's and the conformer's attention by heads, their MLPs by the intermediate
    (the conformer's packed [up; gate] re-laid out per rank), the conformer's all-heads mask sliced to
    each rank's heads and its per-head bias table's gradient summed; its conv modules stay whole."""
    from plangen.plans.fused import plan_phi4_multimodal

    plan = plan_phi4_multimodal(_tiny("phi4_multimodal"), False)
    styles = {e.pattern: e for e in plan.entries}
    image = "model.embed_tokens_extend.image_embed.img_processor.encoder.layers.*"
    audio = "model.embed_tokens_extend.audio_embed.encoder"
    assert [styles[f"{image}.{p}"].style for p in ("self_attn.q_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2")] == [
        "ColwiseParallel",
        "RowwiseParallel",
        "ColwiseParallel",
        "RowwiseParallel",
    ]
    attention = styles[f"{audio}.encoders.*.self_attn"]
    assert (attention.style, attention.kwargs["head_inputs"]) == ("PrepareAttentionInputOutput", ("attention_mask",))
    assert styles[f"{audio}.relative_attention_bias_layer.bias_values"].style == "AllReduceParamGrads"
    for mlp in ("feed_forward_in", "feed_forward_out"):
        up = styles[f"{audio}.encoders.*.{mlp}.gate_up_proj"]
        assert (up.style, up.kwargs["part_sizes"]) == ("FusedColwiseParallel", (1, 1))
    kept = {r.pattern: r.why for r in plan.replicated}
    assert "a third per block" in kept[f"{audio}.encoders.*.conv"]


@pytest.mark.parametrize(
    "arch",
    [
        Architecture("GitForCausalLM", "git"),
        Architecture("MossTranscribeDiarizeForConditionalGeneration", "moss_transcribe_diarize"),
        Architecture("GotOcr2ForConditionalGeneration", "got_ocr2"),
        Architecture("Phi4MultimodalForCausalLM", "phi4_multimodal"),
    ],
)
def test_classes_with_proven_towers_shard_95_percent_at_full_size(fake_pg, arch):
    fraction, left = measure_sharded_share(lambda: build_full_size_model(arch))
    assert fraction >= 0.95, left[:3]

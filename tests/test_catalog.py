"""``plangen list``: every causal-LM architecture of the installed transformers and the plan it gets."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import pinned_release_only
from typer.testing import CliRunner

from plangen.commands.cli import app

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def listing() -> tuple[dict, float]:
    began = time.process_time()  # CPU time: other work on the machine does not stretch it
    result = CliRunner().invoke(app, ["list", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), time.process_time() - began


def rows_by_class(listing) -> dict[str, dict]:
    return {row["class_name"]: row for row in listing[0]["architectures"]}


def test_json_lists_every_causal_lm_class_once(listing):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = [row["class_name"] for row in listing[0]["architectures"]]
    assert len(names) == len(set(names))
    assert set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) <= set(names)
    assert listing[0]["transformers"] and listing[0]["torch"]
    # ~200 meta-device builds (shrunk configs): about 10 s of CPU.
    assert listing[1] < 60


def test_every_hand_written_class_is_listed_as_such(listing):
    from plangen.plans import HAND_WRITTEN

    rows = rows_by_class(listing)
    for class_name in HAND_WRITTEN:
        assert rows[class_name]["plan"] == "hand-written", class_name
    assert rows["LlamaForCausalLM"]["sequence_parallel"] is True
    assert (
        rows["NemotronHForCausalLM"]["sequence_parallel"] is True
    )  # Mamba mixers gather, compute whole, keep their shard


@pinned_release_only
def test_rows_follow_the_plan_priority(listing):
    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.plans.proven import code_digest, is_proven

    rows = rows_by_class(listing)
    olmo = rows["OlmoForCausalLM"]
    assert (olmo["plan"], olmo["sequence_parallel"], olmo["check"]) == ("synthesized", True, "passed")
    # Fused q|k|v and gate|up: Phi-3's own plan re-lays out both, and serves Phi-4-MM's decoder (no SP:
    # its towers' output is merged into the text stream).
    assert rows["Phi3ForCausalLM"]["plan"] == "hand-written" and rows["Phi3ForCausalLM"]["sequence_parallel"] is True
    phi4mm = rows["Phi4MultimodalForCausalLM"]
    assert (phi4mm["plan"], phi4mm["sequence_parallel"], phi4mm["check"]) == ("hand-written", False, "passed")
    assert rows["GPT2LMHeadModel"]["plan"] == "hand-written"  # Conv1D styles, fused c_attn re-laid out
    xlm = rows["XLMWithLMHeadModel"]  # attentions, ffns and norms in parallel lists, no layer modules
    assert (xlm["plan"], xlm["sequence_parallel"], xlm["check"]) == ("synthesized", False, "passed")
    xlnet = rows["XLNetLMHeadModel"]  # projections as [hidden, heads, head_dim] parameters, applied by einsum
    assert xlnet["plan"] == "none" and "applied by einsum, not nn.Linear" in xlnet["note"]
    # CTRL scales the embedding's output in place, Git adds positions into it: the embedding's
    # style hands out a copy (RowwiseParallelOwnOutput), proven.
    for name in ("CTRLLMHeadModel", "GitForCausalLM"):
        assert (rows[name]["plan"], rows[name]["check"]) == ("synthesized", "passed"), name
    for row in rows.values():
        assert row["plan"] in ("hand-written", "synthesized", "hf", "none")
        if row["plan"] == "synthesized":  # the runtime uses a synthesized plan only where it is proven
            code = code_digest(build_catalog_model(Architecture(row["class_name"], row["model_type"])))
            assert is_proven(row["class_name"], False, code) and row["check"] == "passed"
            assert row["sequence_parallel"] == is_proven(row["class_name"], True, code)
            assert row["proof"] == "this code"
    # Every class with a plan has a record for the installed (pinned) transformers' code.
    assert {row["proof"] for row in rows.values() if row["plan"] != "none"} == {"this code"}


def test_no_synthesized_proof_is_stale(listing):
    """Each synthesized plan the runtime trusts is the one the sweep proved (its fingerprint)."""
    from plangen.plans.proven import SWEEP_COMMAND

    stale = [row["class_name"] for row in rows_by_class(listing).values() if row["check"] == "stale"]
    assert stale == [], (
        f"proofs of plans the synthesizer no longer builds: run {SWEEP_COMMAND} --only {','.join(stale)}"
    )


def test_a_changed_synthesized_plan_is_stale_until_swept_again():
    from dataclasses import replace

    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.plans.proven import plan_fingerprint, proof_is_stale
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    model = build_catalog_model(Architecture("OlmoForCausalLM", "olmo"))
    tp, sp = build_synthesized_plan(model, False), build_synthesized_plan(model, True)
    record = {
        "plan": "synthesized",
        "tp": True,
        "sp": True,
        "fingerprint": {"tp": plan_fingerprint(tp), "sp": plan_fingerprint(sp)},
    }
    assert not proof_is_stale(record, tp) and not proof_is_stale(record, sp)
    first = tp.entries[0]
    swapped = "ColwiseParallel" if first.style != "ColwiseParallel" else "RowwiseParallel"
    assert proof_is_stale(record, replace(tp, entries=(replace(first, style=swapped), *tp.entries[1:])))
    assert proof_is_stale(record, replace(tp, entries=tp.entries[1:]))  # an entry left out
    assert proof_is_stale(
        record,
        replace(tp, entries=(replace(first, kwargs={**first.kwargs, "use_local_output": False}), *tp.entries[1:])),
    )
    assert proof_is_stale({k: v for k, v in record.items() if k != "fingerprint"}, tp)  # nothing says which plan
    assert not proof_is_stale({"plan": "hand-written", "tp": True}, tp)  # hand-written plans: proven by the tests


@pytest.mark.slow
def test_no_sequence_parallel_proof_is_stale():
    """As plangen list checks the TP plans: the SP plans (twice the synthesis: out of the default run)."""
    from plangen.commands.catalog import build_catalog_model, list_architectures
    from plangen.plans.proven import SWEEP_COMMAND, code_digest, proof_for, proof_is_stale
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    stale = []
    for arch in list_architectures():
        try:
            model = build_catalog_model(arch)
        except Exception:  # noqa: BLE001 - default configs that do not build have no record
            continue
        record = proof_for(arch.class_name, code_digest(model)) or {}
        if (
            record.get("plan") == "synthesized"
            and record.get("sp")
            and proof_is_stale(record, build_synthesized_plan(model, True))
        ):
            stale.append(arch.class_name)
    assert stale == [], f"run {SWEEP_COMMAND} --only {','.join(stale)}"


def test_text_table_for_some_models(monkeypatch):
    monkeypatch.setenv(
        "COLUMNS", "80"
    )  # a narrow terminal: the table takes its least width, the summary stays one line
    result = CliRunner().invoke(app, ["list", "olmo", "llama", "xlnet"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["class", "model_type", "plan", "SP", "check", "proof", "TP-sharded", "note"]
    assert lines[1].split()[:8] == [
        "LlamaForCausalLM",
        "llama",
        "hand-written",
        "yes",
        "passed",
        "this",
        "code",
        "100.0%",
    ]
    assert lines[2].split()[:7] == ["OlmoForCausalLM", "olmo", "synthesized", "yes", "passed", "this", "code"]
    assert lines[3].split()[:6] == ["XLNetLMHeadModel", "xlnet", "none", "no", "n/a", "never"]
    assert lines[-1].startswith("3 architectures: 1 hand-written, 1 synthesized, 0 hf, 1 none; ")
    assert lines[-1].endswith(
        "shard ≥ 95% of their parameters over TP; proofs: 2 for this code, 0 for other code only, 1 never"
    )


@pinned_release_only
def test_sharded_fraction_at_the_default_size(listing):
    rows = rows_by_class(listing)
    for row in rows.values():
        assert 0 <= row["sharded_fraction"] <= 1, row["class_name"]
        if row["plan"] == "none":
            assert row["sharded_fraction"] == 0, row["class_name"]
    assert rows["LlamaForCausalLM"]["sharded_fraction"] >= 0.95
    assert rows["Qwen3MoeForCausalLM"]["sharded_fraction"] >= 0.95  # experts split over TP
    assert rows["MixtralForCausalLM"]["sharded_fraction"] >= 0.95
    # Llama-4's every-token experts (EveryTokenMoeParallel), Dots1 built from a completed default
    # config, GraniteMoE-SWA's attention split with its sinks.
    for name in ("Llama4ForCausalLM", "Dots1ForCausalLM", "GraniteMoeSWAForCausalLM"):
        assert rows[name]["sharded_fraction"] >= 0.95, name


BART_FAMILY = (
    "BartForCausalLM",
    "BigBirdPegasusForCausalLM",
    "BioGptForCausalLM",
    "BlenderbotForCausalLM",
    "BlenderbotSmallForCausalLM",
    "MarianForCausalLM",
    "MBartForCausalLM",
    "MusicgenForCausalLM",
    "MusicgenMelodyForCausalLM",
    "MvpForCausalLM",
    "PegasusForCausalLM",
    "PLBartForCausalLM",
    "WhisperForCausalLM",
    "XGLMForCausalLM",
    "OPTForCausalLM",
)


@pinned_release_only
def test_bart_family_decoders_are_synthesized_and_well_sharded(listing):
    rows = rows_by_class(listing)
    for name in BART_FAMILY:
        assert (rows[name]["plan"], rows[name]["check"]) == ("synthesized", "passed"), name
        assert rows[name]["sharded_fraction"] >= 0.95 and rows[name]["sequence_parallel"], name


@pinned_release_only
def test_every_class_with_a_plan_meets_issue_11s_goal(listing):
    # At least 95 % TP-sharded at TP 2 at the default size. Youtu was the last below (92.9 %: its latent
    # attention's query latent, 5.1 %, kept whole): now split over TP, 98.0 %, with no note.
    # Held for every class of the release the committed table was swept on (docs/plans.md); under a newer
    # transformers its own new classes are listed with their note, not held (5.25.0's Ergo: 0.4 %), and
    # Falcon where the synthesizer keeps its attention whole (tests/conftest.py).
    from conftest import falcon_attention_left_whole

    rows = rows_by_class(listing)
    below = [name for name, row in rows.items() if row["plan"] != "none" and row["sharded_fraction"] < 0.95]
    newer = set(classes_newer_than_the_table(rows))
    whole = {"FalconForCausalLM"} if falcon_attention_left_whole() is not None else set()
    assert [name for name in below if name not in newer | whole] == [], {n: rows[n]["note"] for n in below}
    assert rows["YoutuForCausalLM"]["sharded_fraction"] > 0.98 and rows["YoutuForCausalLM"]["note"] == ""


def classes_newer_than_the_table(rows) -> list[str]:
    """The listed classes docs/plans.md lacks, each one the release it was swept on never had: no record
    of that transformers in the shipped proofs (5.25.0's Ergo, Kolibri-1.1, MiniCPM5-MoE)."""
    import re

    table = (ROOT / "docs" / "plans.md").read_text()
    swept = re.search(r"Last sweep: [^,]+, transformers ([\w.]+)", table).group(1)
    records = json.loads((ROOT / "plangen" / "plans" / "proven.json").read_text())["classes"]
    missing = [name for name in rows if f"| {name} |" not in table]
    had = [name for name in missing if any(swept in r["transformers"] for r in records.get(name, {}).values())]
    assert had == [], (
        f"docs/plans.md lacks {had}, swept on transformers {swept}: run scripts/sweep_plans.py --docs-only"
    )
    return missing


def test_a_class_below_the_target_says_what_stays_whole(fake_pg, monkeypatch):
    # MiniCPM3 (95.9 %) held to 99 %: the note names its latent attention's down-projection, shared by every head.
    import plangen.commands.catalog as catalog

    monkeypatch.setattr(catalog, "WELL_SHARDED", 0.99)
    arch = catalog.Architecture("MiniCPM3ForCausalLM", "minicpm3")
    fraction, note, _ = catalog.build_sharded_fraction(arch, catalog.build_catalog_model(arch))
    assert 0.95 < fraction < 0.99
    assert note.startswith(
        "left whole at TP 2: model.layers.*.self_attn.q_a_proj 3.0% (low-rank down-projection (or its"
        " norm), shared by every head"
    )


def test_every_row_says_what_its_plan_leaves_whole_and_why(listing):
    """What stays whole beside the sharded share (docs/plans.md lists it for every class): a MoE
    plan's router, with the plan's reason; nothing for a plan that shards everything."""
    rows = rows_by_class(listing)
    assert rows["Qwen3MoeForCausalLM"]["left_whole"] == (
        "model.layers.*.mlp.gate 0.04% (the router sees every token on every rank: routing stays exact)"
    )
    assert rows["MixtralForCausalLM"]["left_whole"] == ""  # its router: 0.003 %, below what a row lists
    assert rows["YoutuForCausalLM"]["left_whole"].startswith(
        "model.layers.*.self_attn.kv_a_proj_with_mqa 1.9% (the KV latent"
    )
    assert all(row["left_whole"] == "" for row in rows.values() if row["plan"] == "none")


def test_falcon_7b_pads_its_odd_query_heads_and_shards_its_attention(listing):
    # Falcon-7B's 71 multi-query heads, padded with a zero head at TP 2 (plangen.styles.padded_heads): 80.6 %
    # TP-sharded while its attention stayed whole.
    from conftest import falcon_attention_left_whole

    row = rows_by_class(listing)["FalconForCausalLM"]
    if falcon_attention_left_whole() is not None:  # transformers 5.25.0: the attention whole again, and said so
        assert row["sharded_fraction"] < 0.95 and "self_attention" in row["note"], row
        return
    assert row["sharded_fraction"] >= 0.95 and not row["note"], row


def test_prophetnet_and_big_bird_shard_their_attention(listing):
    # ProphetNet's n-gram self-attention by heads (its bucket-major relative_pos_embeddings with them),
    # BigBird's attention by heads although its model rebuilds attention.self at the first forward.
    rows = rows_by_class(listing)
    for name in ("ProphetNetForCausalLM", "BigBirdForCausalLM"):
        assert (rows[name]["plan"], rows[name]["check"]) == ("synthesized", "passed"), name
        assert rows[name]["sharded_fraction"] >= 0.95 and "left whole at TP 2" not in rows[name]["note"], name


def test_a_plan_with_experts_replicated_shards_a_few_percent(fake_pg):
    """Qwen3-MoE's hand-written plan without its experts styles: the experts stay on every rank."""
    from plangen.commands.catalog import Architecture, build_full_size_model, measure_sharded_fraction
    from plangen.distributed.fake_group import quiet_partial_matches, tp_mesh
    from plangen.cost.memory import sharded_fraction
    from plangen.plans.choice import choose_plan
    from plangen.runtime.tensor_parallel import apply_tp

    model = build_full_size_model(Architecture("Qwen3MoeForCausalLM", "qwen3_moe"))
    styles = {k: v for k, v in choose_plan(model, False).build_styles().items() if "expert" not in k}
    with quiet_partial_matches():
        apply_tp(model, tp_mesh(2), styles)
    assert 0 < sharded_fraction(model) < 0.2
    assert sharded_fraction(model) < measure_sharded_fraction(
        lambda: build_full_size_model(Architecture("Qwen3MoeForCausalLM", "qwen3_moe"))
    )


def test_one_layer_of_each_kind_gives_the_fraction_of_every_layer(fake_pg):
    """DeepSeek-V3: three dense layers then MoE layers; the sample keeps one of each, counted 3 and 58 times."""
    from plangen.commands.catalog import (
        Architecture,
        apply_layer_sample,
        build_full_size_model,
        measure_sharded_fraction,
    )
    from plangen.distributed.fake_group import quiet_partial_matches, tp_mesh
    from plangen.cost.memory import sharded_fraction
    from plangen.plans.choice import choose_plan
    from plangen.runtime.tensor_parallel import apply_tp

    arch = Architecture("DeepseekV3ForCausalLM", "deepseek_v3")
    sample = build_full_size_model(arch)
    assert apply_layer_sample(sample) == {"model.layers.0": 3, "model.layers.1": 58}
    assert [type(layer.mlp).__name__ for layer in sample.model.layers] == ["DeepseekV3MLP", "DeepseekV3MoE"]
    every = build_full_size_model(arch)
    with quiet_partial_matches():  # dense layers have no shared_experts
        apply_tp(every, tp_mesh(2), choose_plan(every, False).build_styles())
    assert measure_sharded_fraction(lambda: build_full_size_model(arch)) == pytest.approx(
        sharded_fraction(every), abs=1e-12
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["list", "--format", "yaml"], "--format must be one of: text, json"),
        (["list", "no_such_model"], "no causal-LM architecture is named no_such_model"),
    ],
)
def test_usage_errors_are_one_line(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"plangen: error: {message}" or message in result.stderr


def test_committed_table_covers_every_architecture(listing):
    """Every class the installed transformers lists, but those its sweep's release never had (a newer
    transformers' classes: no record of that release in the shipped proofs)."""
    table = (ROOT / "docs" / "plans.md").read_text()
    assert "scripts/sweep_plans.py" in table
    newer = classes_newer_than_the_table(rows_by_class(listing))
    import transformers

    if transformers.__version__ in table.split("Last sweep:")[1].splitlines()[0]:
        assert newer == [], f"docs/plans.md lacks {newer}: run scripts/sweep_plans.py --docs-only"


def test_what_stays_whole_is_listed_with_the_plans_reason(fake_pg):
    """Below 95 % the note names the largest parts TP leaves whole, with the plan's reason: for
    MiniCPM3 its latent attention's shared down-projection (Falcon-7B's multi-query attention of 71 query
    heads, OLMo-Hybrid's gated delta nets, LFM-3's short convolutions, xLSTM's mLSTM layers and Youtu's
    query latent, once named here, are sharded)."""
    from plangen.commands.catalog import Architecture, build_full_size_model, measure_sharded_share, render_left_whole

    fraction, left = measure_sharded_share(
        lambda: build_full_size_model(Architecture("MiniCPM3ForCausalLM", "minicpm3"))
    )
    pattern, share, why = left[0]
    assert pattern == "model.layers.*.self_attn.q_a_proj" and "shared by every head" in why
    assert fraction + sum(s for _, s, _ in left) == pytest.approx(1.0)
    assert render_left_whole(left).startswith(
        f"left whole at TP 2: model.layers.*.self_attn.q_a_proj {share:.1%} (low-rank"
    )


def test_recurrent_gemma_shards_its_recurrent_blocks_at_full_size(fake_pg):
    """RecurrentGemma-2B at TP 2: its recurrent blocks (81.1 % sharded while they stayed whole) are
    split by their RG-LRU heads; what stays whole is the norms only."""
    from plangen.commands.catalog import Architecture, build_full_size_model, measure_sharded_share

    fraction, left = measure_sharded_share(
        lambda: build_full_size_model(Architecture("RecurrentGemmaForCausalLM", "recurrent_gemma"))
    )
    assert fraction >= 0.99
    assert not [pattern for pattern, _, _ in left if "temporal_block" in pattern]


def test_xlstm_shards_its_mlstm_layers_at_full_size(fake_pg):
    """xLSTM-7B at TP 2: its mLSTM layers (68.6 % sharded while they stayed whole) are split by heads;
    what stays whole is the norms only."""
    from plangen.commands.catalog import Architecture, build_full_size_model, measure_sharded_share

    fraction, left = measure_sharded_share(lambda: build_full_size_model(Architecture("xLSTMForCausalLM", "xlstm")))
    assert fraction >= 0.99
    assert not [pattern for pattern, _, _ in left if "mlstm_layer" in pattern]


def test_bloom_shards_its_attention_at_bloom_7b1_size(fake_pg):
    """BLOOM-7B1's sizes (hidden 4096, 32 heads, 30 layers, vocabulary 250880) at TP 2: its attention
    (28.5 % of the parameters, whole while its ALiBi kept it so: 71.5 % sharded) is split by heads;
    what stays whole is the norms only. The default BloomConfig (hidden 64) hides it behind its vocabulary."""
    from transformers import BloomConfig, BloomForCausalLM

    from plangen.commands.catalog import measure_sharded_share
    from plangen.model.resolve import build_meta_model

    config = BloomConfig(hidden_size=4096, n_head=32, n_layer=30, vocab_size=250880)
    fraction, left = measure_sharded_share(lambda: build_meta_model(config, BloomForCausalLM))
    assert fraction >= 0.999
    assert not [pattern for pattern, _, _ in left if "self_attention" in pattern]


def test_a_hand_written_plan_that_failed_on_this_code_is_listed_failed(monkeypatch):
    """The runtime refuses it (plangen.plans.choice); the listing still shows the class's hand-written
    plan, its check failed (as transformers 5.25.0's LongCat-Flash's did before its fix), not an internal error."""
    from conftest import set_proofs

    import plangen.plans.proven as P

    set_proofs(
        monkeypatch, {"LlamaForCausalLM": {"plan": "hand-written", "tp": False, "sp": False, "error": "logits differ"}}
    )
    monkeypatch.setattr(P, "code_digest", lambda model: "any code")  # set_proofs' records are for "any code"
    result = CliRunner().invoke(app, ["list", "--format", "json", "LlamaForCausalLM"])
    assert result.exit_code == 0, result.output
    (row,) = [r for r in json.loads(result.stdout)["architectures"] if r["class_name"] == "LlamaForCausalLM"]
    assert (row["plan"], row["check"]) == ("hand-written", "failed"), row


def _sweep_script(monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("sweep_plans", ROOT / "scripts" / "sweep_plans.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sweep_plans", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("where", ["pinned", "other"])
def test_the_sweep_writes_docs_plans_md_only_on_the_pinned_pair(where, monkeypatch, capsys):
    """docs/plans.md describes the pinned pair: a sweep in a compat venv (NeMo RL's 5.5.4, say) adds its
    proofs to proven.json and leaves the docs alone, and ``--docs-only`` there is a one-line error
    (exit 2), the file untouched. Once, such a sweep rewrote the table from 5.5.4's view."""
    import plangen.stack
    from plangen.stack import PINNED

    sweep = _sweep_script(monkeypatch)
    stack = dict(PINNED) if where == "pinned" else {"torch": "2.11.0", "transformers": "5.5.4"}
    monkeypatch.setattr(plangen.stack, "recorded_stack", lambda: stack)
    # ROOT-relative, as the messages name it; never written (write_docs records its calls instead).
    monkeypatch.setattr(sweep, "DOCS", sweep.ROOT / "docs" / "plans-under-test.md")
    written: list[object] = []  # write_proven's "proven", write_docs' seconds, in call order
    monkeypatch.setattr(sweep, "write_docs", lambda seconds: written.append(seconds))
    monkeypatch.setattr(sweep, "sweep", lambda only, batch, timeout: {"LlamaForCausalLM": ("code", {"tp": True})})
    monkeypatch.setattr(sweep, "write_proven", lambda records: written.append("proven"))

    code = sweep.main(["--docs-only"])
    out, err = capsys.readouterr()
    if where == "pinned":
        assert (code, written, err) == (0, [None], "")
    else:
        assert (code, written, out) == (2, [], "")
        assert err == (
            "plangen sweep: error: docs/plans-under-test.md describes the pinned pair "
            f"(torch {PINNED['torch']}, transformers {PINNED['transformers']}), not torch 2.11.0, "
            "transformers 5.5.4: run --docs-only in the pinned pair's venv\n"
        )

    written.clear()
    assert sweep.main(["--only", "llama"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plangen sweep: 1/1 classes passed")
    if where == "pinned":
        assert written == ["proven", None] and out[1] == "plangen sweep: wrote docs/plans-under-test.md"
    else:
        assert written == ["proven"]  # the proofs kept, the docs left alone
        assert out[1].startswith(
            "plangen sweep: left docs/plans-under-test.md alone: docs/plans-under-test.md describes"
        )

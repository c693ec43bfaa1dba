"""Level 2 of ``plangen verify``: plan files against their model on the meta device (PG2xx).

Every code's wrong example yields exactly that code at the given lines and columns, its right
example nothing; the committed generated plans are clean; each rule is probed on variants of a
generated plan; the CLI's defaults (model from the file), exit codes, formats and severities; and
the speed budget on the 405B-shaped config (benchmarks/verify_speed.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import skip_unless_pinned_model_type, stack_can_run
from plangen.check import VerifyOptions, VerifyUsageError, verify_plan_files
from plangen.stack.torch_compat import COMPUTES_ON_STRIDED_SHARD
from plangen.check.codes import CODES
from plangen.check.model import MODEL_RULES
from plangen.check.static import read_plan_metadata
from plangen.commands.cli import app

ROOT = Path(__file__).resolve().parents[1]
GENERATED = sorted((ROOT / "generated").glob("*_plan.py"))
GENERATED_NAMES = [p.name for p in GENERATED]
LEVEL2_CODES = sorted(code for code in CODES if "PG200" < code < "PG300")

# Where each wrong example's findings are, in order: (line, col).
WRONG_AT = {
    "PG201": [(4, 1)],
    "PG202": [(5, 25)],
    "PG203": [(6, 27)],
    "PG204": [(6, 37), (7, 35), (8, 37)],
    "PG205": [(5, 5), (6, 5), (7, 5)],
    "PG206": [(21, 37)],
    "PG207": [(5, 5), (6, 5)],
    "PG208": [(7, 16)],
    "PG209": [(5, 24)],
    "PG210": [(7, 40)],
    "PG211": [(7, 27)],
    "PG212": [(5, 5)],
    "PG213": [(8, 5), (10, 5)],
    "PG214": [(7, 5)],
    "PG215": [(8, 5)],
    "PG216": [(6, 24)],
    "PG217": [(8, 5)],
    "PG218": [(8, 5)],
}


def _verify(tmp_path: Path, source: str, name: str = "plan.py", **options):
    path = tmp_path / name
    path.write_text(source)
    return verify_plan_files([path], VerifyOptions(**options))


def _found(report) -> list[tuple[str, int, int]]:
    return [(d.code, d.line, d.col) for d in report.diagnostics]


# --- the registry's examples ------------------------------------------------------------------------


def test_every_level2_code_has_a_rule_and_positions():
    assert sorted(WRONG_AT) == LEVEL2_CODES
    assert sorted(MODEL_RULES) == [c for c in LEVEL2_CODES if c != "PG201"]  # PG201: the loader


# PG210's examples apply the packed styles, which torch before 2.13 cannot compute on (they refuse there).
EXAMPLE_CODES = [c if c != "PG210" or COMPUTES_ON_STRIDED_SHARD else pytest.param(c, marks=pytest.mark.skip(
    reason="torch < 2.13 cannot compute on a packed layout: PG210's examples refuse there")) for c in LEVEL2_CODES]


@pytest.mark.parametrize("code", EXAMPLE_CODES)
def test_wrong_example_has_exactly_its_code_there(code, tmp_path):
    report = _verify(tmp_path, CODES[code].wrong)
    assert _found(report) == [(code, line, col) for line, col in WRONG_AT[code]], report.diagnostics
    assert {d.severity for d in report.diagnostics} == {CODES[code].severity}  # the rule's own


@pytest.mark.parametrize("code", EXAMPLE_CODES)
def test_right_example_is_clean(code, tmp_path):
    assert _verify(tmp_path, CODES[code].right).diagnostics == []


# --- the committed generated plans -----------------------------------------------------------------


@pytest.mark.parametrize("path", stack_can_run(GENERATED_NAMES), ids=lambda name: name)
def test_generated_plan_is_clean_against_its_model(path):
    path = ROOT / "generated" / path
    metadata = read_plan_metadata(path)
    assert {"PLANGEN_MODEL", "PLANGEN_TP_SIZE", "PLANGEN_SEQUENCE_PARALLEL"} <= set(metadata)
    report = verify_plan_files([path])
    assert report.diagnostics == [] and report.notes == []


# --- each rule on variants of a generated plan -------------------------------------------------------

LLAMA = (ROOT / "generated" / "llama_plan.py").read_text()
LLAMA_SP = (ROOT / "generated" / "llama_sp_plan.py").read_text()
QWEN3 = (ROOT / "generated" / "qwen3_plan.py").read_text()
OLMO2 = (ROOT / "generated" / "olmo2_plan.py").read_text()


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def _drop(text: str, key: str) -> str:
    """``text`` without the entry of ``key``, all its lines where it spans several."""
    kept, depth = [], 0
    for line in text.splitlines():
        if depth or f'"{key}"' in line:
            depth = max(depth + line.count("(") - line.count(")"), 0)
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def test_typo_in_a_key_suggests_the_module(tmp_path):
    plan = _edit(LLAMA, '"model.layers.*.mlp.up_proj"', '"model.layer.*.mlp.up_proj"')
    report = _verify(tmp_path, plan)
    line = _line_of(plan, "model.layer.*.mlp.up_proj")
    assert ("PG202", line, 5) in _found(report)
    assert "did you mean `model.layers.*.mlp.up_proj`" in report.diagnostics[-1].message
    # The projection the typo missed is reported too, as a warning.
    assert [d.severity for d in report.diagnostics if d.code == "PG209"] == ["warning"]


def test_heads_not_divisible_names_the_largest_legal_tp_size(tmp_path):
    report = _verify(tmp_path, LLAMA, tp_size=3)
    messages = [d.message for d in report.diagnostics if d.code == "PG204"]
    assert messages[0].endswith(
        "num_attention_heads=32 is not divisible by the TP size 3: the largest legal TP size for LlamaForCausalLM"
        " is 2 (also with KV heads replicated)"
    )
    assert all(m.endswith("the largest legal TP size for this plan is 2") for m in messages[1:])
    assert len(messages) == 7  # heads on q_proj; k, v, o, gate, up, down each their own key
    assert _verify(tmp_path, LLAMA, tp_size=4).diagnostics == []


GEMMA3_TEXT = (ROOT / "generated" / "gemma3_text_plan.py").read_text()
GEMMA_3_1B = str(ROOT / "tests" / "data" / "model-configs" / "gemma-3-1b.json")  # 4 heads, 1 KV head


def test_kv_heads_replicated_where_tp_exceeds_them(tmp_path):
    """The hand-written Gemma3 plan replicates KV heads: TP 2 and 4 are legal for one KV head, TP 8
    is not (4 query heads), and a plain ColwiseParallel k_proj makes TP 2 illegal again; each finding
    at the first key that splits attention heads, naming the largest legal TP size both ways."""
    assert _verify(tmp_path, GEMMA3_TEXT, model=GEMMA_3_1B, tp_size=2).diagnostics == []
    assert _verify(tmp_path, GEMMA3_TEXT, model=GEMMA_3_1B, tp_size=4).diagnostics == []
    q_proj = (_line_of(GEMMA3_TEXT, '"model.layers.*.self_attn.q_proj"'), 40)
    found = _verify(tmp_path, GEMMA3_TEXT, model=GEMMA_3_1B, tp_size=8).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG204", *q_proj)]
    assert found[0].message.endswith(
        "num_attention_heads=4 is not divisible by the TP size 8: the largest legal TP size for Gemma3ForCausalLM"
        " is 4 (1 without KV head replication)"
    )
    plain = _edit(
        GEMMA3_TEXT,
        '"model.layers.*.self_attn.k_proj": KVHeadsColwiseParallel(',
        '"model.layers.*.self_attn.k_proj": ColwiseParallel(',
    )
    found = _verify(tmp_path, plain, model=GEMMA_3_1B, tp_size=2).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG204", *q_proj)]
    assert found[0].message.endswith(
        "num_key_value_heads=1 is not divisible by the TP size 2: the largest legal TP size for Gemma3ForCausalLM"
        " is 1 (2 with KV heads replicated by KVHeadsColwiseParallel on k_proj/v_proj)"
    )


def test_style_must_fit_the_module(tmp_path):
    plan = _edit(LLAMA, '# "model.norm": 1', '"model.norm": ColwiseParallel(),  # 1')
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG203", _line_of(plan, '"model.norm"'))]
    assert "not LlamaRMSNorm" in found[0].message
    typo = _edit(LLAMA, 'input_kwarg_layouts={"hidden_states": Replicate()}', 'input_kwarg_layouts={"hidden_state": Replicate()}')
    found = _verify(tmp_path, typo).diagnostics
    assert [d.code for d in found] == ["PG203"] and "no such parameter" in found[0].message


def test_attention_sinks_style_needs_the_blocks_own_per_head_parameters(tmp_path):
    # Llama's attention has no sinks: the style has nothing to split there.
    plan = _edit(LLAMA, '"model.layers.*.self_attn": PrepareModuleInput(', '"model.layers.*.self_attn": AttentionSinksParallel(')
    plan = "from plangen.styles import AttentionSinksParallel\n" + plan
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG203", _line_of(plan, '"model.layers.*.self_attn"'))]
    assert "LlamaAttention has no parameters of its own" in found[0].message
    # gpt-oss at TP 3: its 64 heads (and their sinks) do not split.
    gpt_oss = (ROOT / "generated" / "gpt_oss_plan.py").read_text()
    messages = [d.message for d in _verify(tmp_path, gpt_oss, tp_size=3).diagnostics if d.code == "PG204"]
    assert any("num_attention_heads=64 is not divisible by the TP size 3" in m for m in messages)
    assert _verify(tmp_path, gpt_oss, tp_size=4).diagnostics == []


DIFFLLAMA = (
    "from torch.distributed.tensor import Replicate\n"
    "from torch.distributed.tensor.parallel import RowwiseParallel\n\n"
    "from plangen.styles import FusedColwiseParallel, PairedHeadsAttentionInput\n\n"
    'PLANGEN_MODEL = "diffllama"\ncustom_parallel_plan = {\n'
    '    "model.layers.*.self_attn": PairedHeadsAttentionInput(input_kwarg_layouts={"hidden_states": Replicate()},'
    ' desired_input_kwarg_layouts={"hidden_states": Replicate()}),\n'
    + "".join(f'    "model.layers.*.self_attn.{p}": FusedColwiseParallel(part_sizes=(1, 1), input_layouts=Replicate()),\n'
              for p in ("q_proj", "k_proj", "v_proj"))
    + '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n}\n'
)


def test_paired_heads_style_needs_whole_pairs_per_rank(tmp_path):
    skip_unless_pinned_model_type("diffllama")  # PairedHeadsAttentionInput reads 5.24.0's DiffLlama
    # DiffLlama's 32 heads are 16 pairs: TP 16 keeps two heads (one pair) per rank, TP 32 would split pairs.
    assert _verify(tmp_path, DIFFLLAMA, tp_size=16).diagnostics == []
    found = [d for d in _verify(tmp_path, DIFFLLAMA, tp_size=32).diagnostics if d.code == "PG204"]
    assert found and found[0].line == _line_of(DIFFLLAMA, '"model.layers.*.self_attn": PairedHeadsAttentionInput')
    assert "attention heads" in found[0].message and "32" in found[0].message


def test_gated_delta_net_style_needs_a_gated_delta_net_whose_heads_divide(tmp_path):
    # Llama's attention has no depthwise conv over q/k/v channels: nothing of a gated delta net.
    plan = _edit(LLAMA, '"model.layers.*.self_attn": PrepareModuleInput(', '"model.layers.*.self_attn": GatedDeltaNetParallel(')
    plan = "from plangen.styles import GatedDeltaNetParallel\n" + plan
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG203", _line_of(plan, '"model.layers.*.self_attn"'))]
    assert "LlamaAttention has 0 depthwise nn.Conv1d children, not one" in found[0].message
    # Qwen3.5's synthesized plan (as plangen init writes it) at TP 3: its 16 key heads do not split.
    written = tmp_path / "qwen3_5_plan.py"
    assert CliRunner().invoke(app, ["init", "qwen3_5", "-o", str(written)]).exit_code == 0
    qwen3_5 = written.read_text()
    messages = [d.message for d in _verify(tmp_path, qwen3_5, tp_size=3).diagnostics if d.code == "PG204"]
    assert any("splits num_k_heads=16 of `model.layers.*.linear_attn`" in m and "by the TP size 3" in m for m in messages), messages
    assert _verify(tmp_path, qwen3_5, tp_size=2).diagnostics == []


def test_column_and_row_parallel_pair_within_a_block(tmp_path):
    no_o_proj = _drop(LLAMA, "model.layers.*.self_attn.o_proj")
    codes = [d.code for d in _verify(tmp_path, no_o_proj).diagnostics]
    assert codes.count("PG205") == 3 and codes.count("PG209") == 1
    local_logits = _edit(
        LLAMA, "output_layouts=Shard(-1), use_local_output=False)", "output_layouts=Shard(-1), use_local_output=True)"
    )
    found = _verify(tmp_path, local_logits).diagnostics
    assert [d.code for d in found] == ["PG205"] and "vocabulary" in found[0].message
    no_gate_up = _drop(_drop(LLAMA, "model.layers.*.mlp.gate_proj"), "model.layers.*.mlp.up_proj")
    found = [d for d in _verify(tmp_path, no_gate_up).diagnostics if d.code == "PG205"]
    assert len(found) == 1 and "row-parallel `model.layers.*.mlp.down_proj`" in found[0].message


def test_sequence_parallel_must_hold_everywhere(tmp_path):
    norm_left_out = _drop(LLAMA_SP, "model.norm")
    found = _verify(tmp_path, norm_left_out).diagnostics
    assert [d.code for d in found] == ["PG206"] and '`"model.norm": SequenceParallel()`' in found[0].message
    # Declared off on the command line: one finding for the whole plan.
    found = _verify(tmp_path, LLAMA_SP, sequence_parallel=False).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG206", _line_of(LLAMA_SP, "custom_parallel_plan: dict"))]
    found = _verify(tmp_path, LLAMA, sequence_parallel=True).diagnostics
    assert [d.code for d in found] == ["PG206"] and "never splits the sequence" in found[0].message
    # Undeclared: the plan's majority decides, the odd layout is reported on its key.
    undeclared = _edit(LLAMA_SP, "PLANGEN_SEQUENCE_PARALLEL = True\n", "")
    undeclared = _edit(
        undeclared,
        'RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=False)',
        'RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=False)',
    )
    found = _verify(tmp_path, undeclared).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG206", _line_of(undeclared, '"model.layers.*.self_attn.o_proj"'))]


def test_per_head_norms_need_their_gradient_summed(tmp_path):
    plan = _drop(QWEN3, "model.layers.*.self_attn.k_norm")
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG207", _line_of(plan, '"model.layers.*.self_attn.k_proj"'), 5)]
    assert "ReplicatedWithGradAllReduce()" in found[0].message


@pytest.mark.parametrize("style", ["ReplicatedWithGradAllReduce", "AllReduceParamGrads"])
def test_whole_projection_norm_given_another_style_is_flagged_at_its_entry(tmp_path, style):
    key = '"model.layers.*.self_attn.q_norm"'
    plan = _edit(OLMO2, f"{key}: ShardedNormParallel()", f"{key}: {style}()")
    plan = _edit(plan, "from plangen.styles import ShardedNormParallel", f"from plangen.styles import ShardedNormParallel, {style}")
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG213", _line_of(plan, key), 5)]
    assert f"`{style}` would normalise each rank's heads alone" in found[0].message


def test_whole_projection_norm_left_replicated_is_flagged_at_its_projection(tmp_path):
    plan = _drop(OLMO2, "model.layers.*.self_attn.k_norm")
    found = _verify(tmp_path, plan).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG213", _line_of(plan, '"model.layers.*.self_attn.k_proj"'), 5)]
    assert '`"model.layers.*.self_attn.k_norm": ShardedNormParallel()`' in found[0].message


def test_sharded_norm_without_its_column_parallel_projection_is_flagged(tmp_path):
    plan = _drop(OLMO2, "model.layers.*.self_attn.k_proj")
    found = [(d.code, d.line) for d in _verify(tmp_path, plan).diagnostics if d.code == "PG213"]
    assert found == [("PG213", _line_of(plan, '"model.layers.*.self_attn.k_norm"'))]


def test_sharded_norm_on_a_module_that_is_no_norm_does_not_fit(tmp_path):
    plan = _edit(OLMO2, '"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True)', '"model.embed_tokens": ShardedNormParallel()')
    found = [d for d in _verify(tmp_path, plan).diagnostics if d.code == "PG203"]
    assert [(d.line, d.col) for d in found] == [(_line_of(plan, '"model.embed_tokens"'), 27)]
    assert "Embedding has no 1-D weight of its own" in found[0].message


GEMMA3 = (ROOT / "generated" / "gemma3_text_plan.py").read_text()


def test_tied_embeddings_completed_by_the_runtime_are_not_reported(tmp_path):
    # Gemma3's head is tied to its embedding; sharding the head alone with torch's style is
    # completed by the runtime.
    plain_head = _edit(GEMMA3, '"lm_head": TiedHeadParallel(', '"lm_head": ColwiseParallel(')
    head_only = _drop(plain_head, "model.embed_tokens")
    assert [d.code for d in _verify(tmp_path, head_only).diagnostics] == []


def test_half_of_a_tied_pair_is_reported_at_its_entry_from_the_source_then_against_the_model(tmp_path):
    half = _edit(GEMMA3, '"lm_head": TiedHeadParallel(', '"lm_head": ColwiseParallel(')
    line = _line_of(half, '"model.embed_tokens"')
    assert _found(_verify(tmp_path, half)) == [("PG112", line, 27)]  # level 1; level 2 waits for it
    silenced = _edit(half, '"model.embed_tokens": TiedEmbeddingParallel(\n', '"model.embed_tokens": TiedEmbeddingParallel(  # plangen: ignore[PG112]\n')
    assert _line_of(silenced, "ignore[PG112]") == line
    found = _verify(tmp_path, silenced).diagnostics
    assert [(d.code, d.line, d.col) for d in found] == [("PG211", line, 27)]  # level 2, the same entry
    assert "`lm_head` `TiedHeadParallel(...)`" in found[0].message
    head_alone = _drop(GEMMA3, "model.embed_tokens")
    assert _found(_verify(tmp_path, head_alone)) == [("PG112", _line_of(head_alone, '"lm_head"'), 16)]


def test_leave_unsharded_and_commented_keys_mark_deliberate_replication(tmp_path):
    plan = _edit(LLAMA, '    "lm_head": ColwiseParallel(', '    "lm_head": LeaveUnsharded(),\n    "_": ColwiseParallel(')
    plan = _edit(plan, "from torch.distributed.tensor import", "from plangen.styles import LeaveUnsharded\nfrom torch.distributed.tensor import")
    plan = _drop(plan, "_")
    assert _verify(tmp_path, plan).diagnostics == []
    dropped = _drop(LLAMA, "lm_head")
    assert [d.code for d in _verify(tmp_path, dropped).diagnostics] == ["PG209"]
    commented = dropped.replace('"model.norm": 1', '"model.norm": 1\n    # "lm_head": replicated on purpose')
    assert _verify(tmp_path, commented).diagnostics == []


def test_ignore_comment_silences_a_level2_finding(tmp_path):
    # (A typo in an MLP key would leave that projection unplanned inside a prepared block: PG214.)
    plan = _edit(LLAMA, '"lm_head"', '"lm_heads"')
    plan = _edit(plan, "use_local_output=False),\n}", "use_local_output=False),  # plangen: ignore[PG202]\n}")
    plan = plan.replace("= {\n", "= {  # plangen: ignore[PG209]\n", 1)
    assert _verify(tmp_path, plan).diagnostics == []


# --- loading the plan file ---------------------------------------------------------------------------


def test_plan_that_exits_or_raises_is_a_finding_on_its_line(tmp_path):
    source = 'PLANGEN_MODEL = "llama"\nimport sys\nsys.exit(3)\ncustom_parallel_plan = {}\n'
    assert _found(_verify(tmp_path, source)) == [("PG201", 3, 1)]
    function = 'PLANGEN_MODEL = "llama"\n\n\ndef custom_parallel_plan():\n    return {"lm_head": 1 / 0}\n'
    report = _verify(tmp_path, function)
    assert _found(report) == [("PG201", 5, 24)] and "ZeroDivisionError" in report.diagnostics[0].message


def test_plan_prints_go_to_stderr(tmp_path, capsys):
    source = 'PLANGEN_MODEL = "llama"\nprint("hello from the plan")\ncustom_parallel_plan = {}\n'
    assert _verify(tmp_path, source).diagnostics == []
    captured = capsys.readouterr()
    assert "hello from the plan" in captured.err and "hello" not in captured.out


def test_files_with_static_errors_are_not_imported(tmp_path):
    marker = tmp_path / "ran"
    source = f'PLANGEN_MODEL = "llama"\nopen({str(marker)!r}, "w")\ncustom_parallel_plan = {{"lm_head": "colwise"}}\n'
    report = _verify(tmp_path, source)
    assert [d.code for d in report.diagnostics] == ["PG103"] and not marker.exists()
    assert "static findings first" in report.notes[0]


def test_settings_come_from_options_then_the_file(tmp_path):
    source = LLAMA.replace('PLANGEN_MODEL = "llama"', 'PLANGEN_MODEL = "no-such-model-type"')
    [finding] = _verify(tmp_path, source).diagnostics
    line = _line_of(source, "PLANGEN_MODEL =")
    assert (finding.code, finding.line, finding.col) == ("PG007", line, len('PLANGEN_MODEL = ') + 1)
    assert finding.message.startswith("PLANGEN_MODEL names no model: unknown model spec 'no-such-model-type'")
    assert _verify(tmp_path, source, model="llama").diagnostics == []
    with pytest.raises(VerifyUsageError, match="^--model: "):
        _verify(tmp_path, LLAMA, model="no-such-model-type")
    bare = "\n".join(line for line in LLAMA.splitlines() if not line.startswith("PLANGEN_")) + "\n"
    report = _verify(tmp_path, bare)
    assert report.diagnostics == [] and "pass --model" in report.notes[0]
    report = _verify(tmp_path, bare, model="llama")
    assert report.diagnostics == [] and "checked at TP size 2" in report.notes[0]


# --- the CLI -------------------------------------------------------------------------------------------


def _invoke(*args: str):
    return CliRunner().invoke(app, ["verify", *args])


@pytest.fixture
def warned(tmp_path):
    path = tmp_path / "warned.py"
    path.write_text(CODES["PG209"].wrong)
    return path


def test_cli_warnings_exit_0_unless_strict(warned):
    result = _invoke(str(warned), "--tp-size", "2")
    assert result.exit_code == 0
    assert result.stdout.startswith(f"{warned}:5:24: PG209 warning: `lm_head`")
    assert _invoke(str(warned), "--tp-size", "2", "--strict").exit_code == 1
    github = _invoke(str(warned), "--tp-size", "2", "--format", "github").stdout
    assert github.startswith("::warning file=") and "title=PG209" in github
    [entry] = json.loads(_invoke(str(warned), "--tp-size", "2", "--format", "json").stdout)
    assert entry["code"] == "PG209" and entry["severity"] == "warning"


def test_cli_errors_exit_1_and_bad_model_exits_2(tmp_path):
    path = tmp_path / "plan.py"
    path.write_text(CODES["PG202"].wrong)
    result = _invoke(str(path))
    assert result.exit_code == 1 and result.stdout.startswith(f"{path}:5:25: PG202 `lm_heads`")
    bad = _invoke(str(path), "--model", "no-such-model-type")
    assert bad.exit_code == 2 and bad.stderr.startswith("plangen: error: --model: unknown model spec")
    assert _invoke(str(path), "--static").exit_code == 0  # level 1 alone never imports the file


def test_cli_sequence_parallel_flag_overrides_the_file():
    path = str(ROOT / "generated" / "llama_sp_plan.py")
    assert _invoke(path).exit_code == 0
    off = _invoke(path, "--no-sequence-parallel")
    assert off.exit_code == 1 and " PG206 " in off.stdout


# --- speed ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_levels_1_and_2_on_405b_within_budget_of_the_import_floor():
    script = ROOT / "benchmarks" / "verify_speed.py"
    result = subprocess.run(
        [sys.executable, str(script), "--repeat", "2"], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ratio" in result.stdout


# --- ecosystem ------------------------------------------------------------------------------------------


def test_pre_commit_hook_runs_verify_on_plan_files():
    import re

    import yaml

    [hook] = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "plangen-verify" and hook["entry"] == "plangen verify" and hook["language"] == "python"
    assert re.search(hook["files"], "generated/llama_plan.py") and not re.search(hook["files"], "plangen/plan/__init__.py")


def test_docs_ci_snippet_is_valid_and_uses_real_options():
    import re

    import yaml

    section = (ROOT / "docs" / "verify.md").read_text()
    workflow, pre_commit = (yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S))
    [command] = [step["run"] for step in workflow["jobs"]["verify"]["steps"] if "plangen verify" in step.get("run", "")]
    options = [word for word in command.split() if word.startswith("--")]
    help_text = _invoke("--help").stdout
    assert options and all(option in help_text for option in options)
    assert pre_commit["repos"][0]["hooks"][0]["id"] == "plangen-verify"


def test_a_low_rank_latent_norm_is_not_taken_for_a_per_head_norm(tmp_path):
    # DeepSeek's q_a_layernorm normalizes the query latent before q_b_proj, not each head after it.
    source = (
        "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel\n"
        'PLANGEN_MODEL = "deepseek_v3"\n'
        "custom_parallel_plan = {\n"
        '    "model.layers.*.self_attn.q_b_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.kv_b_proj": ColwiseParallel(),\n'
        '    "model.layers.*.self_attn.o_proj": RowwiseParallel(),\n'
        "}\n"
    )
    assert [code for code, *_ in _found(_verify(tmp_path, source)) if code == "PG207"] == []


# --- plans that break at run time, caught at level 2 (issue 14) -------------------------------------

Q_PROJ = '"model.layers.*.self_attn.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)'
DOWN_PROJ = '"model.layers.*.mlp.down_proj": RowwiseParallel(input_layouts=Shard(-1)'
UP_PROJ = '"model.layers.*.mlp.up_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)'
EMBED = '"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()'
A = "model.layers.*.self_attn"
M = "model.layers.*.mlp"
# name -> (the edited plan, the entry the finding sits on, its message)
BROKEN_EDITS = {
    "q_proj_rowwise": (
        _edit(LLAMA, Q_PROJ, f'"{A}.q_proj": RowwiseParallel()'),
        f'"{A}.q_proj"',
        f"`{A}.q_proj` leaves a plain tensor, whole (Replicate()), but `{A}.o_proj` (RowwiseParallel) reads a plain"
        f" tensor, this rank's shard on dim -1 (Shard(-1)) (like `{A}.k_proj`, `{A}.v_proj`): the shapes do not"
        " meet at run time",
    ),
    "down_proj_reads_shard_0": (
        _edit(LLAMA, DOWN_PROJ, DOWN_PROJ.replace("Shard(-1)", "Shard(0)")),
        f'"{M}.down_proj"',
        f"`{M}.down_proj` (RowwiseParallel) reads its input as a plain tensor, this rank's shard on dim 0 (Shard(0)),"
        f" but `{M}.gate_proj`, `{M}.up_proj` leave a plain tensor, this rank's shard on dim -1 (Shard(-1)): its"
        " input_layouts should say Shard(-1)",
    ),
    "up_proj_leaves_shard_1": (
        _edit(LLAMA, UP_PROJ, UP_PROJ.replace("Shard(-1)", "Shard(1)")),
        f'"{M}.up_proj"',
        f"`{M}.up_proj` leaves a plain tensor, this rank's shard on dim 1 (Shard(1)), but `{M}.down_proj`"
        f" (RowwiseParallel) reads a plain tensor, this rank's shard on dim -1 (Shard(-1)) (like `{M}.gate_proj`):"
        " the shapes do not meet at run time",
    ),
    "embed_tokens_leaves_shard_0": (
        _edit(LLAMA, EMBED, EMBED.replace("output_layouts=Replicate()", "output_layouts=Shard(0)")),
        '"model.embed_tokens"',
        f"`model.embed_tokens` leaves a plain tensor, this rank's shard on dim 0 (Shard(0)), but `{A}`"
        " (PrepareModuleInput) reads a plain tensor, whole (Replicate()): the shapes do not meet at run time",
    ),
    # Found by the verify property (tests/test_verify_property.py): Qwen3's per-head q_norm reads
    # q_proj's output; its layout still has to meet o_proj's (the norm computes on it as given).
    "qwen3_q_proj_leaves_shard_0_through_q_norm": (
        _edit(QWEN3, Q_PROJ, Q_PROJ.replace("output_layouts=Shard(-1)", "output_layouts=Shard(0)")),
        f'"{A}.q_proj"',
        f"`{A}.q_proj` leaves a plain tensor, this rank's shard on dim 0 (Shard(0)), but `{A}.o_proj`"
        f" (RowwiseParallel) reads a plain tensor, this rank's shard on dim -1 (Shard(-1)) (like `{A}.k_proj`,"
        f" `{A}.v_proj`): the shapes do not meet at run time",
    ),
    "up_proj_deleted": (
        _drop(LLAMA, f"{M}.up_proj"),
        f'"{M}"',
        f"`{M}` hands a DTensor to `{M}.up_proj` (Linear), which has no entry: its weights are plain tensors and"
        " torch refuses to mix a Tensor and a DTensor; give it a style (as its siblings have) or leave"
        f" `{M}`'s output plain (use_local_output=True)",
    ),
}


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(BROKEN_EDITS))
def test_an_edit_that_breaks_at_run_time_fails_level_2_on_the_entry_that_causes_it(tmp_path, name):
    plan, entry, message = BROKEN_EDITS[name]
    path = tmp_path / "llama_plan.py"
    path.write_text(plan)
    before = _snapshot(tmp_path)
    result = _invoke(str(path))  # levels 1 and 2, no --run
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stdout.splitlines() if " warning: " not in line]
    assert errors == [f"{path}:{_line_of(plan, entry + ':')}:5: PG214 {message}"]
    assert _snapshot(tmp_path) == before  # nothing written, nothing touched


def test_a_per_head_norm_as_sequence_parallel_on_the_heads_dim_is_clean(tmp_path):
    # ReplicatedWithGradAllReduce is this SequenceParallel: the same run, right (the verify property's case216).
    norm = f'"{A}.q_norm": ReplicatedWithGradAllReduce(sequence_dim=2, use_local_output=True)'
    plan = _edit(QWEN3, norm, norm.replace("ReplicatedWithGradAllReduce(", "SequenceParallel("))
    plan = _edit(plan, "RowwiseParallel\n", "RowwiseParallel, SequenceParallel\n")
    path = tmp_path / "qwen3_plan.py"
    path.write_text(plan)
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output


def test_a_dtensor_into_a_per_head_norm_is_clean_where_it_leaves_the_heads_o_proj_reads(tmp_path):
    # q_proj's DTensor (use_local_output=False) is viewed per head; q_norm keeps it on its heads shard and
    # returns that shard, the one o_proj reads: the same run, right (the verify property's case124).
    plan = _edit(QWEN3, Q_PROJ, Q_PROJ.replace("use_local_output=True", "use_local_output=False"))
    path = tmp_path / "qwen3_plan.py"
    path.write_text(plan)
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output


# The run on a fake process group blames the same entries by itself, not the module that crashed.
FAKE_RUN_BLAMES = {
    "q_proj_rowwise": (f"{A}.q_proj", "model.layers.0.self_attn.o_proj"),
    "down_proj_reads_shard_0": (f"{M}.down_proj", "model.layers.0.mlp.down_proj"),
    "up_proj_leaves_shard_1": (f"{M}.up_proj", "model.layers.0.mlp"),
    "embed_tokens_leaves_shard_0": ("model.embed_tokens", None),
    "up_proj_deleted": (M, "model.layers.0.mlp.up_proj"),
}


@pytest.mark.parametrize("name", sorted(FAKE_RUN_BLAMES))
def test_the_fake_process_group_run_blames_the_entry_not_the_crashed_module(tmp_path, name):
    from plangen.check.fake_run import run_on_fake_group
    from plangen.check.model import load_meta_model
    from plangen.check.shrunk import build_shrunk_model
    from plangen.plan.source import load_custom_plan

    path = tmp_path / "llama_plan.py"
    path.write_text(BROKEN_EDITS[name][0])
    shrunk = build_shrunk_model(load_meta_model("llama")[0], 2, load_custom_plan(str(path)))
    failure = run_on_fake_group(shrunk.model, shrunk.written, 2, sequence_parallel=False)
    assert (failure.key, failure.module) == FAKE_RUN_BLAMES[name], failure


def test_level_3s_shapes_stage_blames_the_entry_too(tmp_path):
    # verify --run used to name o_proj for a row-parallel q_proj (the module that crashed).
    from torch.distributed.device_mesh import init_device_mesh

    from plangen.check.run import _quietly, run_case
    from plangen.distributed.fake_group import fake_process_group

    path = tmp_path / "llama_plan.py"
    path.write_text(BROKEN_EDITS["q_proj_rowwise"][0])
    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
        case = {"model": "llama", "path": str(path), "sequence_parallel": False}
        result = _quietly(lambda: run_case(case, 2, mesh, compare=False))
    assert (result["stage"], result["module"], result["key"]) == ("forward", "model.layers.0.self_attn.o_proj", f"{A}.q_proj")


# --- Mamba1 mixers split by channels (plangen.styles.mamba1) ------------------------------------

_MAMBA_PLAN = '''from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import RowwiseParallel

from plangen.styles import Mamba1MixerParallel

PLANGEN_MODEL = "mamba"
custom_parallel_plan = {{
    "backbone.layers.*.{mixer}": Mamba1MixerParallel(input_layouts=Replicate(), grad_reduced=("x_proj",)),
    "backbone.layers.*.mixer.out_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
}}
'''


def test_mamba1_mixer_plan_is_clean_and_its_style_fits_mixers_only(tmp_path):
    """The mixer's own style lays out in_proj, conv1d, dt_proj and x_proj (no PG205 for out_proj, no
    PG209 for the projections it shards); on anything but a Mamba1 mixer it does not fit (PG203)."""
    assert _found(_verify(tmp_path, _MAMBA_PLAN.format(mixer="mixer"))) == []
    report = _verify(tmp_path, _MAMBA_PLAN.format(mixer="norm"), name="wrong.py")
    assert [(d.code, d.line) for d in report.diagnostics if d.code == "PG203"] == [("PG203", 8)]
    assert "splits a Mamba1 mixer by its channels, but MambaRMSNorm has no nn.Linear" in str(report.diagnostics)
def test_experts_the_tp_size_does_not_divide_get_the_intermediate_split_and_verify_names_it(tmp_path):
    """HunYuan-MoE-V1's one expert at TP 2: clean (each expert's intermediate split), and the file
    init writes says so on the experts' entry. Mixtral's 8 experts at TP 3, whose 14336-wide
    intermediate does not divide either: PG204 names both layouts."""
    from plangen.commands.init import init_plan

    path = init_plan("hunyuan_v1_moe", tmp_path / "hunyuan_plan.py").path
    source = path.read_text()
    comments = " ".join(line.strip().removeprefix("# ") for line in source.splitlines())  # comments wrap
    assert "local [1, 11008, 4096] at TP=2: each expert's intermediate split (1 experts do not divide" in comments
    assert _verify(tmp_path, source).diagnostics == []
    mixtral = (ROOT / "generated" / "mixtral_plan.py").read_text()
    found = [d for d in _verify(tmp_path, mixtral, tp_size=3).diagnostics if "experts" in d.message]
    assert [(d.code, d.line) for d in found] == [("PG204", _line_of(mixtral, '"model.layers.*.mlp.experts"'))]
    assert ("8 experts do not divide by the TP size 3, and each expert's intermediate split (the other layout) does not"
            " fit: their intermediate width 14336 does not divide by it either") in found[0].message
    assert found[0].message.endswith("the largest legal TP size for this plan is 2")  # at most the TP size asked for


def test_experts_styles_fit_packed_experts_modules_only(tmp_path):
    """PG203 on the expert layout: ExpertsParallel on a module that is no packed experts module (an
    nn.Linear), and a torch style on the packed experts module, each found on its entry's value."""
    mixtral = (ROOT / "generated" / "mixtral_plan.py").read_text()
    experts = '"model.layers.*.mlp.experts": ExpertsParallel('
    on_linear = mixtral.replace('    "model.layers.*.self_attn.q_proj": ColwiseParallel(', '    "model.layers.*.self_attn.q_projX": ColwiseParallel(', 1)
    on_linear = on_linear.replace(experts, '"model.layers.*.self_attn.q_proj": ExpertsParallel(', 1)
    [found] = [d for d in _verify(tmp_path, on_linear).diagnostics if d.code == "PG203"]
    assert found.line == _line_of(on_linear, '"model.layers.*.self_attn.q_proj": ExpertsParallel')
    assert found.message == ("`ExpertsParallel` shards a packed experts module (num_experts and [experts, ...] weights,"
                             " transformers 5.x), not Linear (`model.layers.*.self_attn.q_proj`)")
    line = next(l for l in mixtral.splitlines() if experts in l)
    torch_style = mixtral.replace(line, '    "model.layers.*.mlp.experts": ColwiseParallel(),')
    [found] = [d for d in _verify(tmp_path, torch_style).diagnostics if d.code == "PG203"]
    assert (found.line, found.message) == (
        _line_of(torch_style, '"model.layers.*.mlp.experts"'),
        "`ColwiseParallel` shards nn.Linear and nn.Embedding only, not MixtralExperts (torch raises NotImplementedError)"
        " (`model.layers.*.mlp.experts`)")


# --- RecurrentGemma's recurrent blocks split by their RG-LRU heads (plangen.styles.recurrent) ---------


def test_recurrent_gemma_plan_is_clean_and_its_rg_lru_style_fits_rg_lrus_with_heads_tp_divides(tmp_path):
    """The file init writes for RecurrentGemma is clean at TP 2; at TP 4 its 10 RG-LRU heads do not
    divide (PG204 on the RG-LRU's entry, naming TP 2); on the conv it does not fit (PG203)."""
    from conftest import skip_unless_pinned_model_type
    from plangen.commands.init import init_plan

    skip_unless_pinned_model_type("recurrent_gemma")  # the lines and widths of the plan for this code

    source = init_plan("recurrent_gemma", tmp_path / "recurrent_gemma_plan.py").path.read_text()
    line = _line_of(source, '"model.layers.*.temporal_block.rg_lru"')
    assert _verify(tmp_path, source).diagnostics == []
    found = _verify(tmp_path, source, tp_size=4).diagnostics
    assert [(d.code, d.line) for d in found] == [("PG204", line)]
    assert "num_attention_heads=10" in found[0].message and "the largest legal TP size for this plan is 2" in found[0].message
    wrong = source.replace('"model.layers.*.temporal_block.rg_lru"', '"model.layers.*.temporal_block.conv_1d"')
    found = _verify(tmp_path, wrong, name="wrong.py").diagnostics
    assert [(d.code, d.line) for d in found] == [("PG203", line)]
    assert "splits an RG-LRU by its heads, but Conv1d has parameters ['bias', 'weight']" in found[0].message


def test_xlstm_plan_is_clean_and_its_head_counts_must_divide(tmp_path):
    """The file init writes for xLSTM is clean at TP 2 (its multi-head norm, as wide as v, is not taken
    for a whole-projection norm: no PG213); at TP 16 its 8 heads do not divide (PG204 on the
    multi-head norm's entry and on the block's); on the block's input norm the style does not fit (PG203)."""
    from plangen.commands.init import init_plan

    source = init_plan("xlstm", tmp_path / "xlstm_plan.py").path.read_text()
    norm = _line_of(source, '"backbone.blocks.*.mlstm_layer.multihead_norm"')
    assert _verify(tmp_path, source).diagnostics == []
    found = _verify(tmp_path, source, tp_size=16).diagnostics
    assert [d.code for d in found if d.line == norm] == ["PG204"] and "num_heads=8" in str(found)
    # The block reshapes by its config's head count made this rank's (PrepareAttentionInput's
    # head_attributes): that count must divide too, found on the block's own entry.
    block = [d for d in found if d.line == _line_of(source, '"backbone.blocks.*.mlstm_layer"')]
    assert [d.code for d in block] == ["PG204"] and "splits config.num_heads=8 of `backbone.blocks.*.mlstm_layer`" in block[0].message
    assert block[0].message.endswith("the largest legal TP size for this plan is 8")
    wrong = source.replace('"backbone.blocks.*.mlstm_layer.multihead_norm"', '"backbone.blocks.*.norm_mlstm"')
    found = _verify(tmp_path, wrong, name="wrong.py").diagnostics
    assert ("PG203", norm) in [(d.code, d.line) for d in found]
    assert "splits a norm of each head by its heads, but xLSTMRMSNorm has no integer attribute num_heads" in str(found)


def test_norm_handed_the_sequence_whole_by_its_layer_is_not_on_the_residual_stream(tmp_path):
    """Gemma 4's MoE form under SP: the layer's SharedInputGather gathers the flattened residual once
    for the router and the experts' input norm (pre_feedforward_layernorm_2), which then computes on
    the whole sequence: no key of its own, and no PG206 for it; without that style it is one."""
    from transformers import AutoConfig

    from conftest import skip_unless_pinned_model_type
    from plangen.commands.init import init_plan
    from tiny_configs import TINY

    kwargs = dict(TINY["gemma4-moe"])
    skip_unless_pinned_model_type(kwargs["model_type"])  # the plan the synthesizer writes for this code
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    config.architectures = ["Gemma4ForCausalLM"]
    config.save_pretrained(tmp_path / "gemma4-moe")
    plan = tmp_path / "plan.py"
    init_plan(str(tmp_path / "gemma4-moe"), plan, sequence_parallel=True)
    source = plan.read_text()
    assert ('SharedInputGather(\n        readers=("router", "pre_feedforward_layernorm_2"),\n'
            '        partial_readers=("pre_feedforward_layernorm_2",),\n    )') in source
    model = str(tmp_path / "gemma4-moe")
    assert _verify(tmp_path, source, model=model).diagnostics == []
    dropped = _drop(source, "model.layers.*")
    found = [d for d in _verify(tmp_path, dropped, name="dropped.py", model=model).diagnostics if d.code == "PG206"]
    assert found and "pre_feedforward_layernorm_2" in found[0].message


# --- Falcon-7B's multi-query attention, its 71 query heads padded with zero heads (plangen.styles.padded_heads) ---


@pytest.mark.parametrize("tp_size", [2, 4, 8])
def test_falcon_plan_with_padded_heads_is_clean_at_even_tp_sizes(tp_size, tmp_path):
    """71 query heads, which no even TP size splits: the plan init writes pads them, and verify (the
    rules and the fake run of the shrunk model, whose head count stays odd) finds nothing."""
    from conftest import falcon_attention_left_whole
    from plangen.commands.init import init_plan

    source = init_plan("falcon", tmp_path / "falcon_plan.py", tp_size=tp_size).path.read_text()
    # Where the synthesizer keeps the attention whole (transformers 5.25.0) nothing is padded, and the
    # plan takes any TP size as well.
    assert ("padded_heads=True" in source) == (falcon_attention_left_whole() is None)
    assert _verify(tmp_path, source, tp_size=tp_size).diagnostics == []

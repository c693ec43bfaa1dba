"""Bad input gets one line that says what is wrong and where, exit code 2, and no file written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.commands.cli import EXIT_USAGE, app
from plangen.plan.source import PlanLoadError, load_custom_plan

CONFIGS = {
    "hidden_not_int": (
        {"model_type": "llama", "hidden_size": "big"},
        "hidden_size must be a positive integer, got 'big'",
    ),
    "zero_heads": (
        {"model_type": "llama", "num_attention_heads": 0},
        "num_attention_heads must be a positive integer, got 0",
    ),
    "negative_text_vocab": (
        {"model_type": "gemma3", "text_config": {"vocab_size": -1}},
        "text_config.vocab_size must be a positive integer, got -1",
    ),
    "bool_layers": (
        {"model_type": "llama", "num_hidden_layers": True},
        "num_hidden_layers must be a positive integer, got True",
    ),
    "zero_layers": (
        {"model_type": "llama", "num_hidden_layers": 0},
        "num_hidden_layers must be a positive integer, got 0",
    ),
    "a_list": ([1, 2], "holds a JSON list; a config.json is an object"),
    "no_model_type": ({}, 'has no "model_type": a config.json names its model type'),
    # transformers' own validation: the field and the reason, not only the first line.
    "eps_not_float": (
        {"model_type": "llama", "rms_norm_eps": "x"},
        "Validation error for field 'rms_norm_eps': TypeError: Field 'rms_norm_eps' expected float, got str",
    ),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_a_bad_config_is_one_line_naming_the_field_and_writes_nothing(tmp_path, name):
    content, expected = CONFIGS[name]
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(content))
    out = tmp_path / "plan.py"

    result = CliRunner().invoke(app, ["init", str(config), "-o", str(out)])

    assert result.exit_code == EXIT_USAGE
    [line] = result.output.strip().splitlines()
    assert line.startswith("plangen: error: ") and str(config) in line and expected in line
    assert "Traceback" not in result.output and not out.exists()


def test_init_refuses_a_plan_its_own_verify_would_reject_and_writes_nothing(tmp_path):
    # An FFN width of 1001 does not split over TP 2 into the plain local shards the MLP hands on (PG204).
    config = tmp_path / "odd_ffn.json"
    config.write_text(json.dumps({"model_type": "llama", "intermediate_size": 1001}))
    out = tmp_path / "plan.py"
    before = sorted(tmp_path.iterdir())

    result = CliRunner().invoke(app, ["init", str(config), "-o", str(out), "--tp-size", "2"])

    assert result.exit_code == EXIT_USAGE
    [line] = result.output.strip().splitlines()
    assert line == (
        "plangen: error: --tp-size 2: `ColwiseParallel` splits out_features=1001 of `model.layers.*.mlp.gate_proj`"
        " into plain local shards, which needs it divisible by the TP size 2; the largest legal TP size for this"
        " plan is 1"
    )
    assert sorted(tmp_path.iterdir()) == before  # nothing written
    assert CliRunner().invoke(app, ["init", str(config), "-o", str(out), "--tp-size", "1"]).exit_code == 0


@pytest.mark.parametrize("spec", ["", "   ", ".relative", "a..b", "pkg.1bad"])
def test_a_malformed_plan_path_says_what_is_accepted(spec):
    with pytest.raises(PlanLoadError, match=r"dotted path .*\.py file"):
        load_custom_plan(spec)


BROKEN_PLANS = {
    "syntax.py": ("import torch\ncustom_parallel_plan = {\n", 2, "SyntaxError: '{' was never closed"),
    "raises.py": (
        "x = 1\nraise RuntimeError('no GPU here')\ncustom_parallel_plan = {}\n",
        2,
        "RuntimeError: no GPU here",
    ),
    "missing_import.py": (
        "import torch\nfrom no_such_module_xyz import PLAN\n",
        2,
        "No module named 'no_such_module_xyz'",
    ),
}


@pytest.mark.parametrize("name", BROKEN_PLANS)
@pytest.mark.parametrize("form", ["file", "dotted"])
def test_a_plan_that_fails_at_import_names_its_file_and_line(tmp_path, monkeypatch, name, form):
    source, line, message = BROKEN_PLANS[name]
    path = tmp_path / name
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = str(path) if form == "file" else f"{path.stem}.custom_parallel_plan"

    with pytest.raises(PlanLoadError) as raised:
        load_custom_plan(spec)

    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith(f"{spec}: ") and f"{path}:{line}: " in text and message in text


# --- verify: one file's bad top level or bad constants never end the run ----------------------

GENERATED_LLAMA = (Path(__file__).resolve().parent.parent / "generated" / "llama_plan.py").read_text()


def _with_constant(name: str, value: str) -> str:
    lines = GENERATED_LLAMA.splitlines(keepends=True)
    [index] = [i for i, line in enumerate(lines) if line.startswith(f"{name} = ")]
    lines[index] = f"{name} = {value}\n"
    return "".join(lines)


def _line(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(start))


def test_verify_turns_each_bad_file_into_a_finding_on_it_and_checks_the_others(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = {
        "loop.py": "while True:\n    pass\n" + GENERATED_LLAMA,
        "exit0.py": "import os\nos._exit(0)\n" + GENERATED_LLAMA,
        "interrupt.py": "x = 1\nraise KeyboardInterrupt\n" + GENERATED_LLAMA,
        "tp_negative.py": _with_constant("PLANGEN_TP_SIZE", "-4"),
        "tp_zero.py": _with_constant("PLANGEN_TP_SIZE", "0"),
        "tp_text.py": _with_constant("PLANGEN_TP_SIZE", '"two"'),
        "tp_bool.py": _with_constant("PLANGEN_TP_SIZE", "True"),
        "no_model.py": _with_constant("PLANGEN_MODEL", '"no-such-model-type"'),
        "good.py": GENERATED_LLAMA,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)

    result = CliRunner().invoke(app, ["verify", "--timeout", "5", *files])

    assert result.exit_code == 1, result.output
    found = {}
    for line in result.stdout.strip().splitlines():
        location, code, message = line.split(" ", 2)
        name, row, col = location.rstrip(":").split(":")
        assert name not in found, line  # one finding per bad file
        found[name] = (code, int(row), message)
    tp_line = _line(GENERATED_LLAMA, "PLANGEN_TP_SIZE")
    model_line = _line(GENERATED_LLAMA, "PLANGEN_MODEL")
    # Where a hang or an exit happened is not known: the finding sits on the plan (two lines were
    # put before the generated text).
    plan_line = _line(GENERATED_LLAMA, "custom_parallel_plan") + 2
    code, row, message = found.pop("loop.py")
    assert (code, row) == ("PG201", plan_line) and "did not finish within 5 s" in message
    code, row, message = found.pop("exit0.py")
    assert (code, row) == ("PG201", plan_line) and "ended the process (exit code 0)" in message
    assert found.pop("interrupt.py") == ("PG201", 2, "the plan file cannot be loaded: KeyboardInterrupt")
    for name, shown in (("tp_negative.py", "-4"), ("tp_zero.py", "0"), ("tp_text.py", "'two'"), ("tp_bool.py", "True")):
        assert found.pop(name) == ("PG007", tp_line, f"PLANGEN_TP_SIZE must be a positive integer, got {shown}")
    code, row, message = found.pop("no_model.py")
    assert (code, row) == ("PG007", model_line) and message.startswith("PLANGEN_MODEL names no model: ")
    assert found == {}  # good.py is clean, and was checked (no note says otherwise)
    assert "good.py" not in result.stderr


@pytest.mark.parametrize(("value", "shown"), [("-4", "-4"), ("0", "0"), ("2.5", "2.5"), ("True", "True")])
def test_cost_refuses_a_recorded_tp_size_of_the_wrong_kind(tmp_path, value, shown):
    plan = tmp_path / "plan.py"
    plan.write_text(_with_constant("PLANGEN_TP_SIZE", value))
    result = CliRunner().invoke(app, ["cost", str(plan)])
    assert result.exit_code == EXIT_USAGE
    assert result.output.strip() == f"plangen: error: {plan}: PLANGEN_TP_SIZE must be a positive integer, got {shown}"


# --- init: the output path first, config paths recorded where the plan file can find them ------


def test_an_overlong_output_name_is_a_usage_error_and_nothing_is_written(tmp_path):
    out = tmp_path / ("p" * 300 + ".py")
    result = CliRunner().invoke(app, ["init", "llama", "-o", str(out)])
    assert result.exit_code == EXIT_USAGE
    assert (
        result.output.strip()
        == f"plangen: error: -o {out}: the file name is longer than this file system allows (255 bytes)"
    )
    assert list(tmp_path.iterdir()) == []


def test_init_refuses_an_existing_file_before_importing_transformers(tmp_path):
    import subprocess
    import sys

    existing = tmp_path / "plan.py"
    existing.write_text(GENERATED_LLAMA)
    code = (
        "import sys\n"
        "from plangen.commands.init import init_plan\n"
        "from plangen.output.errors import InitError\n"
        "try:\n"
        f"    init_plan('qwen3', {str(existing)!r})\n"
        "except InitError as error:\n"
        "    print(error)\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'built before refusing'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        result.stdout.strip()
        == f"{existing} already exists; pass --force to replace it (the old file is kept as {existing}.bak)"
    )
    assert existing.read_text() == GENERATED_LLAMA


def test_a_config_path_is_recorded_relative_to_the_plan_so_verify_runs_from_anywhere(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "llama.json"
    config.write_text((Path(__file__).parent / "data" / "model-configs" / "llama-3.2-1b.json").read_text())
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["init", "configs/llama.json", "-o", "plans/llama_plan.py"])
    assert result.exit_code == 0, result.output
    plan = tmp_path / "plans" / "llama_plan.py"
    assert 'PLANGEN_MODEL = "../configs/llama.json"' in plan.read_text().splitlines()

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = CliRunner().invoke(app, ["verify", "../plans/llama_plan.py"])
    assert result.exit_code == 0 and result.stdout == "", result.output
    # Regenerating the same plan from elsewhere is recognised as the same model: built, then unchanged
    # or refused only because the text (its regeneration command) differs.
    result = CliRunner().invoke(app, ["init", "../configs/llama.json", "-o", "../plans/llama_plan.py"])
    assert result.exit_code == EXIT_USAGE and "already exists" in result.output


def test_head_counts_of_a_config_whose_heads_vary_by_layer():
    # dots3_note's config refuses to answer num_attention_heads globally (128 on some layers, 64 on others).
    from plangen.model.heads import head_counts, tp_size_problem
    from plangen.model.resolve import config_for_class, resolve_model

    resolved = resolve_model("dots3_note")
    config = config_for_class(resolved.config, resolved.model_class)
    layers = list(config.get_text_config().per_layer_config)
    assert {layer.num_attention_heads for layer in layers} == {128, 64}
    assert head_counts(config) == (64, 64)
    assert tp_size_problem(config, 8, "Dots3NoteForCausalLM") is None
    assert tp_size_problem(config, 128, "Dots3NoteForCausalLM") == (
        "num_attention_heads=64 is not divisible by the TP size 128: the largest legal TP size for Dots3NoteForCausalLM"
        " is 64 (also with KV heads replicated)"
    )


def test_cost_of_a_plan_that_fails_its_step_is_one_line_on_stderr(tmp_path):
    import subprocess
    import sys

    plan = tmp_path / "broken.py"
    entry = '"model.layers.*.self_attn.q_proj": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)'
    assert entry in GENERATED_LLAMA
    plan.write_text(GENERATED_LLAMA.replace(entry, '"model.layers.*.self_attn.q_proj": RowwiseParallel()'))
    result = subprocess.run([sys.executable, "-m", "plangen", "cost", str(plan)], capture_output=True, text=True)
    assert result.returncode == EXIT_USAGE and result.stdout == ""
    assert result.stderr.startswith(
        "plangen: error: the plan fails a training step of a shrunk LlamaForCausalLM at TP 2: "
    )
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no fake-tensor traceback before it


def _without_model_constant(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("PLANGEN_MODEL")) + "\n"


@pytest.mark.parametrize("with_model", [False, True], ids=["no-model-known", "model-known"])
def test_a_file_that_raises_at_import_is_pg201_whether_or_not_its_model_is_known(tmp_path, monkeypatch, with_model):
    # Issue 31: without PLANGEN_MODEL and --model, verify used to skip the import and exit 0.
    monkeypatch.chdir(tmp_path)
    text = GENERATED_LLAMA if with_model else _without_model_constant(GENERATED_LLAMA)
    assert ("PLANGEN_MODEL" in text) is with_model
    files = {
        "missing_module.py": "import plangen_no_such_module\n" + text,
        "divide.py": "N = 1 // 0\n" + text,
        "good.py": text,
    }
    for name, body in files.items():
        (tmp_path / name).write_text(body)

    result = CliRunner().invoke(app, ["verify", *files])

    assert result.exit_code == 1, result.output
    found = {}
    for line in result.stdout.strip().splitlines():
        location, code, message = line.split(" ", 2)
        name, row, _ = location.rstrip(":").split(":")
        found[name] = (code, int(row), message)
    assert found == {
        "missing_module.py": (
            "PG201",
            1,
            "the plan file cannot be loaded: ModuleNotFoundError: No module named 'plangen_no_such_module'",
        ),
        "divide.py": (
            "PG201",
            1,
            "the plan file cannot be loaded: ZeroDivisionError: integer division or modulo by zero",
        ),
    }
    # good.py: clean; without a model, only imported, which the exit status shows under --strict.
    good = CliRunner().invoke(app, ["verify", "good.py"])
    strict = CliRunner().invoke(app, ["verify", "--strict", "good.py"])
    assert (good.exit_code, good.stdout) == (0, "")
    assert (strict.exit_code, strict.stdout) == ((0, "") if with_model else (1, ""))
    assert ("not checked against a model" in good.stderr) is not with_model

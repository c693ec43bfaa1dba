"""Bad input gets one line that says what is wrong and where, exit code 2, and no file written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.cli import EXIT_USAGE, app
from plangen.plan_source import PlanLoadError, load_custom_plan

CONFIGS = {
    "hidden_not_int": ({"model_type": "llama", "hidden_size": "big"}, "hidden_size must be a positive integer, got 'big'"),
    "zero_heads": ({"model_type": "llama", "num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    "negative_text_vocab": (
        {"model_type": "gemma3", "text_config": {"vocab_size": -1}},
        "text_config.vocab_size must be a positive integer, got -1",
    ),
    "bool_layers": ({"model_type": "llama", "num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
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


@pytest.mark.parametrize("spec", ["", "   ", ".relative", "a..b", "pkg.1bad"])
def test_a_malformed_plan_path_says_what_is_accepted(spec):
    with pytest.raises(PlanLoadError, match=r"dotted path .*\.py file"):
        load_custom_plan(spec)


BROKEN_PLANS = {
    "syntax.py": ("import torch\ncustom_parallel_plan = {\n", 2, "SyntaxError: '{' was never closed"),
    "raises.py": ("x = 1\nraise RuntimeError('no GPU here')\ncustom_parallel_plan = {}\n", 2, "RuntimeError: no GPU here"),
    "missing_import.py": ("import torch\nfrom no_such_module_xyz import PLAN\n", 2, "No module named 'no_such_module_xyz'"),
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

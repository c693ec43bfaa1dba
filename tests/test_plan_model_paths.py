"""Issue 34: a generated plan names its config file or folder (PLANGEN_MODEL) so that every reader
finds it, wherever the plan is written and wherever the reader runs from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.commands.cli import app
from plangen.model.resolve import record_model_spec, resolve_model, resolve_recorded_spec

LLAMA_CONFIG = Path(__file__).parent / "data" / "model-configs" / "llama-3.2-1b.json"
QWEN3_CONFIG = Path(__file__).parent / "data" / "model-configs" / "qwen3-0.6b.json"

# Where the plan goes, relative to the repository root (the config lives in configs/): beside the
# config, above it, below it, and in another tree.
PLACEMENTS = {
    "beside": "configs/p.py",
    "above": "p.py",
    "below": "configs/sub/p.py",
    "other-tree": "../other/plans/p.py",
}
CONFIG_FORMS = {"folder": "configs/my_model", "file": "configs/my_model.json"}
# Where the readers run from: the repository root (where init ran), the config's folder (from where
# a bare sibling name happens to be a path) and a directory unrelated to both.
READER_DIRS = ("repo", "repo/configs", "elsewhere")


def _repository(root: Path) -> Path:
    repo = root / "repo"
    (repo / "configs" / "my_model").mkdir(parents=True)
    (repo / "configs" / "my_model" / "config.json").write_text(LLAMA_CONFIG.read_text())
    (repo / "configs" / "my_model.json").write_text(LLAMA_CONFIG.read_text())
    (root / "elsewhere").mkdir()
    return repo


def _cases():
    for form in CONFIG_FORMS:
        for placement in PLACEMENTS:
            for absolute in (False, True):
                yield pytest.param(form, placement, absolute, id=f"{form}-{placement}-{'abs' if absolute else 'rel'}")


def _recorded(plan: Path) -> str:
    from plangen.check.static import read_plan_metadata

    return read_plan_metadata(plan)["PLANGEN_MODEL"]


@pytest.mark.parametrize("form, placement, absolute", list(_cases()))
def test_a_generated_plan_verifies_and_costs_from_every_directory(tmp_path, monkeypatch, form, placement, absolute):
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo)
    output = (repo / PLACEMENTS[placement]).resolve() if absolute else Path(PLACEMENTS[placement])
    result = CliRunner().invoke(app, ["init", CONFIG_FORMS[form], "-o", str(output)])
    assert result.exit_code == 0, result.output
    plan = (repo / PLACEMENTS[placement]).resolve()

    recorded = _recorded(plan)
    # Always a path, never a bare word a reader could take for a model_type or a hub id.
    assert recorded.startswith(("./", "../")), recorded
    config = (repo / CONFIG_FORMS[form]).resolve()
    assert (plan.parent / recorded).resolve() == config

    for where in READER_DIRS:
        monkeypatch.chdir(tmp_path / where)
        shown = os.path.relpath(plan)
        result = CliRunner().invoke(app, ["verify", shown])
        assert (result.exit_code, result.stdout) == (0, ""), f"verify from {where}: {result.output}"
        assert Path(resolve_recorded_spec(recorded, shown)).resolve() == config
        # Regenerating it from here is recognised as the same model and settings: the same text
        # (left alone) or, where the regeneration command in its header differs, refused only
        # because the file exists.
        result = CliRunner().invoke(app, ["init", os.path.relpath(config), "-o", shown])
        assert "already up to date" in result.output or "already exists" in result.output, result.output


@pytest.mark.parametrize("where", READER_DIRS)
def test_cost_reads_a_sibling_config_from_every_directory(tmp_path, monkeypatch, where):
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo)
    assert CliRunner().invoke(app, ["init", "configs/my_model", "-o", "configs/p.py"]).exit_code == 0
    monkeypatch.chdir(tmp_path / where)
    result = CliRunner().invoke(app, ["cost", os.path.relpath(repo / "configs" / "p.py"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "PG007" not in result.output and "unknown model spec" not in result.output


@pytest.mark.distributed
def test_verify_run_of_a_plan_beside_its_config_from_elsewhere(tmp_path, monkeypatch):
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo)
    assert CliRunner().invoke(app, ["init", "configs/my_model", "-o", "configs/p.py"]).exit_code == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = CliRunner().invoke(app, ["verify", "--run", "../repo/configs/p.py"])
    assert (result.exit_code, result.stdout) == (0, ""), result.output


def test_an_older_file_naming_its_sibling_bare_still_resolves_to_it(tmp_path, monkeypatch):
    repo = _repository(tmp_path)
    monkeypatch.chdir(repo)
    assert CliRunner().invoke(app, ["init", "configs/my_model", "-o", "configs/p.py"]).exit_code == 0
    plan = repo / "configs" / "p.py"
    plan.write_text(plan.read_text().replace('PLANGEN_MODEL = "./my_model"', 'PLANGEN_MODEL = "my_model"'))
    for where in READER_DIRS:
        monkeypatch.chdir(tmp_path / where)
        result = CliRunner().invoke(app, ["verify", os.path.relpath(plan)])
        assert (result.exit_code, result.stdout) == (0, ""), f"verify from {where}: {result.output}"


def test_a_folder_beside_the_plan_wins_over_the_model_type_of_its_name(tmp_path):
    # A folder called "llama" holding a Qwen3 config: the plan's "llama" is that folder, not the type.
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(QWEN3_CONFIG.read_text())
    plan = tmp_path / "p.py"
    for recorded in ("llama", "./llama"):
        spec = resolve_recorded_spec(recorded, plan)
        assert Path(spec) == tmp_path / "llama"
        assert resolve_model(spec).model_class.__name__ == "Qwen3ForCausalLM"
    # Nothing beside the plan: the bare word is the model_type, the class and hub-id forms as given.
    assert resolve_recorded_spec("llama", tmp_path / "elsewhere" / "p.py") == "llama"
    assert resolve_recorded_spec("Qwen3ForCausalLM", plan) == "Qwen3ForCausalLM"


def test_the_recorded_form_of_a_config_path(tmp_path):
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "m.json"
    config.write_text(LLAMA_CONFIG.read_text())
    resolved = resolve_model(str(config))
    assert record_model_spec(resolved, tmp_path / "configs" / "p.py") == "./m.json"
    assert record_model_spec(resolved, tmp_path / "p.py") == "./configs/m.json"
    assert record_model_spec(resolved, tmp_path / "a" / "b" / "p.py") == "../../configs/m.json"
    assert record_model_spec(resolve_model("llama"), tmp_path / "p.py") == "llama"

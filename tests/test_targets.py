"""Issue 31: plans for the runtime they are handed to (``--target``): what each runtime refuses or does
wrong is found at the entry it concerns, and ``plangen init`` writes a plan the target accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.check import VerifyOptions, verify_plan_files
from plangen.check.static import read_plan_metadata
from plangen.commands.cli import app
from plangen.plan.targets import TARGETS

CONFIGS = Path(__file__).parent / "data" / "model-configs"
# The models: dense, tied (Gemma-3-1B: one key/value head), fused, MoE both ways, MLA.
MODELS = {
    "llama": "llama",
    "qwen3": "qwen3",
    "gemma-3-1b": str(CONFIGS / "gemma-3-1b.json"),
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "deepseek_v3": "deepseek_v3",
    "phi3": "phi3",
}
# What each runtime refuses of the plans `plangen init` (target plangen) writes for them at TP 2, as
# measured with NeMo Automodel 0.7.0 itself (DP2 x TP2, gloo; docs/nemo-rl.md): Gemma-3-1B's one
# key/value head under NeMo RL's head checks; under Automodel, Qwen3-MoE and DeepSeek-V3, for which it
# swaps in its own MoE code (a warning: with force_hf=True it takes the plans). Tied embeddings
# never: the files keep the tie with plangen's pair of styles. tests/test_automodel.py holds the
# nemo-rl-v2 row to Automodel itself (its exceptions) wherever it can be installed.
REFUSED_AT_TP2 = {
    "nemo-rl-v2": {"gemma-3-1b": "PG216", "qwen3_moe": "PG217", "deepseek_v3": "PG217"},
    "nemo-rl-v1": {"gemma-3-1b": "PG216"},
}


@pytest.fixture(scope="module")
def plangen_plans(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("plans")
    out = {}
    for name, spec in MODELS.items():
        path = folder / f"{name}_plan.py"
        result = CliRunner().invoke(app, ["init", spec, "-o", str(path), "--tp-size", "2"])
        assert result.exit_code == 0, result.output
        out[name] = path
    return out


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_verify_target_flags_exactly_what_the_runtime_refuses(plangen_plans, target):
    report = verify_plan_files(list(plangen_plans.values()), VerifyOptions(target=target))
    found = {Path(d.path).name.removesuffix("_plan.py"): d.code for d in report.diagnostics}
    assert found == REFUSED_AT_TP2.get(target, {}), report.diagnostics


def test_the_head_finding_sits_on_the_key_value_projection_and_names_the_sizes_accepted(plangen_plans):
    path = plangen_plans["gemma-3-1b"]
    report = verify_plan_files([path], VerifyOptions(target="nemo-rl-v2"))
    (finding,) = report.diagnostics
    line = path.read_text().splitlines()[finding.line - 1]
    assert line[finding.col - 1 :].startswith('"model.layers.*.self_attn.k_proj"'), line
    assert "num_key_value_heads (1) must be divisible by the TP size (2); it accepts TP 1" in finding.message


def test_init_for_a_target_records_it_and_refuses_what_it_refuses(tmp_path):
    runner = CliRunner()
    gemma = str(CONFIGS / "gemma-3-1b.json")
    refused = runner.invoke(app, ["init", gemma, "-o", str(tmp_path / "g.py"), "--target", "nemo-rl-v2"])
    assert refused.exit_code == 2 and not (tmp_path / "g.py").exists()
    assert refused.output.count("\n") == 1 and "it accepts TP 1" in refused.output, refused.output
    ok = runner.invoke(app, ["init", "gemma3_text", "-o", str(tmp_path / "g.py"), "--target", "nemo-rl-v1"])
    assert ok.exit_code == 0, ok.output
    text = (tmp_path / "g.py").read_text()
    assert read_plan_metadata(tmp_path / "g.py")["PLANGEN_TARGET"] == "nemo-rl-v1"
    assert "--target nemo-rl-v1 --force" in text and "Target: nemo-rl-v1" in text
    assert verify_plan_files([tmp_path / "g.py"]).diagnostics == []  # its own target's rules, read from the file
    # The same settings again: left alone; another target is another file's settings.
    assert (
        "already up to date"
        in runner.invoke(app, ["init", "gemma3_text", "-o", str(tmp_path / "g.py"), "--target", "nemo-rl-v1"]).output
    )
    assert runner.invoke(app, ["init", "gemma3_text", "-o", str(tmp_path / "g.py")]).exit_code == 2
    # The default target writes no constant: files made before targets existed stay as they were.
    runner.invoke(app, ["init", "llama", "-o", str(tmp_path / "l.py")])
    assert "PLANGEN_TARGET" not in (tmp_path / "l.py").read_text()


def test_a_split_tie_is_an_error_for_runtimes_that_never_re_tie(tmp_path):
    plan = tmp_path / "tied.py"
    plan.write_text(
        "from torch.distributed.tensor import Replicate\n"
        "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel\n\n"
        'PLANGEN_MODEL = "gemma3_text"\ncustom_parallel_plan = {\n'
        '    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),\n'
        '    "lm_head": ColwiseParallel(output_layouts=Replicate()),\n}\n'
    )
    found = {
        t: [(d.code, d.line, d.col) for d in verify_plan_files([plan], VerifyOptions(target=t)).diagnostics]
        for t in TARGETS
    }
    # NeMo Automodel re-ties after TP (the embedding's weight set on the head), as plangen's runtime does.
    assert found == {"plangen": [], "nemo-rl-v2": [], "nemo-rl-v1": [("PG218", 7, 5)], "torchtitan": [("PG218", 7, 5)]}


def test_init_for_nemo_automodel_says_which_setting_makes_its_moe_plan_apply(tmp_path):
    result = CliRunner().invoke(app, ["init", "qwen3_moe", "-o", str(tmp_path / "m.py"), "--target", "nemo-rl-v2"])
    assert result.exit_code == 0, result.output
    header = " ".join((tmp_path / "m.py").read_text().split('"""')[1].split())
    assert "It swaps in MoE code of its own for Qwen3MoeForCausalLM" in header and "set force_hf=True" in header
    report = verify_plan_files([tmp_path / "m.py"])
    assert {d.code for d in report.diagnostics} == {"PG217"} and not report.failed()
    assert report.failed(strict=True)  # warnings: --strict fails them
    text = (tmp_path / "m.py").read_text().splitlines()
    found = sorted(text[d.line - 1][d.col - 1 :].split(":")[0] for d in report.diagnostics)
    assert found == ['"model.layers.*.mlp"', '"model.layers.*.mlp.experts"'], found  # Automodel's refusal, measured


def test_bad_target_values_are_one_line_usage_errors_or_pg007(tmp_path):
    runner = CliRunner()
    plan = tmp_path / "p.py"
    assert runner.invoke(app, ["init", "llama", "-o", str(plan)]).exit_code == 0
    bad = runner.invoke(app, ["verify", "--target", "nemo", str(plan)])
    assert bad.exit_code == 2 and "--target: 'nemo' is not a target; choose one of plangen, nemo-rl-v2" in bad.output
    assert bad.output.count("\n") == 1
    plan.write_text(plan.read_text().replace("PLANGEN_TP_SIZE = 2", 'PLANGEN_TP_SIZE = 2\nPLANGEN_TARGET = "nemo"'))
    result = runner.invoke(app, ["verify", str(plan)])
    assert result.exit_code == 1 and "PG007" in result.stdout and "PLANGEN_TARGET must be the runtime" in result.stdout


def test_the_docs_table_of_targets_is_the_table_of_the_code():
    from plangen.plan.targets import render_targets_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "nemo-rl.md").read_text()
    start = doc.index("<!-- targets table: plangen.plan.targets.render_targets_table() -->\n")
    end = doc.index("<!-- end of targets table -->")
    assert doc[start:end].split("\n", 1)[1] == render_targets_table()


def test_init_for_nemo_automodel_names_the_setting_that_avoids_its_own_llamas_wrong_gradient(tmp_path):
    """Automodel's own LlamaForCausalLM (its default for Llama) trains the embedding's gradient wrong
    under any plan (tests/test_automodel.py measures it): the file says so and names force_hf; other
    classes' files, and other targets', say nothing of it."""
    headers = {}
    for model, target in (("llama", "nemo-rl-v2"), ("llama", "plangen"), ("qwen3", "nemo-rl-v2")):
        path = tmp_path / f"{model}-{target}.py"
        result = CliRunner().invoke(app, ["init", model, "-o", str(path), "--target", target])
        assert result.exit_code == 0, result.output
        headers[model, target] = " ".join(path.read_text().split('"""')[1].split())
    assert (
        "its own LlamaForCausalLM trains model.embed_tokens.weight with a wrong gradient"
        in headers["llama", "nemo-rl-v2"]
    )
    assert "set force_hf=True" in headers["llama", "nemo-rl-v2"]
    assert not any("wrong gradient" in headers[k] for k in (("llama", "plangen"), ("qwen3", "nemo-rl-v2")))

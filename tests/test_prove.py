"""Issue 27: the supported window, and proofs that follow the installed model code (plangen prove)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.commands.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, app
from plangen.stack import PINNED, SUPPORTED, release

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_bounds_are_the_supported_window():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {re.split(r"[<>=!~]", d, 1)[0]: d for d in project["dependencies"]}
    low, high = SUPPORTED["torch"]
    # No cap below the newest release tested, and none that admits an untested minor release.
    major, minor, _ = release(high)
    assert bounds["torch"] == f"torch>={low.rsplit('.0', 1)[0]},<{major}.{minor + 1}"
    assert bounds["transformers"].startswith(f"transformers>={SUPPORTED['transformers'][0].rsplit('.0', 1)[0]},")
    # The test extra pins no transformers (installing it must not move the user's); the test command does.
    assert not any(d.startswith("transformers") for d in project["optional-dependencies"]["test"])
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    pinned = f"torch=={PINNED['torch']} transformers=={PINNED['transformers']} -e '.[test]'"
    assert pinned in ci and pinned in readme


@pytest.mark.parametrize(
    "versions, inside",
    [
        ({"torch": "2.13.0+cpu", "transformers": "5.24.0"}, True),
        ({"torch": "2.11.0", "transformers": "5.5.4"}, True),
        ({"torch": "2.15.0", "transformers": "5.25.0"}, True),
        ({"torch": "2.10.1", "transformers": "5.8.1"}, False),
        ({"torch": "2.13.0", "transformers": "5.26.0.dev0"}, False),
        ({"torch": "2.13.0", "transformers": "4.57.1"}, False),
    ],
)
def test_doctor_says_whether_the_installed_pair_is_inside_the_window(monkeypatch, versions, inside):
    import plangen.stack as S

    monkeypatch.setattr(S.metadata, "version", lambda package: versions[package])
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == (EXIT_OK if inside else EXIT_FINDINGS), result.output
    lines = result.stdout.splitlines()
    assert lines[1].startswith(f"torch {versions['torch']} (") and lines[2].startswith(
        f"transformers {versions['transformers']} ("
    )
    assert ("OUTSIDE" in result.stdout) is not inside
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout == result.stdout  # --version says the same


def test_prove_refuses_what_names_no_model_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANGEN_PROOFS", str(tmp_path / "proofs.json"))
    result = CliRunner().invoke(app, ["prove", "no-such-model-type"])
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("plangen: error: unknown model spec")
    assert not (tmp_path / "proofs.json").exists()


@pytest.mark.distributed
def test_prove_records_the_sweeps_verdict_for_the_installed_code(tmp_path, monkeypatch):
    """OLMo's synthesized plan, proven here at TP=2 and DP=2 x TP=2 with SP off and on: the same code
    digest and plan fingerprints as the shipped sweep's record, written to the user's file."""
    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.plans.proven import code_digest, load_shipped_proofs

    proofs = tmp_path / "cache" / "proofs.json"
    monkeypatch.setenv("PLANGEN_PROOFS", str(proofs))
    result = CliRunner().invoke(app, ["prove", "olmo", "--format", "json"])
    assert result.exit_code == EXIT_OK, result.output
    shown = json.loads(result.stdout)
    code = code_digest(build_catalog_model(Architecture("OlmoForCausalLM", "olmo")))
    shipped = load_shipped_proofs()["OlmoForCausalLM"][code]
    assert shown["code"] == code and shown["file"] == str(proofs)
    record = shown["record"]
    assert {k: record[k] for k in ("plan", "tp", "sp", "error", "fingerprint")} == {
        k: shipped[k] for k in ("plan", "tp", "sp", "error", "fingerprint")
    }
    stored = json.loads(proofs.read_text())
    assert stored["classes"]["OlmoForCausalLM"][code] == record
    # The runtime's 4 parity runs were announced: TP=2 and DP=2 x TP=2, each with SP off and on.
    assert result.stderr.count("(DP=2 x TP=2, gloo)") == 2 and result.stderr.count("(TP=2, gloo)") == 2

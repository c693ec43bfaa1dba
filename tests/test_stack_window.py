"""Issue 27: plangen right in the stack the user has installed, whatever pair of the window it is.

Marked ``window``: ``.ci/compat`` runs these in a venv per pair of the window (NeMo RL's torch
2.11 + transformers 5.8, the newest torch 2.15 + transformers 5.25) beside the hand-written plans'
parity cases and ``verify --run`` of a representative set; the default run leaves them out (the
pinned pair's own tests cover the same ground there). ``pytest -m window`` runs them anywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plangen.commands.cli import app

pytestmark = pytest.mark.window

ROOT = Path(__file__).resolve().parents[1]


def _regenerate_targets():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from regenerate import targets
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return targets()


def test_init_writes_every_generated_file_and_verify_passes_it(tmp_path, monkeypatch):
    """``plangen init`` of every class with a hand-written plan (TP and SP variants, as
    ``generated/`` holds them for the pinned pair) writes a plan module for the installed model code,
    and ``plangen verify`` (levels 1 and 2: syntax, the plan against the model, its styles applied on a
    fake process group) finds nothing in any of them. A class the installed transformers lacks, or a
    file the installed stack cannot run whatever the plan (tests/conftest.py: stack_cannot_run), is
    left out, never failed."""
    import transformers
    from conftest import stack_cannot_run

    monkeypatch.chdir(tmp_path)
    written, absent = [], []
    for target in _regenerate_targets():
        if not hasattr(transformers, target.class_name) or stack_cannot_run(target.output.name):
            absent.append(target.output.name)
            continue
        args = ["init", target.spec, "-o", target.output.name, "--tp-size", "2"]
        result = CliRunner().invoke(app, [*args, *(["--sequence-parallel"] if target.sequence_parallel else [])])
        assert result.exit_code == 0, f"plangen {' '.join(args)}: {result.output}"
        written.append(target.output.name)
    assert len(written) >= 40, (written, absent)
    result = CliRunner().invoke(app, ["verify", "--format", "json", *written])
    findings = json.loads(result.stdout) if result.stdout.strip() else []
    assert (result.exit_code, findings) == (0, []), result.output


def test_shipped_proofs_made_on_this_transformers_match_its_code():
    """A proof shipped for the installed transformers release was made on its model code: the
    installed code's digest is the record's (``plangen list`` says ``this code`` for every such
    class). Where no shipped proof was made on this release, the runtime refuses synthesized plans
    with ``plangen prove`` in the message (tests/test_prove.py); this test says so and skips."""
    import transformers

    from plangen.plans.proven import PROVEN_HERE, load_shipped_proofs

    installed = transformers.__version__
    made_here = sorted(
        cls
        for cls, codes in load_shipped_proofs().items()
        if any(installed in record.get("transformers", ()) for record in codes.values())
    )
    if not made_here:
        pytest.skip(
            f"no shipped proof was made on transformers {installed}: scripts/sweep_plans.py in this stack makes them"
        )
    result = CliRunner().invoke(app, ["list", "--format", "json", *made_here])
    assert result.exit_code == 0, result.output
    rows = {row["class_name"]: row for row in json.loads(result.stdout)["architectures"]}
    not_here = {cls: rows[cls]["proof"] for cls in made_here if cls in rows and rows[cls]["proof"] != PROVEN_HERE}
    assert not not_here, f"proofs made on transformers {installed} whose digest is not the installed code's: {not_here}"
    assert not set(made_here) - set(rows), sorted(set(made_here) - set(rows))

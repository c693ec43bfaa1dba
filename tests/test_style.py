"""The tree is formatted by ``ruff format`` and passes ``ruff check`` (pyproject.toml's settings: one line
length, a small rule set): layout is the formatter's, not each author's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")  # the test extra's, in this venv
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings the pinned one)")
    return [found]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "check"])
def test_the_tree_is_as_ruff_leaves_it(command):
    result = subprocess.run([*_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]

"""The command line starts fast and never drags torch in for --help or --version."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import child_cpu_seconds
from plangen import __version__


def run(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = child_cpu_seconds()  # CPU time: other work on the machine does not stretch it
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    return proc, child_cpu_seconds() - start


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_answer_in_well_under_a_second_without_torch(flag):
    floor = min(run("-c", "pass")[1] for _ in range(3))
    code = f"import sys; sys.argv = ['plangen', '{flag}']\ntry:\n    import plangen.commands.cli as c; c.main()\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    proc, elapsed = min((run("-c", code) for _ in range(3)), key=lambda r: r[1])
    assert proc.stdout.strip().endswith("False"), "torch imported for " + flag
    assert elapsed - floor < 0.5, f"plangen {flag} took {elapsed - floor:.2f} s beyond interpreter start"


def test_python_dash_m_plangen_prints_the_version():
    proc, _ = run("-m", "plangen", "--version")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0] == f"plangen {__version__}"
    # Then the installed torch and transformers against the tested window (plangen.stack).
    assert [line.split()[0] for line in lines[1:]] == ["torch", "transformers"] and all(
        "tested window" in line for line in lines[1:]
    )

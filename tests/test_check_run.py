"""Level 3 of ``plangen verify`` (``--run``): each plan applied for real on CPU (PG3xx).

One ``verify --run`` covers every committed generated plan and every level-3 example, through the
CLI in its own process (started in the background when collection ends: conftest's ``LAUNCH``):
every generated plan passes all three levels at its TP size, each wrong example yields exactly its
code at its line and column (the PG303 one kills a rank, and the run goes on past it), each right
example nothing, and progress is reported as the run goes. A rank that hangs ends the run within
the time limit.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BackgroundCommand, launched, slow_unless, stack_can_run
from plangen.check import VerifyOptions, verify_plan_files
from plangen.check.codes import CODES

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
GENERATED = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "generated").glob("*_plan.py"))
# The default run's level 3 of generated files: one per layout kind (dense with SP, tied Conv1D, fused
# projections, whole-projection norms, one KV head, MoE, latent attention, flat experts, Mamba2 hybrid,
# shared hybrid block, multimodal text tower, float64 RWKV). The parity launches run every plan these
# files' templates render (tests/test_parallelize_distributed.py); the rest are marked slow.
GENERATED_DEFAULT = {f"generated/{name}_plan.py" for name in (
    "llama_sp", "gpt2", "phi3_sp", "olmo2_sp", "gemma3_text_sp", "qwen3_moe_sp", "deepseek_v3_sp", "dbrx",
    "nemotron_h_sp", "zamba2_sp", "llava_sp", "rwkv")}
LEVEL3_CODES = sorted(code for code in CODES if code > "PG300")

# Where each wrong example's finding is: (line, col).
WRONG_AT = {"PG301": (12, 5), "PG302": (8, 5), "PG303": (9, 24)}


CUSTOM_STYLE_PLAN = """\
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel


class CheckedColwise(ColwiseParallel):
    def _apply(self, module, device_mesh):
        raise RuntimeError("refusing to shard " + type(module).__name__)


PLANGEN_MODEL = "llama"
custom_parallel_plan = {
    "lm_head": CheckedColwise(output_layouts=Replicate()),
}
"""


def _write_examples(folder: Path, generated: list[str]) -> tuple[list[str], dict[tuple[str, str], str]]:
    """Every level-3 example (and two more) as a file under ``folder``: (paths in order, path by kind)."""
    examples: dict[tuple[str, str], str] = {}
    for code in LEVEL3_CODES:
        for kind in ("wrong", "right"):
            path = folder / f"{code.lower()}_{kind}.py"
            path.write_text(getattr(CODES[code], kind))
            examples[code, kind] = str(path)
    # A plan at TP=4: its shapes are checked on a fake process group of 4.
    at_tp4 = folder / "qwen3_sp_tp4_plan.py"
    at_tp4.write_text((ROOT / "generated" / "qwen3_sp_plan.py").read_text().replace("PLANGEN_TP_SIZE = 2", "PLANGEN_TP_SIZE = 4"))
    examples["tp4", "right"] = str(at_tp4)
    # A style of the user's own that level 2 cannot judge from its facts, and that fails when applied:
    # level 2's own run on a fake process group finds it (PG215), so it never reaches level 3.
    custom = folder / "custom_style_plan.py"
    custom.write_text(CUSTOM_STYLE_PLAN)
    examples["custom", "wrong"] = str(custom)
    # The rank-killing example first: the files after it are still checked.
    order = [examples["PG303", "wrong"], *generated, *(p for k, p in examples.items() if k != ("PG303", "wrong"))]
    return order, examples


_EXAMPLES: dict = {}  # the folder and the example paths, for the fixture that reads the run


def LAUNCH(items):
    """One ``plangen verify --run`` of everything, as a CI job runs it (the CLI, from the repository
    root: generated plans by their relative paths), started in the background at collection."""
    if not any(item.module is sys.modules[__name__] and "verified" in item.fixturenames for item in items):
        return []
    folder = tempfile.TemporaryDirectory(prefix="plangen-level3-")
    selected = {item.callspec.params["path"] for item in items
                if item.module is sys.modules[__name__] and item.originalname == "test_generated_plan_passes_all_three_levels"
                and not item.get_closest_marker("skip")}
    generated = [path for path in GENERATED if path in selected]
    order, examples = _write_examples(Path(folder.name), generated)
    _EXAMPLES.update(folder=folder, examples=examples, generated=generated)
    argv = [sys.executable, "-m", "plangen", "verify", "--run", "--timeout", "400", "--format", "json", *order]
    # The time limit allows for sharing the cores with the other tests and launches meanwhile.
    return functools.partial(BackgroundCommand, argv, ROOT, 1500)


@pytest.fixture(scope="module")
def verified(request):
    """The run's (exit code, findings by path, stderr, example paths)."""
    exit_code, stdout, stderr = launched(request)
    findings: dict[str, list[tuple[str, int, int]]] = {}
    for entry in json.loads(stdout):
        findings.setdefault(entry["path"], []).append((entry["code"], entry["line"], entry["col"]))
    return exit_code, findings, stderr, _EXAMPLES["examples"]


def test_exit_status_is_1_for_the_findings(verified):
    exit_code, findings, stderr, examples = verified
    assert exit_code == 1, stderr
    notes = [line for line in stderr.splitlines() if line.startswith("plangen: note:")]
    # Nothing skipped, nothing cut short: the notes say the examples record no TP size, and that the
    # custom style level 2 found failing is not run.
    stopped = f"plangen: note: {examples['custom', 'wrong']}: not run (--run): fix its findings against the model first"
    assert stopped in notes
    others = [line for line in notes if line != stopped]
    assert all(line.endswith("no --tp-size and no PLANGEN_TP_SIZE: checked at TP size 2") for line in others), notes


def test_the_default_runs_generated_files_are_generated_files():
    assert GENERATED_DEFAULT <= set(GENERATED), GENERATED_DEFAULT - set(GENERATED)


@pytest.mark.parametrize("path", stack_can_run(slow_unless(GENERATED, GENERATED_DEFAULT)))
def test_generated_plan_passes_all_three_levels(verified, path):
    _, findings, stderr, _ = verified
    assert findings.get(path) is None, findings.get(path)
    assert f"{path} (TP=2, gloo)" in stderr  # it reached the parity stage


@pytest.mark.parametrize("code", LEVEL3_CODES)
def test_wrong_example_has_exactly_its_code_there(verified, code):
    _, findings, _, examples = verified
    assert findings[examples[code, "wrong"]] == [(code, *WRONG_AT[code])]


@pytest.mark.parametrize("code", LEVEL3_CODES)
def test_right_example_is_clean(verified, code):
    _, findings, stderr, examples = verified
    assert examples[code, "right"] not in findings
    assert f"{examples[code, 'right']} (TP=2, gloo)" in stderr


def test_shapes_are_checked_at_the_plans_own_tp_size(verified):
    _, findings, stderr, examples = verified
    assert examples["tp4", "right"] not in findings
    assert f"{examples['tp4', 'right']} (TP=4, fake process group)" in stderr
    assert f"{examples['tp4', 'right']} (TP=2, gloo)" in stderr


def test_a_style_that_fails_to_apply_is_found_on_its_key_at_level_2(verified):
    _, findings, stderr, examples = verified
    assert findings[examples["custom", "wrong"]] == [("PG215", 12, 5)]
    assert f"{examples['custom', 'wrong']} (TP=2, fake process group)" not in stderr  # level 3 never ran it


def test_progress_names_each_stage_and_case(verified):
    _, _, stderr, _ = verified
    lines = [line for line in stderr.splitlines() if line.startswith("plangen: verify --run: ")]
    total = len(_EXAMPLES["generated"]) + 2 * len(LEVEL3_CODES) + 1  # the failing custom style stops at level 2
    assert lines[0].endswith(f"shapes: {total} plan(s) on a fake process group at their own TP size")
    assert any(line.startswith(f"plangen: verify --run: [shapes {total}/{total}] ") for line in lines)
    # PG301's wrong example stops at the shapes stage.
    assert any(f"parity: {total - 1} plan(s) at TP=2" in line for line in lines)


def test_hung_rank_ends_the_run_within_the_time_limit(tmp_path):
    # Hangs in the worker of the shapes stage only (the check against the model imports it too).
    hang = 'if "check_shapes_worker" in " ".join(sys.argv):\n    time.sleep(600)\n'
    source = CODES["PG303"].right.replace('PLANGEN_MODEL = "llama"\n', f'PLANGEN_MODEL = "llama"\nimport sys, time\n{hang}')
    plan = tmp_path / "hangs.py"
    plan.write_text(source)
    timeout = 8
    start = time.monotonic()
    report = verify_plan_files([plan], VerifyOptions(run=True, timeout=timeout))
    elapsed = time.monotonic() - start
    plan_line = next(i for i, line in enumerate(source.splitlines(), 1) if line.startswith("custom_parallel_plan"))
    assert [(d.code, d.line) for d in report.diagnostics] == [("PG303", plan_line)]
    message = report.diagnostics[0].message
    assert "no result within the time limit (--timeout)" in message and "or the run needs longer (raise --timeout)" in message
    # The limit bounds the work; starting the worker interpreter (slower on a busy machine) comes on top.
    assert elapsed < timeout + 40, elapsed

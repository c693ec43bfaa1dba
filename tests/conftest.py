from __future__ import annotations

import fcntl
import functools
import os
import re
import resource
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # tiny_configs, custom_plans

DATA = TESTS / "data"


def child_cpu_seconds() -> float:
    """CPU seconds this process's finished children used: a duration other work on the machine does
    not stretch (the timed tests run beside distributed launches; wall time measured the load)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="session")
def fake_pg():
    """A single-process fake process group: TP at any size for shapes and collective counts."""
    import torch.distributed as dist

    from plangen.distributed.fake_group import FAKE_WORLD_SIZE, scatters_give_each_rank_its_chunk

    # The same group the code under test makes and leaves running (plangen.distributed.fake_group), with its
    # scatters giving each rank its chunk on every torch (the gloo parity cases check the real thing).
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=FAKE_WORLD_SIZE)
    scatters_give_each_rank_its_chunk()
    yield


def cases_read_by(items, module, cases: dict[str, list[dict]], needs=None) -> dict[str, list[dict]]:
    """The cases (by mesh) that ``module``'s selected tests (among ``items``) read, for a launch that
    runs those only, known before any of them runs.

    A launch runs many cases (a launch costs seconds, a case a fraction of one), but the default
    run deselects the ``slow`` ones (and ``-k`` may deselect more): a test names the case it reads
    by its ``case_id`` parameter ("mesh/name"), or ``needs(test_name, params)`` names them."""
    wanted: set[str] = set()
    for item in items:
        if item.module is not module or item.get_closest_marker("skip"):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case_id" in params:
            wanted.add(params["case_id"])
        if needs is not None:
            wanted |= set(needs(item.originalname, params))
    return {mesh: [c for c in group if f"{mesh}/{c['name']}" in wanted] for mesh, group in cases.items()}


# --- launches in the background ------------------------------------------------------------------
# Most tests run in this one process on one core; the big multi-process runs would leave the other
# idle for as long (or, run from a test, block this one). A module that defines ``LAUNCH(items)``
# has its run started when collection ends, and runs last (its tests wait for it): the runs and the
# other tests share the two cores instead of taking turns. ``LAUNCH`` returns the arguments of
# ``plangen.distributed.launch.start_distributed`` (target, world_size, payload, timeout), a list of them (the
# module's ``launched`` is then the list of their results), or a callable taking ``nice`` that starts
# any other run and returns what has ``result()`` and ``kill()`` (``BackgroundCommand``).
_STARTED: dict = {}  # module name -> what _start returned
_NICE = 10  # the tests in this process keep a core; the runs take the other and any idle time


def _launching(item) -> bool:
    return callable(getattr(item.module, "LAUNCH", None))


def _xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def pytest_configure(config):
    # Two workers on two cores: torch's intra-op pool of two threads in each would spin against the
    # other's (measured: test_comm_counts 135 CPU-s alone, 261 beside test_cost). Launched ranks
    # set their own (plangen.distributed.launch); one thread each here.
    if _xdist_worker():
        import torch

        torch.set_num_threads(1)


def _order(item) -> int:
    # Modules marked QUIET measure what other work on the machine shifts (gloo timing against a
    # byte-for-byte memory trace): they run last. In one process the launching modules run just
    # before them (their runs started in the background at collection); with xdist's workers
    # (pyproject's addopts: one file per worker at a time) they run first: each launch is a
    # module's long pole, and it runs while the other worker takes the other files.
    if getattr(item.module, "QUIET", False):
        return 2
    if _xdist_worker():
        return 0 if _launching(item) else 1
    return int(_launching(item))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_order)  # stable: each module's tests stay together, in their order


def _start(spec):
    from plangen.distributed.launch import start_distributed

    if isinstance(spec, list):
        return [_start(one) for one in spec]
    return spec(nice=_NICE) if callable(spec) else start_distributed(*spec, nice=_NICE)


def _result(started):
    return [_result(one) for one in started] if isinstance(started, list) else started.result()


def _kill(started) -> None:
    for one in started if isinstance(started, list) else [started]:
        one.kill()


def pytest_collection_finish(session):
    # An xdist worker collects every file but runs the files the scheduler hands it, known only
    # then: its launches start when their module's first test asks (``launched``).
    if session.config.option.collectonly or _xdist_worker():
        return
    for module in dict.fromkeys(item.module for item in session.items if _launching(item)):
        _STARTED[module.__name__] = _start(module.LAUNCH(session.items))


def launched(request):
    """The result of this module's ``LAUNCH``: the run started at collection, else one run now."""
    started = _STARTED.pop(request.module.__name__, None)
    return _result(started if started is not None else _start(request.module.LAUNCH(request.session.items)))


def pytest_sessionfinish(session):
    for started in _STARTED.values():  # never waited for (deselected at run time, or -x stopped first)
        _kill(started)
    _STARTED.clear()


# --- a quiet machine for the QUIET modules ---------------------------------------------------------
# Under xdist the other worker keeps running tests (and launches) beside a QUIET module's
# measurement: each test holds a shared lock on one file per run, the measurement an exclusive
# one, so the other worker finishes its test and waits for the measurement to end.
def _run_lock_path(config) -> Path:
    run = getattr(config, "workerinput", {}).get("testrunuid", "single")
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"plangen-tests-{run}.lock"


@contextmanager
def _locked(config, mode: int):
    with open(_run_lock_path(config), "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _shares_the_machine(request):
    if not _xdist_worker() or getattr(request.module, "QUIET", False):
        yield
        return
    with _locked(request.config, fcntl.LOCK_SH):
        yield


@contextmanager
def quiet_machine(config):
    """Nothing else of this test run runs meanwhile (under xdist: the other worker waits)."""
    if not _xdist_worker():
        yield
        return
    with _locked(config, fcntl.LOCK_EX):
        yield


class BackgroundCommand:
    """A command run in the background (a CLI as a CI job runs it), its output kept in files:
    ``result()`` waits and gives (exit code, stdout, stderr)."""

    def __init__(self, argv: list[str], cwd: Path, timeout: float, *, nice: int = 0) -> None:
        import subprocess
        import tempfile
        import time

        from plangen.distributed.launch import lower_priority

        self.argv, self._deadline = argv, time.monotonic() + timeout
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=self._out,
            stderr=self._err,
            text=True,
            start_new_session=True,
            preexec_fn=(lambda: lower_priority(nice)) if nice else None,
        )

    def result(self) -> tuple[int, str, str]:
        import subprocess
        import time

        try:
            self._proc.wait(timeout=max(self._deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{' '.join(self.argv[:4])} ...: no result in time; killed") from None
        outputs = []
        for stream in (self._out, self._err):
            stream.seek(0)
            outputs.append(stream.read())
            stream.close()
        return self._proc.returncode, *outputs

    def kill(self) -> None:
        import os
        import signal

        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


def slow_unless(ids, default) -> list:
    """``ids`` as parameters, those not in ``default`` marked ``slow`` (out of the default run)."""
    return [i if i in default else pytest.param(i, marks=pytest.mark.slow) for i in ids]


# Cases the installed stack cannot run, whatever the plan, each with its reason (checked against the
# installed torch or transformers itself, so the pinned pair skips none of them):
# - model code that flattens a sequence-sharded DTensor ([B, S, H] viewed as [B·S, H]: Gemma 4 and
#   Llama 4 and OPT under SP), which torch before 2.13 refuses (plangen.stack.torch_compat.FLATTENS_SHARDED_DIM);
# - DBRX where transformers' own DBRX does not run (5.8: its config cannot be rebuilt from its own
#   to_dict, "Found unknown kwargs", and its router takes ffn_hidden_size inputs).
FLATTEN_NEEDED = re.compile(r"(gemma4|llama4|^opt|/opt).*(-sp|_sp)", re.IGNORECASE)
FLATTEN_REASON = (
    "torch < 2.13 refuses to flatten a sequence-sharded DTensor, which this model's own code does "
    "under SP (plangen.stack.torch_compat.FLATTENS_SHARDED_DIM)"
)


def _dbrx_runs() -> bool:
    from transformers import DbrxConfig

    try:
        DbrxConfig.from_dict(DbrxConfig().to_dict())
    except (TypeError, ValueError):
        return False
    return True


def stack_cannot_run(case_id: str) -> str | None:
    """Why the installed torch or transformers cannot run case ``case_id`` (an id or a file name), else None."""
    from plangen.stack.torch_compat import FLATTENS_SHARDED_DIM

    if not FLATTENS_SHARDED_DIM and FLATTEN_NEEDED.search(case_id):
        return FLATTEN_REASON
    # A test config's or a generated file's NemotronH has MLP layers; the bare model type is the
    # installed default config, which has none where the installed NemotronH cannot have them.
    if "nemotron_h" in case_id.lower() and case_id != "nemotron_h" and (why := nemotron_h_lacks_mlp_layers()):
        return why
    if "dbrx" in case_id.lower() and not _dbrx_runs():
        import transformers

        return (
            f"transformers {transformers.__version__}'s DBRX does not run: DbrxConfig cannot be rebuilt from its "
            "own to_dict (unknown kwargs) and DbrxRouter takes ffn_hidden_size inputs"
        )
    return None


@functools.lru_cache(maxsize=None)
def nemotron_h_lacks_mlp_layers() -> str | None:
    """Why the installed NemotronH cannot have the MLP layers of the tests' configs and of the default
    config the generated files were made for (5.24.0's), else None: 5.5.x's has only mamba,
    attention and moe layers (its config refuses the kind, its modeling has no MLP mixer)."""
    import transformers
    from transformers import NemotronHConfig

    from plangen.stack.transformers_compat import installed_layer_kinds

    try:
        NemotronHConfig(layers_block_type=installed_layer_kinds(NemotronHConfig, ["mlp", "full_attention"]))
    except Exception:  # noqa: BLE001 - a strict dataclass's validation error wraps the ValueError
        return f"transformers {transformers.__version__}'s NemotronH has no MLP layers (its config refuses the kind)"
    return None


def stack_can_run(params: list) -> list:
    """``params`` (ids or ``pytest.param``s of case ids), those the installed stack cannot run skipped."""
    out = []
    for p in params:
        value, marks = (p.values[0], list(p.marks)) if hasattr(p, "values") else (p, [])
        why = stack_cannot_run(value) if isinstance(value, str) else None
        out.append(pytest.param(value, marks=[*marks, pytest.mark.skip(reason=why)]) if why else p)
    return out


def differs_from_pinned_model_code(model: "object") -> str | None:
    """Why ``model``'s class code is not the pinned transformers' (plangen.stack.PINNED), else None:
    a test reading what the synthesizer recognises in one class's code (and how) reads that code.
    Another release's code is checked by its own proof (plangen/plans/proven.json, the sweep per pair)
    and how much of it the synthesizer shards is ``plangen list``'s there."""
    from plangen.plans.proven import code_digest, load_shipped_proofs
    from plangen.stack import PINNED

    name = type(model).__name__
    pinned = {
        code for code, r in load_shipped_proofs().get(name, {}).items() if PINNED["transformers"] in r["transformers"]
    }
    if not pinned or code_digest(model) in pinned:
        return None
    import transformers

    return (
        f"reads transformers {PINNED['transformers']}'s {name} code; {transformers.__version__}'s differs "
        "(its own proof is in plangen/plans/proven.json)"
    )


def skip_unless_pinned_model_code(model: "object") -> None:
    """Skip the test where ``model``'s class code is not the pinned transformers' (above)."""
    why = differs_from_pinned_model_code(model)
    if why:
        pytest.skip(why)


def skip_unless_pinned_model_type(model_type: str) -> None:
    """:func:`skip_unless_pinned_model_code` for the class ``plangen.model.resolve`` builds for ``model_type``
    (on the meta device: no memory), where the test builds its model from a config of its own."""
    from plangen.model.resolve import build_meta_model, resolve_model

    resolved = resolve_model(model_type)
    skip_unless_pinned_model_code(build_meta_model(resolved.config, resolved.model_class))


def _pinned_release_only():
    import transformers

    from plangen.stack import PINNED

    return pytest.mark.skipif(
        transformers.__version__ != PINNED["transformers"],
        reason=f"a goal of the catalog measured on the pinned transformers {PINNED['transformers']} (its classes, their "
        "code, the files generated from it); other releases' coverage: docs/compat.md, the sweep per pair",
    )


# For tests of what the whole catalog reaches on the pinned release (every class at the sharding goal,
# the generated files, the sweep's lists): the classes and their code are that release's.
pinned_release_only = _pinned_release_only()


def set_proofs(monkeypatch, records: dict) -> dict:
    """Replace the sweep's records by ``{class name: record}``, each holding for whatever model code
    asks (plangen.plans.proven keys them by code digest): tests of the choice set a class's verdict.
    Returns ``records``, which the test may change afterwards."""
    import plangen.plans.proven as P

    monkeypatch.setattr(P, "proof_for", lambda class_name, code: records.get(class_name))
    monkeypatch.setattr(P, "load_proven", lambda: {name: {"any code": r} for name, r in records.items()})
    return records


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure that is only the installed transformers lacking a model or internal the test names
    (tests/absent.py checks it against that transformers) is reported as a skip with the reason."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        from absent import absent_from_transformers

        why = absent_from_transformers(call.excinfo.value)
        if why:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {why}")


def falcon_attention_left_whole(model=None) -> str | None:
    """Why the installed Falcon's attention is left whole by the synthesized plan, else None (read off
    the plan for ``model``, default the tiny multi-query Falcon). Every release of the window has its
    multi-query and grouped forms read (5.25.0 rewrote them: plangen.stack.transformers_compat), so
    this answers None there; it stays the guard of the tests of that split, which hold where it is read."""
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    if model is None:
        from tiny_configs import build_tiny

        model = build_tiny("falcon-mqa")
    if any("self_attention" in e.pattern for e in build_synthesized_plan(model, False).entries):
        return None
    import transformers

    return (
        f"transformers {transformers.__version__}'s Falcon attention is not read by plangen's synthesizer: its plan "
        "keeps that attention whole (plangen/stack/transformers_compat.py)"
    )

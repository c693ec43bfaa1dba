from __future__ import annotations

import resource
import sys
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

    from plangen.cost.measure import FAKE_WORLD_SIZE

    # The same group the code under test makes and leaves running (plangen.cost.measure).
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=FAKE_WORLD_SIZE)
    yield


def cases_read_by(items, module, cases: dict[str, list[dict]], needs=None) -> dict[str, list[dict]]:
    """The cases (by mesh) that ``module``'s selected tests (among ``items``) read, for a launch that
    runs those only, known before any of them runs.

    A launch runs many cases (a launch costs seconds, a case a fraction of one), but the default
    run deselects the ``slow`` ones (and ``-k`` may deselect more): a test names the case it reads
    by its ``case_id`` parameter ("mesh/name"), or ``needs(test_name, params)`` names them."""
    wanted: set[str] = set()
    for item in items:
        if item.module is not module:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case_id" in params:
            wanted.add(params["case_id"])
        if needs is not None:
            wanted |= set(needs(item.originalname, params))
    return {mesh: [c for c in group if f"{mesh}/{c['name']}" in wanted] for mesh, group in cases.items()}


# --- launches in the background ------------------------------------------------------------------
# Most tests run in this one process on one core; the big four-rank launches would leave the
# other idle for as long. A module that defines ``LAUNCH(items) -> (target, world_size, payload,
# timeout)`` has its launch started when collection ends, and runs last (its tests wait for it):
# the launch and the other tests share the two cores instead of taking turns.
_STARTED: dict = {}  # module name -> plangen.launch.Launch


def _launching(item) -> bool:
    return callable(getattr(item.module, "LAUNCH", None))


def _order(item) -> int:
    # Modules marked QUIET measure what other work on the machine shifts (gloo timing against a
    # byte-for-byte memory trace): they run after the launching modules, once the launches ended.
    return 2 if getattr(item.module, "QUIET", False) else int(_launching(item))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_order)  # stable: each module's tests stay together, in their order


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    from plangen.launch import start_distributed

    for module in dict.fromkeys(item.module for item in session.items if _launching(item)):
        # Niced: the tests in this process keep a core; the ranks take the other and any idle time.
        _STARTED[module.__name__] = start_distributed(*module.LAUNCH(session.items), nice=10)


def launched(request) -> list:
    """The result of this module's ``LAUNCH``: the run started at collection, else one run now."""
    from plangen.launch import run_distributed

    started = _STARTED.pop(request.module.__name__, None)
    return started.result() if started is not None else run_distributed(*request.module.LAUNCH(request.session.items))


def pytest_sessionfinish(session):
    for launch in _STARTED.values():  # never waited for (deselected at run time, or -x stopped first)
        launch.kill()
    _STARTED.clear()


def slow_unless(ids, default) -> list:
    """``ids`` as parameters, those not in ``default`` marked ``slow`` (out of the default run)."""
    return [i if i in default else pytest.param(i, marks=pytest.mark.slow) for i in ids]

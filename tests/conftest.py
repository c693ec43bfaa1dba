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


def selected_cases(request, cases: dict[str, list[dict]], needs=None) -> dict[str, list[dict]]:
    """The cases (by mesh) that this module's selected tests read, for a launch that runs those only.

    A launch runs many cases (a launch costs seconds, a case a fraction of one), but the default
    run deselects the ``slow`` ones (and ``-k`` may deselect more): a test names the case it reads
    by its ``case_id`` parameter ("mesh/name"), or ``needs(test_name, params)`` names them."""
    wanted: set[str] = set()
    for item in request.session.items:
        if item.module is not request.module:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case_id" in params:
            wanted.add(params["case_id"])
        if needs is not None:
            wanted |= set(needs(item.originalname, params))
    return {mesh: [c for c in group if f"{mesh}/{c['name']}" in wanted] for mesh, group in cases.items()}


def slow_unless(ids, default) -> list:
    """``ids`` as parameters, those not in ``default`` marked ``slow`` (out of the default run)."""
    return [i if i in default else pytest.param(i, marks=pytest.mark.slow) for i in ids]

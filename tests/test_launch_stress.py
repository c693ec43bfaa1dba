"""The synthesized-plans launch run again and again: no rank may die of a signal (issue 35).

A heap corruption in a rank shows up rarely (a rank of that launch killed by SIGABRT, "malloc():
unaligned tcache chunk detected", or SIGSEGV inside gloo's worker thread; about one launch in
fourteen under load on two cores), so one launch proves nothing: this runs the default run's case
list (the same payload tests/test_synthesized_distributed.py launches) ``PLANGEN_STRESS_LAUNCHES``
times, one after the other, and fails on the first rank killed by a signal, quoting its Python
stacks (plangen.launch's fault report). Slow (about 3 minutes a launch here), so it runs only when
asked for, even with ``-m "slow or not slow"``:

    PLANGEN_STRESS_LAUNCHES=50 .venv/bin/pytest -q -n 0 -m slow tests/test_launch_stress.py
"""

from __future__ import annotations

import os

import pytest

LAUNCHES = int(os.environ.get("PLANGEN_STRESS_LAUNCHES", "0"))


def default_payload() -> dict[str, list[dict]]:
    """The cases the default run of tests/test_synthesized_distributed.py launches (what its LAUNCH
    reads from the selected tests: the default case ids, the default tower and state-dict cases, and
    the negative controls, which run by default at DP 2 x TP 2)."""
    import test_synthesized_distributed as synthesized

    wanted = set(synthesized.DEFAULT_IDS)
    wanted |= {f"dp2tp2/{t}" for t in synthesized.TOWERS_DEFAULT}
    wanted |= {synthesized._state_dict_case(t) for t in synthesized.STATE_DICT_DEFAULT}
    wanted |= {f"dp2tp2/{control['name']}" for control in synthesized.CONTROLS}
    return {mesh: [c for c in cases if f"{mesh}/{c['name']}" in wanted] for mesh, cases in synthesized.CASES.items()}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not LAUNCHES, reason="set PLANGEN_STRESS_LAUNCHES=50 (hours: a launch takes minutes)")
def test_the_synthesized_plans_launch_never_loses_a_rank_to_a_signal():
    from plangen.launch import DistributedRunError, run_distributed

    payload = default_payload()
    target, world_size = "tests/distributed/cases.py:run_cases", 4
    for launch in range(LAUNCHES):
        try:
            results = run_distributed(target, world_size, payload, timeout=1500)
        except DistributedRunError as err:
            if "was killed by signal" in str(err):
                pytest.fail(f"launch {launch + 1} of {LAUNCHES}: {err}")
            raise
        errors = {key: r["error"] for key, r in results[0].items() if "error" in r}
        assert not errors, f"launch {launch + 1}: {errors}"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not LAUNCHES, reason="set PLANGEN_STRESS_LAUNCHES=20 (minutes each)")
def test_torch_alone_async_functional_collectives_on_gloo_never_lose_a_rank():
    """The same corruption without plangen (tests/distributed/funcol_stress.py): whether torch's
    gloo path alone does it, on this torch, is what this tells apart from plangen's styles."""
    from plangen.launch import DistributedRunError, run_distributed

    for launch in range(LAUNCHES):
        try:
            run_distributed("tests/distributed/funcol_stress.py:main", 4, {"iters": 20_000}, timeout=1200)
        except DistributedRunError as err:
            pytest.fail(f"launch {launch + 1} of {LAUNCHES}: {err}")

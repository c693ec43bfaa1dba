"""The synthesized-plans launch run again and again: no rank may die of a signal (issue 35).

A heap corruption in a rank shows up rarely (a rank of that launch killed by SIGABRT, "malloc():
unaligned tcache chunk detected", or SIGSEGV inside gloo's worker thread; about one launch in
fourteen under load on two cores, before plangen.distributed.launch gave each gloo group one worker thread:
torch's two race on the group's status string, plangen.distributed.launch.gloo_worker_threads), so one launch
proves nothing: this runs the default run's case
list (the same payload tests/test_synthesized_distributed.py launches) ``PLANGEN_STRESS_LAUNCHES``
times, one after the other, and fails on the first rank killed by a signal, quoting its Python
stacks (plangen.distributed.launch's fault report). Slow (about a minute a launch alone on 2 cores,
three under a full test run), so it runs only when asked for, even with ``-m "slow or not slow"``; each
test its own count (docs/testing.md: 50 launches passed in 49 minutes at 019e4eb):

    PLANGEN_STRESS_LAUNCHES=50 .venv/bin/pytest -q -n 0 -m slow tests/test_launch_stress.py -k synthesized
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
@pytest.mark.skipif(not LAUNCHES, reason="set PLANGEN_STRESS_LAUNCHES=50 (about 50 minutes: a launch takes about one)")
def test_the_synthesized_plans_launch_never_loses_a_rank_to_a_signal():
    from plangen.distributed.launch import DistributedRunError, run_distributed

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
    """The same corruption without plangen (tests/distributed/funcol_stress.py), launched as
    plangen launches (one gloo worker thread a group): torch alone, on gloo, loses no rank either."""
    from plangen.distributed.launch import DistributedRunError, run_distributed

    for launch in range(LAUNCHES):
        try:
            run_distributed("tests/distributed/funcol_stress.py:main", 4, {"iters": 20_000}, timeout=1200)
        except DistributedRunError as err:
            pytest.fail(f"launch {launch + 1} of {LAUNCHES}: {err}")


def _address_sanitizer() -> str | None:
    """LD_PRELOAD for AddressSanitizer in an uninstrumented Python: libasan first, libstdc++ with it
    (without it libasan finds no __cxa_throw to wrap and stops the rank at torch's first C++ throw)."""
    import ctypes.util

    asan, cxx = ctypes.util.find_library("asan"), ctypes.util.find_library("stdc++")
    return f"{asan}:{cxx}" if asan and cxx else None


def _sanitized_launches(monkeypatch, tmp_path, gloo_threads: int, launches: int) -> list[str]:
    """funcol_stress under AddressSanitizer (20 000 iterations a launch), up to ``launches`` times;
    the reports of the first launch that has any. Uninstrumented torch is checked where its bytes
    pass libc (memcpy, read...) and freed memory waits in quarantine: a write into freed memory by
    memcpy is reported at the write, with who freed it, long before glibc would notice."""
    from plangen.distributed.launch import DistributedRunError, run_distributed

    monkeypatch.setenv("LD_PRELOAD", _address_sanitizer())
    for launch in range(launches):
        logs = tmp_path / f"launch{launch}"
        logs.mkdir()
        monkeypatch.setenv("ASAN_OPTIONS", f"detect_leaks=0:halt_on_error=1:log_path={logs}/asan")
        try:
            run_distributed(
                "tests/distributed/funcol_stress.py:main", 4, {"iters": 20_000}, timeout=1500, gloo_threads=gloo_threads
            )
        except DistributedRunError:
            pass  # a sanitized rank that reports exits at once; its peers fail after it
        reports = [path.read_text() for path in sorted(logs.glob("asan.*"))]
        if reports:
            return reports
    return []


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not LAUNCHES, reason="set PLANGEN_STRESS_LAUNCHES=6 (2 to 4 minutes each, sanitized)")
@pytest.mark.skipif(not _address_sanitizer(), reason="no libasan to preload")
def test_torchs_two_gloo_workers_write_a_status_string_one_of_them_freed(monkeypatch, tmp_path):
    """Issue 35's cause in torch (2.11 to 2.15): with torch's two worker threads a gloo group, one
    frees the group's status string while the other copies a collective's name into it, in
    ProcessGroupGloo::runLoop. Measured at 5 000 iterations a launch: 3 launches in 9 on 2.13, 1 in 5
    on 2.15; on 2.11, 0 in 5 with this mix, 2 in 6 with all_reduce_coalesced's long name in it too.
    When a torch fixes it, this fails: plangen.distributed.launch's one worker thread a group can then go."""
    reports = _sanitized_launches(monkeypatch, tmp_path, gloo_threads=2, launches=LAUNCHES)
    assert reports, f"no AddressSanitizer report in {LAUNCHES} launches with two gloo workers a group"
    report = reports[0]
    # Seen each time: "heap-use-after-free ... WRITE of size 9" ("ALLREDUCE") in runLoop, into a
    # 20-byte chunk ("ALLGATHER_COALESCED") freed by the other worker in runLoop. Two long names
    # at once would free one buffer twice: a double-free there says the same.
    assert "heap-use-after-free" in report or "double-free" in report, report[:3000]
    access, _, freed = report.partition("freed by thread")
    assert "ProcessGroupGloo::runLoop" in access, report[:3000]
    assert "ProcessGroupGloo::runLoop" in freed.split("allocated by")[0], report[:3000]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not LAUNCHES, reason="set PLANGEN_STRESS_LAUNCHES=6 (2 to 4 minutes each, sanitized)")
@pytest.mark.skipif(not _address_sanitizer(), reason="no libasan to preload")
def test_one_gloo_worker_a_group_leaves_nothing_for_the_sanitizer_to_report(monkeypatch, tmp_path):
    """The same launches as plangen launches (plangen.distributed.launch: one gloo worker thread a group): no
    AddressSanitizer report at all."""
    reports = _sanitized_launches(monkeypatch, tmp_path, gloo_threads=1, launches=LAUNCHES)
    assert not reports, reports[0][:3000]

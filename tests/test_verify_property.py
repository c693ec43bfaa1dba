"""``plangen verify`` levels 1+2 say "clean" exactly when the plan runs right (tests/verify_property.py).

Cases drawn by hypothesis (deterministically): small Llama, Qwen3 and Gemma 3 configs, the plan
``plangen init`` writes for each, one edit of it. Each is verified in this process and run for real
over gloo against the unsharded model (one launch for TP 1 and 2, one for TP 4, started in the
background when collection ends: conftest's ``LAUNCH``). The default run takes all of them (240)
and checks that the measured matrix is the one recorded in plangen/check/confusion.json
(docs/diagnostics.md renders it).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

import verify_property as vp
from conftest import launched
from plangen.check.codes import CONFUSION_PATH

_JUDGED = "test_verify_is_clean_exactly_when_the_run_is_right_over_the_recorded_cases"
_PREPARED: dict = {}  # the cases with their files written, once per session


def _prepared() -> list[dict]:
    if not _PREPARED:
        folder = tempfile.TemporaryDirectory(prefix="plangen-verify-property-")
        cases = vp.draw_cases(vp.FULL_COUNT)[:: vp.SUBSET_STEP]
        vp.prepare_cases(cases, Path(folder.name))
        # The time limit allows for sharing the cores with the other tests and launches meanwhile.
        _PREPARED.update(folder=folder, cases=cases, launches=vp.truth_launches(cases, timeout=1500))
    return _PREPARED["cases"]


def LAUNCH(items) -> list:
    module = sys.modules[__name__]
    if not any(item.module is module and item.originalname == _JUDGED for item in items):
        return []
    _prepared()
    return _PREPARED["launches"]


def _recorded() -> dict:
    return json.loads(CONFUSION_PATH.read_text())


def test_cases_are_drawn_the_same_every_time_and_cover_every_kind():
    cases = vp.draw_cases(vp.FULL_COUNT)
    assert len(cases) == vp.FULL_COUNT >= 200
    assert cases == vp.draw_cases(vp.FULL_COUNT)  # derandomized, no database
    subset = cases[:: vp.SUBSET_STEP]
    assert len(subset) >= 200
    for chosen in (cases, subset):
        assert set(Counter(c["edit"]["kind"] for c in chosen)) == set(vp.EDIT_KINDS)
        assert set(Counter(c["config"]["model_type"] for c in chosen)) == set(vp.FAMILIES)
        assert {c["edit"].get("tp_size", vp.BASE_TP) for c in chosen} == set(vp.TP_SIZES)
        assert {c["config"]["tie_word_embeddings"] for c in chosen} == {True, False}


def _check(cases: list[dict]) -> None:
    wrong = vp.false_cleans(cases)
    assert not wrong, "verify says clean, the run is wrong:\n" + "\n".join(vp.describe(c) for c in wrong)
    unedited = [c for c in cases if c["edit"]["kind"] == "none"]
    assert unedited and all(not c["codes"] and c["problem"] is None for c in unedited), "init's own plans"


@pytest.mark.distributed
def test_verify_is_clean_exactly_when_the_run_is_right_over_the_recorded_cases(request):
    results = launched(request)
    cases = vp.judge_prepared(_prepared(), vp.truth_from(_PREPARED["launches"], results))
    _check(cases)
    assert len(cases) >= 200
    import transformers

    from plangen.stack import PINNED

    if transformers.__version__ == PINNED["transformers"]:
        # The recorded matrix is the pinned release's model code's; elsewhere the property above is the check.
        assert vp.build_record(cases) == _recorded(), f"re-run {vp.COMMAND} and regenerate docs/diagnostics.md"

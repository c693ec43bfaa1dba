"""``plangen verify`` levels 1+2 say "clean" exactly when the plan runs right (tests/verify_property.py).

Cases drawn by hypothesis (deterministically): small Llama, Qwen3 and Gemma 3 configs, the plan
``plangen init`` writes for each, one edit of it. Each is verified in this process and run for real
over gloo against the unsharded model (one launch for TP 1 and 2, one for TP 4). The default run
takes all of them (240, about 80 s on a quiet machine) and checks that the measured matrix is the
one recorded in plangen/check/confusion.json (docs/diagnostics.md renders it).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

import verify_property as vp
from plangen.check.codes import CONFUSION_PATH



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
def test_verify_is_clean_exactly_when_the_run_is_right_over_the_recorded_cases(tmp_path):
    cases = vp.judge_cases(vp.draw_cases(vp.FULL_COUNT)[:: vp.SUBSET_STEP], tmp_path)
    _check(cases)
    assert len(cases) >= 200
    assert vp.build_record(cases) == _recorded(), f"re-run {vp.COMMAND} and regenerate docs/diagnostics.md"

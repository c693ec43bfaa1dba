"""Measure how far `plangen verify`'s "clean" can be trusted; record it in plangen/check/confusion.json.

The verify property of tests/verify_property.py over its full set of cases (the slow test's): each
generated, edited plan checked by levels 1+2 and run for real (DP=1 x TP over gloo against the
unsharded model). The counts, per edit kind, of clean/flagged x right/wrong, with every false
"clean" and every false alarm named, go to plangen/check/confusion.json, which
``python -m plangen.check.codes > docs/diagnostics.md`` renders into the diagnostics doc.

    .venv/bin/python scripts/confusion_matrix.py            # measure and write (a few minutes on 2 cores)
    .venv/bin/python scripts/confusion_matrix.py --count 40 # a quick look; writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

OUTPUT = ROOT / "plangen" / "check" / "confusion.json"


def main(argv: list[str] | None = None) -> int:
    import verify_property as vp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help=f"cases (default {vp.FULL_COUNT}, the slow test's; another count writes nothing)",
    )
    args = parser.parse_args(argv)
    count = args.count or vp.FULL_COUNT
    start = time.monotonic()
    cases = vp.draw_cases(count)
    with tempfile.TemporaryDirectory(prefix="plangen-confusion-") as tmp:
        vp.judge_cases(cases, Path(tmp))
    record = vp.build_record(cases)
    for case in cases:
        if (not case["codes"]) != (case["problem"] is None):
            print(vp.describe(case), file=sys.stderr)
    print(json.dumps(record["matrix"]["all"]), f"{time.monotonic() - start:.0f} s", file=sys.stderr)
    if count == vp.FULL_COUNT:
        OUTPUT.write_text(json.dumps(record, indent=1) + "\n")
        print(
            f"wrote {OUTPUT.relative_to(ROOT)}; now: .venv/bin/python -m plangen.check.codes > docs/diagnostics.md",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

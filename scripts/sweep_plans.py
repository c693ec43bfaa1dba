"""Prove plans numerically, class by class; write plangen/plans/proven.json and docs/plans.md.

For every causal-LM class transformers registers (and the multimodal classes with hand-written
plans) this picks the plan to check - the hand-written one, else the synthesized one, else the
Hugging Face one - and runs the test suite's parity check on it (tests/distributed/cases.py: tiny
random model, TP=2 and DP=2 x TP=2, with and without sequence parallelism where the plan has it;
logits, loss, every gradient, gradient norms and three AdamW steps within 1e-5 in fp32). Classes
whose synthesized plan fails get their Hugging Face plan checked too: that is what the runtime
then uses.

    .venv/bin/python scripts/sweep_plans.py                   # everything (many minutes on 2 cores)
    .venv/bin/python scripts/sweep_plans.py --only olmo,phi   # some model types or classes; the other records stay
    .venv/bin/python scripts/sweep_plans.py --docs-only       # rewrite docs/plans.md from proven.json

docs/plans.md describes the pinned pair (plangen.stack.PINNED, the test extra's torch and
transformers): in another stack the sweep adds its records to proven.json and leaves the docs alone
(what a class gets, its note and its TP-sharded share are read from the installed model code), and
``--docs-only`` there is an error.

Records are kept per model code (plangen/plans/proven.py's code digest, with the transformers and
torch releases they ran on): a sweep in another stack (a venv with another transformers) adds that
code's records and keeps every other's; code that did not change shares one record.

Several classes share one launch (a launch costs seconds, a case a fraction of one); a launch that
crashes or passes its deadline is retried class by class, so one bad class cannot hide the others.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plangen.check.run import FLOAT64_CHECKS  # classes checked in float64, and why

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
PROVEN = ROOT / "plangen" / "plans" / "proven.json"
DOCS = ROOT / "docs" / "plans.md"
TARGET = f"{ROOT / 'tests' / 'distributed' / 'cases.py'}:run_cases"
MESHES = ("tp2", "dp2tp2")
# Adam's eps: see train_steps in tests/distributed/cases.py (rounding noise on zero gradients).
ADAM_EPS = 1e-6
COMMAND = ".venv/bin/python scripts/sweep_plans.py"


@dataclass
class Target:
    class_name: str
    spec: str  # what plangen.model.resolve.resolve_model builds the class from
    plan: str  # "hand-written" | "synthesized" | "hf"
    sequence_parallel: bool
    result: dict[str, Any] = field(default_factory=dict)
    # plangen.plans.proven.plan_fingerprint of the plans checked (synthesized: built here, on the
    # catalog's model, as plangen list builds them; the workers build the same on the same config).
    fingerprint: dict[str, str] | None = None
    code: str = ""  # plangen.plans.proven.code_digest of the installed model code: what the proof holds for


def build_fingerprints(model: Any, sequence_parallel: bool) -> dict[str, str]:
    from plangen.plans.proven import plan_fingerprint
    from plangen.plans.synthesis.synthesize import build_synthesized_plan

    kinds = {"tp": False, "sp": True} if sequence_parallel else {"tp": False}
    return {key: plan_fingerprint(build_synthesized_plan(model, sp)) for key, sp in kinds.items()}


def find_targets(only: set[str] | None) -> tuple[list[Target], dict[str, str]]:
    """The plan to check for each class, and why the classes without one have none."""
    from plangen.commands.catalog import build_catalog_model, list_architectures
    from plangen.plans.hf_plan import build_hf_plan
    from plangen.model.resolve import resolve_model
    from plangen.plans import HAND_WRITTEN
    from plangen.plans.synthesis.analysis import analyze_model
    from plangen.plans.proven import code_digest

    targets: list[Target] = []
    skipped: dict[str, str] = {}
    for arch in list_architectures():
        if only is not None and not {arch.class_name, arch.model_type, *arch.aliases} & only:
            continue
        try:
            model = build_catalog_model(arch)
            spec = (
                arch.model_type
                if resolve_model(arch.model_type).model_class.__name__ == arch.class_name
                else arch.class_name
            )
        except Exception as err:  # noqa: BLE001 - default configs fail in many ways
            skipped[arch.class_name] = (
                f"default config does not build: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
            )
            continue
        if arch.class_name in HAND_WRITTEN:
            try:
                HAND_WRITTEN[arch.class_name](model, True)
                sp = True
            except ValueError:
                sp = False
            targets.append(Target(arch.class_name, spec, "hand-written", sp, code=code_digest(model)))
            continue
        analysis = analyze_model(model)
        if analysis.synthesizable:
            target = Target(arch.class_name, spec, "synthesized", analysis.sequence_parallel, code=code_digest(model))
            target.fingerprint = build_fingerprints(model, analysis.sequence_parallel)
            targets.append(target)
            continue
        try:
            build_hf_plan(model)
        except ValueError as err:
            skipped[arch.class_name] = (
                f"no synthesized plan ({analysis.problem}) and no usable Hugging Face plan ({err})"
            )
            continue
        targets.append(Target(arch.class_name, spec, "hf", False, code=code_digest(model)))
    return targets, skipped


def build_cases(target: Target, plan: str) -> list[dict[str, Any]]:
    cases = []
    for sp in (False, True) if target.sequence_parallel and plan != "hf" else (False,):
        case = {
            "name": f"{target.class_name}/{plan}{'/sp' if sp else ''}",
            "model_type": target.spec,
            "sp": sp,
            "adam_eps": ADAM_EPS,
        }
        if target.class_name in FLOAT64_CHECKS:
            case["dtype"] = "float64"
        if plan != "hand-written":
            case["plan_kind"] = plan
        cases.append(case)
    return cases


# A rank whose peer failed first reports only that the connection closed: not the cause.
_ECHO = "Connection closed by peer"


def run_batch(cases: list[dict[str, Any]], timeout: float, meshes: tuple[str, ...] = MESHES) -> dict[str, str | None]:
    """Case name -> None (passed on every rank and mesh) or the most telling problem."""
    from cases import case_problem

    from plangen.distributed.launch import run_distributed

    per_rank = run_distributed(TARGET, 4, {mesh: cases for mesh in meshes}, timeout=timeout)
    verdicts: dict[str, str | None] = {}
    for case in cases:
        problems = [
            f"{mesh} rank {rank}: {found}"
            for mesh in meshes
            for rank, results in enumerate(per_rank)
            if (found := case_problem(results[f"{mesh}/{case['name']}"])) is not None
        ]
        verdicts[case["name"]] = next((p for p in problems if _ECHO not in p), problems[0] if problems else None)
    return verdicts


def run_alone(cases: list[dict[str, Any]], timeout: float) -> dict[str, str | None]:
    """Each case on each mesh in a launch of its own: a rank-local failure then ends the launch
    (its peers see the connection close) instead of leaving the peers waiting in a collective."""
    from plangen.distributed.launch import DistributedRunError

    verdicts: dict[str, str | None] = {}
    for case in cases:
        problem = None
        for mesh in MESHES:
            try:
                found = run_batch([case], timeout, (mesh,))[case["name"]]
            except DistributedRunError as err:
                found = f"{mesh}: launch failed: {' '.join(str(err).split())[-300:]}"
            problem = problem or found
        verdicts[case["name"]] = problem
    return verdicts


def run_targets(
    targets: list[Target], plan_of: dict[str, str], batch: int, timeout: float
) -> dict[str, dict[str, str | None]]:
    """Per class: case name -> verdict. A launch that crashes or passes its deadline is retried one
    class at a time, and a class that does so again one case at a time.

    A case that fails on some ranks only leaves the others waiting in a collective until the
    launch's deadline: keep batches small so that costs little, and retry with half of it.
    """
    from plangen.distributed.launch import DistributedRunError

    verdicts: dict[str, dict[str, str | None]] = {}
    for start in range(0, len(targets), batch):
        group = targets[start : start + batch]
        began = time.monotonic()
        try:
            found = run_batch([c for t in group for c in build_cases(t, plan_of[t.class_name])], timeout)
            for t in group:
                verdicts[t.class_name] = {c["name"]: found[c["name"]] for c in build_cases(t, plan_of[t.class_name])}
        except DistributedRunError:
            for t in group:
                cases = build_cases(t, plan_of[t.class_name])
                try:
                    verdicts[t.class_name] = run_batch(cases, timeout / 2)
                except DistributedRunError:
                    verdicts[t.class_name] = run_alone(cases, timeout / 2)
        names = ", ".join(t.class_name for t in group)
        print(f"  [{start + len(group)}/{len(targets)}] {time.monotonic() - began:5.1f} s  {names}", flush=True)
    return verdicts


def record_of(target: Target, plan: str, verdicts: dict[str, str | None]) -> dict[str, Any]:
    tp = verdicts.get(f"{target.class_name}/{plan}")
    sp = verdicts.get(f"{target.class_name}/{plan}/sp") if target.sequence_parallel and plan != "hf" else None
    has_sp = target.sequence_parallel and plan != "hf"
    errors = [f"{k}: {v}" for k, v in (("tp", tp), ("sp", sp)) if v]
    record = {
        "plan": plan,
        "tp": tp is None,
        "sp": (sp is None) if has_sp else None,
        "error": "; ".join(errors)[:500] or None,
    }
    if plan == "synthesized" and target.fingerprint:
        record["fingerprint"] = target.fingerprint
    return record


def sweep(only: set[str] | None, batch: int, timeout: float) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per class: (the code digest it ran on, its record)."""
    targets, skipped = find_targets(only)
    print(f"plangen sweep: {len(targets)} classes to check, {len(skipped)} without a plan to check", flush=True)
    plan_of = {t.class_name: t.plan for t in targets}
    verdicts = run_targets(targets, plan_of, batch, timeout)
    records = {t.class_name: record_of(t, t.plan, verdicts[t.class_name]) for t in targets}
    # What the runtime falls back to where the synthesized plan failed: check that too.
    fallback = [t for t in targets if t.plan == "synthesized" and not records[t.class_name]["tp"] and _has_hf_plan(t)]
    if fallback:
        print(f"plangen sweep: checking the Hugging Face plan of {len(fallback)} classes", flush=True)
        hf_verdicts = run_targets(fallback, {t.class_name: "hf" for t in fallback}, batch, timeout)
        for t in fallback:
            hf = record_of(t, "hf", hf_verdicts[t.class_name])
            records[t.class_name]["hf"] = {k: hf[k] for k in ("tp", "error")}
    return {t.class_name: (t.code, records[t.class_name]) for t in targets}


def _has_hf_plan(target: Target) -> bool:
    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.plans.hf_plan import build_hf_plan

    try:
        build_hf_plan(build_catalog_model(Architecture(target.class_name, target.spec)))
    except Exception:  # noqa: BLE001
        return False
    return True


def write_proven(records: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Add this stack's records to proven.json, keeping every other code's (other transformers
    releases' sweeps): a record for the same code is replaced, and where its verdict is unchanged it
    keeps the releases it was proven on too (code that did not change shares one record)."""
    from plangen.plans.proven import read_proofs_file, render_proofs_file
    from plangen.stack import recorded_stack

    merged = read_proofs_file(PROVEN.read_text()) if PROVEN.exists() else {}
    stack = recorded_stack()
    for class_name, (code, record) in records.items():
        old = merged.setdefault(class_name, {}).get(code) or {}
        same = all(old.get(k) == record.get(k) for k in ("plan", "tp", "sp", "fingerprint"))
        for package, version in stack.items():
            kept = old.get(package, []) if same else []
            record[package] = sorted(set(kept) | {version}, key=lambda v: [int(x) for x in v.split(".") if x.isdigit()])
        merged[class_name][code] = record
    PROVEN.write_text(render_proofs_file(merged))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_docs(seconds: float | None) -> None:
    import torch
    import transformers

    from plangen.commands.catalog import (
        FRACTION_TP_SIZE,
        WELL_SHARDED,
        WHOLE_PARTS_LISTED,
        WHOLE_PARTS_MOST,
        build_catalog,
        render_fraction,
    )
    from plangen.plans.proven import load_shipped_proofs

    load_shipped_proofs.cache_clear()
    rows = build_catalog()
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.plan] = counts.get(row.plan, 0) + 1
    well = sum(1 for row in rows if row.plan != "none" and row.sharded_fraction >= WELL_SHARDED)
    if seconds is None and DOCS.exists():  # a partial run: keep what the last full sweep took
        last = re.search(r"The last full sweep took \d+ minutes on 2 CPU cores\.", DOCS.read_text())
        took = f" {last.group(0)}" if last else ""
    else:
        took = f" The last full sweep took {seconds / 60:.0f} minutes on 2 CPU cores." if seconds else ""
    lines = [
        "# Plans by architecture",
        "",
        "The plan each causal-LM class gets at TP > 1 without a custom plan (`plangen list` prints the same",
        "table for the installed transformers): `hand-written` (plangen/plans/dense.py, hybrid.py),",
        "`synthesized` from the module tree (plangen/plans/synthesis/synthesize.py) where the numerical check proved it,",
        "else `hf` (the model's own Hugging Face plan, translated), else `none` (TP > 1 is an error that",
        "points to `plangen init`). *SP*: sequence parallelism available. *Check*: the numerical check of",
        "that plan: a tiny random model at TP=2 and DP=2 x TP=2 (SP off and on) against the unsharded model,",
        "logits, loss, every gradient, gradient norm and parameters after three AdamW steps within 1e-5;",
        "`stale`: the synthesizer now builds another plan than the one proven (its fingerprint in",
        "proven.json), so the class needs sweeping again (the test suite fails until it is).",
        "*TP-sharded*: the share of the parameters (by elements) the plan shards over TP at the class's",
        "default size, measured on the meta device at TP=2 (the rest stays whole on every TP rank).",
        "",
        f"Last sweep: {datetime.date.today().isoformat()}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}.{took} Refresh with `{COMMAND}`",
        "(it rewrites plangen/plans/proven.json, which the runtime reads, and this file).",
        "",
        "Summary: "
        + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("hand-written", "synthesized", "hf", "none"))
        + f"; {well} shard at least {WELL_SHARDED:.0%} of their parameters over TP.",
        "",
        "| class | model_type | plan | SP | check | TP-sharded | note |",
        "| --- | --- | --- | --- | --- | ---: | --- |",
    ]
    for row in rows:
        sp = "yes" if row.sequence_parallel else "no"
        lines.append(
            f"| {row.class_name} | {row.model_type} | {row.plan} | {sp} | {row.check} | {render_fraction(row)} | {_cell(row.note)} |"
        )
    lines += [
        "",
        "## What each plan leaves whole",
        "",
        f"The largest parts (at least {WHOLE_PARTS_LISTED:.2%} of the model, {WHOLE_PARTS_MOST} at most) each plan keeps whole on every TP rank",
        f"at the class's default size and TP={FRACTION_TP_SIZE}, with the reason the plan gives: routers, norms, what",
        "cannot split. `other`: parameters no entry of the plan names (plain norms, biases). `plangen cost`",
        "gives the same per rank at any size.",
        "",
        "| class | plan | TP-sharded | left whole |",
        "| --- | --- | ---: | --- |",
    ]
    for row in rows:
        if row.plan != "none":
            lines.append(f"| {row.class_name} | {row.plan} | {render_fraction(row)} | {_cell(row.left_whole) or '-'} |")
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text("\n".join(lines) + "\n")


def docs_stack_mismatch() -> str | None:
    """Why docs/plans.md must not be written from the installed stack; None on the pinned pair."""
    from plangen.stack import PINNED, recorded_stack

    installed = recorded_stack()
    if all(installed[package] == version for package, version in PINNED.items()):
        return None
    pinned, here = (", ".join(f"{package} {stack[package]}" for package in PINNED) for stack in (PINNED, installed))
    return f"{DOCS.relative_to(ROOT)} describes the pinned pair ({pinned}), not {here}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types or class names (other records are kept)")
    parser.add_argument("--batch", type=int, default=4, help="classes per launch (default 4)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per launch (default 150)")
    parser.add_argument("--docs-only", action="store_true", help="only rewrite docs/plans.md from proven.json")
    args = parser.parse_args(argv)
    mismatch = docs_stack_mismatch()
    if args.docs_only and mismatch:
        print(f"plangen sweep: error: {mismatch}: run --docs-only in the pinned pair's venv", file=sys.stderr)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()
    seconds = None
    if not args.docs_only:
        only = set(args.only.split(",")) if args.only else None
        began = time.monotonic()
        records = sweep(only, args.batch, args.timeout)
        write_proven(records)
        seconds = time.monotonic() - began if only is None else None
        passed = sum(1 for _, r in records.values() if r["tp"])
        print(
            f"plangen sweep: {passed}/{len(records)} classes passed in {time.monotonic() - began:.0f} s; wrote {PROVEN.relative_to(ROOT)}"
        )
    if mismatch:
        print(f"plangen sweep: left {DOCS.relative_to(ROOT)} alone: {mismatch}")
        return 0
    write_docs(seconds)
    print(f"plangen sweep: wrote {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``plangen prove``: prove the plan plangen picks for a class on the model code installed here.

The shipped proofs (``plangen/plans/proven.json``) hold for the transformers releases the sweep ran
on; a class whose modeling code differs here (another release, a patched file) has no proof, so
the runtime refuses its synthesized plan and warns about a hand-written one. This runs the check
for that one class, here, and records the verdict in the user's proofs file
(:func:`plangen.plans.proven.user_proofs_path`), which the runtime reads beside the shipped ones.

The check is ``plangen verify --run``'s (:mod:`plangen.check.run`) on the plan the runtime would
choose, rendered as ``plangen init`` writes it: a tiny random model of the class, every forward and
backward shape on a fake process group, then logits and every parameter gradient against the
unsharded model within 1e-5, at TP=2 and at DP=2 x TP=2 (FSDP2), with sequence parallelism off and,
where the plan has it, on. (The shipped sweep also compares three AdamW steps and the gradient
norm; ``scripts/sweep_plans.py`` runs that from a checkout.)

Nothing here prints: :func:`prove_class` returns a :class:`Proof` the CLI renders.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PROVE_DP_SIZES = (1, 2)  # the parity meshes: TP=2, then DP=2 x TP=2


class ProveError(ValueError):
    """The class cannot be proven here (no such model, no plan to prove); one line."""


@dataclass(frozen=True)
class Proof:
    class_name: str
    code: str  # plangen.plans.proven.code_digest of the installed code
    record: dict[str, Any]  # as proven.json holds it
    path: Path  # the proofs file it was written to
    findings: tuple[str, ...]  # what failed, one line each (empty: proven)

    @property
    def passed(self) -> bool:
        return self.record.get("tp") is True and self.record.get("sp") is not False


def prove_class(spec: str, timeout: float = 600.0, progress: Callable[[str], None] | None = None) -> Proof:
    """Prove the plan the runtime picks for ``spec`` (a model_type, class, config) on this code."""
    import warnings

    from plangen.commands.catalog import Architecture, build_catalog_model
    from plangen.check.run import RunTarget, check_run
    from plangen.commands.init import load_model, render_plan_module
    from plangen.output.errors import InitError
    from plangen.plans.choice import NoPlanError, UnprovenCodeWarning, choose_plan
    from plangen.plans.proven import code_digest, plan_fingerprint
    from plangen.stack import recorded_stack

    try:
        loaded = load_model(spec)
    except InitError as error:
        raise ProveError(str(error)) from None
    class_name = loaded.resolved.model_class.__name__
    # The model the sweep proves on (the catalog's), so the record compares with its proofs.
    catalog_model = build_catalog_model(Architecture(class_name, loaded.resolved.spec))
    code = code_digest(catalog_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnprovenCodeWarning)  # the point of proving it
        try:
            chosen = choose_plan(catalog_model, False, allow_unproven=True)
        except NoPlanError as error:
            raise ProveError(f"{class_name} has no plan to prove: {error}") from None
        try:
            with_sp = choose_plan(catalog_model, True, allow_unproven=True).source == chosen.source
        except ValueError:
            with_sp = False

    findings: dict[bool, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="plangen-prove-") as tmp:
        targets = []
        for sp in (False, True) if with_sp else (False,):
            text = render_plan_module(spec, Path(tmp) / "plan.py", sequence_parallel=sp, loaded=loaded).text
            for dp in PROVE_DP_SIZES:
                path = Path(tmp) / f"plan_{'sp' if sp else 'tp'}_dp{dp}.py"
                path.write_text(text)
                targets.append(RunTarget(str(path), spec, 2, sp, dp_size=dp))
        outcome = check_run(targets, timeout, progress)
        for target in targets:
            found = [
                f"{target.parity_mesh()}{', SP' if target.sequence_parallel else ''}: {f.message}"
                for f in outcome.findings[target.path]
            ]
            found += [
                note.replace(target.path, target.parity_mesh())
                for note in outcome.notes
                if note.startswith(target.path)
            ]
            findings.setdefault(target.sequence_parallel, []).extend(found)

    record: dict[str, Any] = {
        "plan": chosen.source,
        "tp": not findings[False],
        "sp": (not findings[True]) if with_sp else None,
        "error": "; ".join(findings[False] + findings.get(True, []))[:500] or None,
    }
    if chosen.source == "synthesized":
        from plangen.plans.synthesis.synthesize import build_synthesized_plan

        sps = (False, True) if with_sp else (False,)
        record["fingerprint"] = {
            "sp" if sp else "tp": plan_fingerprint(build_synthesized_plan(catalog_model, sp)) for sp in sps
        }
    record.update({key: [value] for key, value in recorded_stack().items()})
    path = record_user_proof(class_name, code, record)
    return Proof(class_name, code, record, path, tuple(findings[False] + findings.get(True, [])))


def record_user_proof(class_name: str, code: str, record: dict[str, Any]) -> Path:
    """Add ``record`` to the user's proofs file, atomically (a crash leaves the old file whole)."""
    from plangen.plans.proven import read_proofs_file, render_proofs_file, user_proofs_path

    path = user_proofs_path()
    try:
        proofs = read_proofs_file(path.read_text())
    except (OSError, ValueError):
        proofs = {}
    proofs.setdefault(class_name, {})[code] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(render_proofs_file(proofs))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def render_proof(proof: Proof) -> str:
    """What ``plangen prove`` prints on stdout."""
    record = proof.record
    sp = {True: "passed", False: "FAILED", None: "no SP variant"}[record["sp"]]
    verdict = "proven" if proof.passed else "NOT proven"
    lines = [
        f"{proof.class_name}: the {record['plan']} plan {verdict} on this model code ({proof.code}, "
        f"transformers {record['transformers'][0]}, torch {record['torch'][0]}): TP=2 and DP=2 x TP=2 "
        f"{'passed' if record['tp'] else 'FAILED'}, sequence parallel {sp}",
        *(f"  {line}" for line in proof.findings),
        f"recorded in {proof.path}",
    ]
    return "\n".join(lines) + "\n"


def proof_json(proof: Proof) -> str:
    return (
        json.dumps(
            {"class": proof.class_name, "code": proof.code, "record": proof.record, "file": str(proof.path)}, indent=2
        )
        + "\n"
    )

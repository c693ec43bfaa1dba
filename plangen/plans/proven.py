"""Which plans were proven equal to the unsharded model, and on which model code (``proven.json``).

A proof holds for the code it ran on, not for a class name: transformers releases change a model's
forward under the same name (gpt-oss's experts, Falcon's attention), and a plan proven on one
release can train wrongly on another. So every record is keyed by the class name and then by
:func:`code_digest`, a digest of the modeling source the model's modules run, and names the
transformers and torch versions it was proven with (a class whose code did not change between
releases shares one record)::

    {"format": 2, "classes": {"LlamaForCausalLM": {"<code digest>": {
        "plan": "synthesized", "tp": true, "sp": false, "error": "sp: ...",
        "fingerprint": {"tp": "..."}, "transformers": ["5.24.0"], "torch": ["2.13.0"]}}}}

``scripts/sweep_plans.py`` writes the shipped records (tiny random model, TP=2 and DP=2 x TP=2,
logits, loss, every gradient, gradient norm and three AdamW steps within 1e-5); ``plangen prove``
writes a user's own into :func:`user_proofs_path` (``$PLANGEN_PROOFS``, else the user's cache
directory), which is read beside the shipped file and wins where both prove the same code.

``plan`` is the kind of plan checked (``hand-written``, ``synthesized`` or ``hf``); ``tp`` and ``sp``
whether it passed without and with sequence parallelism (``null``: that variant does not exist).
A synthesized record also carries ``fingerprint``: :func:`plan_fingerprint` of the TP and SP plans
it proved, built on the catalog's shrunk model (the sweep's): a change of the synthesizer that
moves a proven plan shows as ``stale`` in ``plangen list`` (and fails the test suite) until the
class is swept again.
A synthesized plan that failed may carry an ``hf`` record: the check of the Hugging Face plan the
runtime falls back to. The runtime trusts a synthesized or Hugging Face plan only where
:func:`is_proven` / :func:`hf_check` say so for the installed code.
"""

from __future__ import annotations

import json
import os
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from plangen.plan import Plan

PROVEN_FILE = "proven.json"
SWEEP_COMMAND = "scripts/sweep_plans.py"  # what proves plans and writes the records (from the repository root)


PROOFS_FORMAT = 2
PROOFS_ENV = "PLANGEN_PROOFS"  # a file of the user's own proofs (plangen prove), instead of the cache's
PROVE_COMMAND = "plangen prove"

# What a class's proofs say about the installed code (plangen list's "proof" column).
PROVEN_HERE = "this code"
PROVEN_ELSEWHERE = "other code only"
NEVER_PROVEN = "never"


def user_proofs_path() -> Path:
    """Where ``plangen prove`` records proofs: ``$PLANGEN_PROOFS``, else the user's cache directory."""
    given = os.environ.get(PROOFS_ENV)
    if given:
        return Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "plangen" / PROVEN_FILE


def read_proofs_file(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The records of one proofs file by class and code digest (empty for anything else)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != PROOFS_FORMAT or not isinstance(data.get("classes"), dict):
        return {}
    return {
        cls: {code: record for code, record in codes.items() if isinstance(record, dict)}
        for cls, codes in data["classes"].items()
        if isinstance(codes, dict)
    }


def render_proofs_file(proofs: Mapping[str, Mapping[str, dict[str, Any]]]) -> str:
    classes = {cls: dict(sorted(codes.items())) for cls, codes in sorted(proofs.items()) if codes}
    return json.dumps({"format": PROOFS_FORMAT, "classes": classes}, indent=1) + "\n"


@lru_cache(maxsize=1)
def load_shipped_proofs() -> dict[str, dict[str, dict[str, Any]]]:
    try:
        return read_proofs_file(resources.files("plangen.plans").joinpath(PROVEN_FILE).read_text())
    except (OSError, ValueError):
        return {}


def load_user_proofs() -> dict[str, dict[str, dict[str, Any]]]:
    """The user's own proofs (``plangen prove``); re-read each time, the file is small."""
    try:
        return read_proofs_file(user_proofs_path().read_text())
    except (OSError, ValueError):
        return {}


def load_proven() -> dict[str, dict[str, dict[str, Any]]]:
    """Every record, shipped and the user's, by class name and code digest (the user's win)."""
    merged = {cls: dict(codes) for cls, codes in load_shipped_proofs().items()}
    for cls, codes in load_user_proofs().items():
        merged.setdefault(cls, {}).update(codes)
    return merged


def proof_for(class_name: str, code: str) -> dict[str, Any] | None:
    """The record proving ``class_name``'s plan on the code whose digest is ``code``, if any."""
    return load_proven().get(class_name, {}).get(code)


def proof_status(codes: Mapping[str, Any], code: str) -> str:
    """:data:`PROVEN_HERE`, :data:`PROVEN_ELSEWHERE` or :data:`NEVER_PROVEN`: whether any of a
    class's records (``codes``, by code digest) is for the installed code (whatever its verdict)."""
    if code in codes:
        return PROVEN_HERE
    return PROVEN_ELSEWHERE if codes else NEVER_PROVEN


def is_proven(class_name: str, sequence_parallel: bool, code: str) -> bool:
    """Whether the synthesized plan of ``class_name`` passed the numerical check on the code whose
    digest is ``code`` (with SP if asked).

    Proven with SP means proven without it too: a class gets one synthesized plan or none.
    """
    record = proof_for(class_name, code)
    if not isinstance(record, dict) or record.get("plan") != "synthesized":
        return False
    return record.get("tp") is True and (not sequence_parallel or record.get("sp") is True)


def hf_check(class_name: str, code: str) -> tuple[bool, str]:
    """Whether the sweep proved the class's Hugging Face plan (TP, no SP) on the code whose digest
    is ``code``, and if not, why not.

    The runtime falls back to a Hugging Face plan only where this says True: transformers' plans
    are not all right (a replicated activation parameter seeing partial activations trains with
    wrong gradients, silently).
    """
    record = proof_for(class_name, code)
    if record is None and load_proven().get(class_name):
        return False, unproven_code_message(class_name)
    if not isinstance(record, dict):
        return False, "not checked by the sweep (scripts/sweep_plans.py)"
    checked = record if record.get("plan") == "hf" else record.get("hf")
    if not isinstance(checked, dict):
        return False, "not checked by the sweep (scripts/sweep_plans.py)"
    if checked.get("tp") is True:
        return True, ""
    return False, f"it failed the numerical check: {checked.get('error') or 'differs from the unsharded model'}"


def unproven_code_message(class_name: str) -> str:
    """Why there is no proof for the installed code, and the command that makes one."""
    import transformers

    if load_proven().get(class_name):
        what = f"proven only on other model code than transformers {transformers.__version__}'s"
    else:
        what = "never proven"
    return f"{what}: prove it on this code with `{PROVE_COMMAND} {class_name}` (about a minute on CPU)"


# --- the code a proof holds for --------------------------------------------------------------------


def code_digest(model: "nn.Module") -> str:
    """A short digest of the source the model's forward runs: every module defining one of its
    modules' classes (the modeling file, a text tower's file), and the transformers integrations
    those modules import (kernels and expert implementations that replace a forward); torch's own
    modules excluded (the torch version is recorded beside the digest)."""
    import hashlib

    # transformers' modules and the model class's own (remote code): not torch's, nor the modules
    # an adapter library (peft's LoRA layers) or plangen put into the tree.
    modules = {type(m).__module__ for m in model.modules() if type(m).__module__.startswith("transformers.")}
    modules.add(type(model).__module__)
    for name in list(modules):
        namespace = vars(sys.modules[name]) if name in sys.modules else {}
        # A value's __module__ may be None (some C-level and generated objects): not an integration.
        owners = {getattr(value, "__module__", None) or "" for value in namespace.values()}
        modules |= {owner for owner in owners if owner.startswith("transformers.integrations")}
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(f"{name}\n{_source_digest(name)}\n".encode())
    return digest.hexdigest()[:16]


def _source_digest(module_name: str) -> str:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path:
        return "no-source"
    return _file_digest(path, os.stat(path).st_mtime_ns)


@lru_cache(maxsize=None)
def _file_digest(path: str, mtime_ns: int) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def plan_fingerprint(plan: "Plan") -> str:
    """A short digest of a plan's entries (pattern, style, arguments) and what it keeps whole.

    Sizes in arguments are the model's (the sweep's shrunk model, whose plans use layer indices
    where layers differ): compare fingerprints of plans built on the same model only."""
    import hashlib

    rows = [f"{e.pattern} {e.style} {sorted((k, repr(v)) for k, v in e.kwargs.items())}" for e in plan.entries]
    rows += [f"whole {r.pattern}" for r in plan.replicated]
    rows.append(f"sequence_parallel={plan.sequence_parallel}")
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def proof_is_stale(record: dict[str, Any] | None, plan: "Plan") -> bool:
    """Whether ``record`` proved another plan than ``plan`` (synthesized records only; a record
    without a fingerprint is stale: nothing says which plan it proved)."""
    if not isinstance(record, dict) or record.get("plan") != "synthesized":
        return False
    key = "sp" if plan.sequence_parallel else "tp"
    return (record.get("fingerprint") or {}).get(key) != plan_fingerprint(plan)

"""Which plans the numerical sweep proved equal to the unsharded model (``proven.json``).

``scripts/sweep_plans.py`` runs, for every class, the parity check of the test suite (tiny random
model, TP=2 and DP=2 x TP=2, logits, loss, every gradient, gradient norm and three AdamW steps
within 1e-5) and writes one record per class name::

    {"plan": "synthesized", "tp": true, "sp": false, "error": "sp: ..."}

``plan`` is the kind of plan checked (``hand-written``, ``synthesized`` or ``hf``); ``tp`` and ``sp``
whether it passed without and with sequence parallelism (``null``: that variant does not exist).
A synthesized record also carries ``fingerprint``: :func:`plan_fingerprint` of the TP and SP plans
it proved, built on the catalog's shrunk model (the sweep's): a change of the synthesizer that
moves a proven plan shows as ``stale`` in ``plangen list`` (and fails the test suite) until the
class is swept again.
A synthesized plan that failed may carry an ``hf`` record: the check of the Hugging Face plan the
runtime falls back to. The runtime trusts a synthesized plan only where :func:`is_proven` says so.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plan import Plan

PROVEN_FILE = "proven.json"
SWEEP_COMMAND = "scripts/sweep_plans.py"  # what proves plans and writes the records (from the repository root)


@lru_cache(maxsize=1)
def load_proven() -> dict[str, dict[str, Any]]:
    """The sweep's records by class name (empty when the file is missing or unreadable)."""
    try:
        text = resources.files("plangen.plans").joinpath(PROVEN_FILE).read_text()
        data = json.loads(text)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_proven(class_name: str, sequence_parallel: bool) -> bool:
    """Whether the synthesized plan of ``class_name`` passed the numerical check (with SP if asked).

    Proven with SP means proven without it too: a class gets one synthesized plan or none.
    """
    record = load_proven().get(class_name)
    if not isinstance(record, dict) or record.get("plan") != "synthesized":
        return False
    return record.get("tp") is True and (not sequence_parallel or record.get("sp") is True)


def hf_check(class_name: str) -> tuple[bool, str]:
    """Whether the sweep proved the class's Hugging Face plan (TP, no SP), and if not, why not.

    The runtime falls back to a Hugging Face plan only where this says True: transformers' plans
    are not all right (a replicated activation parameter seeing partial activations trains with
    wrong gradients, silently).
    """
    record = load_proven().get(class_name)
    if not isinstance(record, dict):
        return False, "not checked by the sweep (scripts/sweep_plans.py)"
    checked = record if record.get("plan") == "hf" else record.get("hf")
    if not isinstance(checked, dict):
        return False, "not checked by the sweep (scripts/sweep_plans.py)"
    if checked.get("tp") is True:
        return True, ""
    return False, f"it failed the numerical check: {checked.get('error') or 'differs from the unsharded model'}"


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

"""The property behind ``plangen verify``'s verdict: levels 1+2 say "clean" exactly when the plan runs right.

Cases are drawn by hypothesis, deterministically (``derandomize``, no database, generation only):
a small config of a hand-written family (Llama, Qwen3, Gemma 3: heads, KV heads, head_dim, hidden,
intermediate, vocabulary, layers, tied or not), the plan ``plangen init`` seeds for it at TP 2, and
one edit of that plan (a style swapped, a placement changed, ``use_local_output`` flipped, an entry
removed or added, ``PLANGEN_TP_SIZE`` changed, or none). Each case is written as ``plangen init``
writes a plan file (:func:`plangen.commands.render.render_plan_text`), next to its ``config.json``.

Two verdicts per case: ``plangen verify`` levels 1+2 in this process
(:func:`plangen.check.verify_plan_files`, no ``--run``), and the truth: the file applied by the runtime
to the model of that very config, DP=1 x TP over gloo, logits and every gradient against the
unsharded model (``tests/distributed/edit_cases.py``, one launch per TP size for every case).
Used by ``tests/test_verify_property.py`` and ``scripts/confusion_matrix.py``.

Every size is a multiple of 4, so every TP size drawn (1, 2, 4) splits every sharded dimension
evenly: all ranks of a case run the same collectives, and a case that fails fails on every rank
(an uneven split that failed on one rank only would leave the others waiting in a collective).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

BASE_TP = 2
TP_SIZES = (1, 2, 4)
# Each edit kind, as the doc's table names it.
EDIT_KINDS = {
    "none": "none (init's own plan)",
    "swap": "style swapped",
    "placement": "a placement changed (Shard(0), Shard(1), Shard(-1), Replicate())",
    "local_output": "`use_local_output` flipped",
    "remove": "entry removed",
    "add": "entry added (a module without one, a style with its defaults)",
    "tp_size": "`PLANGEN_TP_SIZE` changed (2 to 1 or 4)",
}
# (model_type, class): the hand-written families drawn.
FAMILIES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
PLACEMENTS = ("Shard(0)", "Shard(1)", "Shard(-1)", "Replicate()")
SWAP_STYLES = (
    "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "KVHeadsColwiseParallel",
    "ReplicatedWithGradAllReduce", "PrepareModuleInput", "PrepareAttentionInput",
)
ADD_STYLES = ("ColwiseParallel", "RowwiseParallel", "SequenceParallel", "ReplicatedWithGradAllReduce", "PrepareModuleInput")
LAYOUT_ARGS = ("input_layouts", "output_layouts", "desired_input_layouts", "input_kwarg_layouts", "desired_input_kwarg_layouts")
# Relative to the largest reference value of each tensor (logits, each gradient); fp32 TP
# reorders sums, so right runs differ by ~1e-7 of it and wrong ones by far more.
RTOL = 1e-4
ATOL = 1e-8
SEED = 0  # the weights
BATCH, SEQ = 2, 8


# --- drawing cases -------------------------------------------------------------------------------


@st.composite
def configs(draw) -> dict[str, Any]:
    model_type = draw(st.sampled_from(sorted(FAMILIES)))
    heads = draw(st.sampled_from([2, 4, 8]))
    config = {
        "model_type": model_type,
        "architectures": [FAMILIES[model_type]],
        "num_attention_heads": heads,
        "num_key_value_heads": draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0])),
        "head_dim": draw(st.sampled_from([4, 8, 16])),
        "hidden_size": draw(st.sampled_from([16, 32, 48, 64])),
        "intermediate_size": draw(st.sampled_from([16, 32, 48, 64, 96])),
        "vocab_size": draw(st.sampled_from([32, 64, 96, 128])),
        "num_hidden_layers": draw(st.integers(1, 2)),
        "tie_word_embeddings": draw(st.booleans()),
        "max_position_embeddings": 64,
    }
    if model_type == "gemma3_text":
        config["sliding_window"] = 4  # matters at 8 tokens
        config["query_pre_attn_scalar"] = config["head_dim"]
    return config


@st.composite
def edits(draw) -> dict[str, Any]:
    """An edit by kind and indices; which entry an index names is read off the plan (mod its length)."""
    kind = draw(st.sampled_from(list(EDIT_KINDS)))
    edit: dict[str, Any] = {"kind": kind, "entry": draw(st.integers(0, 63))}
    if kind == "swap":
        edit["style"] = draw(st.integers(0, len(SWAP_STYLES) - 2))
    elif kind == "placement":
        edit["arg"] = draw(st.integers(0, 7))
        edit["placement"] = draw(st.integers(0, len(PLACEMENTS) - 2))
    elif kind == "add":
        edit["style"] = draw(st.sampled_from(ADD_STYLES))
    elif kind == "tp_size":
        edit["tp_size"] = draw(st.sampled_from([t for t in TP_SIZES if t != BASE_TP]))
    return edit


class _Enough(Exception):
    pass


def draw_cases(count: int) -> list[dict[str, Any]]:
    """``count`` distinct cases, the same on every run and machine."""
    drawn: dict[str, dict[str, Any]] = {}

    @settings(
        max_examples=count * 4, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(config=configs(), edit=edits())
    def collect(config: dict[str, Any], edit: dict[str, Any]) -> None:
        case = {"config": config, "edit": edit}
        drawn.setdefault(json.dumps(case, sort_keys=True), case)
        if len(drawn) >= count:
            raise _Enough  # hypothesis would go on to max_examples

    try:
        collect()
    except _Enough:
        pass
    cases = list(drawn.values())[:count]
    for number, case in enumerate(cases):
        case["id"] = f"case{number:03d}"
    return cases


# --- writing a case's files ----------------------------------------------------------------------


def _placement(text: str):
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if text == "Replicate()" else Shard(int(text[6:-1]))


def _style_params(style: str) -> list[str]:
    import inspect

    from plangen.styles import STYLE_CLASSES

    return [p for p in inspect.signature(STYLE_CLASSES[style].__init__).parameters if p != "self"]


def _candidate_modules(model, plan) -> list[str]:
    """Generalized paths of the modules no entry names (where an added entry goes)."""
    from plangen.model.module_tree import generalize

    named = set(plan.patterns())
    paths = dict.fromkeys(generalize(name) for name, _ in model.named_modules() if name)
    return [p for p in paths if p not in named]


def apply_edit(plan, model, edit: dict[str, Any]) -> tuple[Any, str]:
    """The plan with ``edit`` made (a :class:`plangen.plan.Plan`), and what was done, in words.

    An edit that has nothing to act on here (no layout argument in the entry) becomes the nearest
    entry that has one, so every edit of its kind changes the plan."""
    from plangen.plan import PlanEntry

    entries = list(plan.entries)
    kind = edit["kind"]
    if kind in ("none", "tp_size"):
        return plan, "unedited" if kind == "none" else f"PLANGEN_TP_SIZE = {edit['tp_size']}"
    if kind == "add":
        candidates = _candidate_modules(model, plan)
        pattern = candidates[edit["entry"] % len(candidates)]
        entries.append(PlanEntry(pattern, edit["style"], {}, "other", "added by the edit"))
        return dataclasses.replace(plan, entries=tuple(entries)), f"added {pattern}: {edit['style']}()"
    order = list(range(len(entries)))
    start = edit["entry"] % len(entries)
    order = order[start:] + order[:start]
    if kind == "remove":
        gone = entries.pop(start)
        return dataclasses.replace(plan, entries=tuple(entries)), f"removed {gone.pattern}"
    for index in order:
        entry = entries[index]
        kwargs = dict(entry.kwargs)
        if kind == "swap":
            others = [s for s in SWAP_STYLES if s != entry.style]
            style = others[edit["style"] % len(others)]
            params = _style_params(style)
            kwargs = {k: v for k, v in kwargs.items() if k in params}
            entries[index] = dataclasses.replace(entry, style=style, kwargs=kwargs)
            return dataclasses.replace(plan, entries=tuple(entries)), f"{entry.pattern}: {entry.style} -> {style}"
        if kind == "local_output" and "use_local_output" in kwargs:
            kwargs["use_local_output"] = not kwargs["use_local_output"]
            entries[index] = dataclasses.replace(entry, kwargs=kwargs)
            return dataclasses.replace(plan, entries=tuple(entries)), f"{entry.pattern}: use_local_output={kwargs['use_local_output']}"
        if kind == "placement":
            args = [a for a in LAYOUT_ARGS if kwargs.get(a) is not None]
            if not args:
                continue
            arg = args[edit["arg"] % len(args)]
            value = kwargs[arg]
            current = value if not isinstance(value, (tuple, dict)) else (
                value[0] if isinstance(value, tuple) else next(iter(value.values()))
            )
            others = [p for p in PLACEMENTS if _placement(p) != current]
            new = _placement(others[edit["placement"] % len(others)])
            if isinstance(value, tuple):
                kwargs[arg] = (new, *value[1:])
            elif isinstance(value, dict):
                first = next(iter(value))
                kwargs[arg] = {**value, first: new}
            else:
                kwargs[arg] = new
            entries[index] = dataclasses.replace(entry, kwargs=kwargs)
            return dataclasses.replace(plan, entries=tuple(entries)), f"{entry.pattern}: {arg}={kwargs[arg]!r}"
    raise ValueError(f"no entry to edit by {kind}")


def write_case(case: dict[str, Any], folder: Path) -> Path:
    """``folder/config.json`` and ``folder/<id>.py``: the plan init writes for it, edited; the plan path.

    Records in ``case`` the TP size the file is for (``tp_size``) and the edit in words (``what``)."""
    from plangen.commands.init import build_seed_plan, load_model, regenerate_command
    from plangen.commands.render import render_plan_text

    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "config.json"
    config_path.write_text(json.dumps(case["config"], indent=1))
    plan_path = folder / f"{case['id']}.py"
    loaded = load_model(str(config_path))
    plan, seed = build_seed_plan(loaded.model, sequence_parallel=False)
    edited, what = apply_edit(plan, loaded.model, case["edit"])
    text = render_plan_text(
        loaded.model, loaded.resolved, edited, seed, output=plan_path, tp_size=BASE_TP, sequence_parallel=False,
        command=regenerate_command(str(config_path), plan_path, BASE_TP, False),
        versions={"plangen": "-", "transformers": "-", "torch": "-"},
    )
    tp_size = case["edit"].get("tp_size", BASE_TP)
    if tp_size != BASE_TP:
        text, count = re.subn(r"^PLANGEN_TP_SIZE = \d+$", f"PLANGEN_TP_SIZE = {tp_size}", text, flags=re.M)
        assert count == 1, "the rendered file records no PLANGEN_TP_SIZE"
    plan_path.write_text(text)
    case["tp_size"], case["what"] = tp_size, what
    return plan_path


# --- the two verdicts ----------------------------------------------------------------------------


def verify_case(plan_path: Path) -> list[str]:
    """The error codes ``plangen verify`` (levels 1+2) gives the file; [] is "clean"."""
    from plangen.check import verify_plan_files

    report = verify_plan_files([str(plan_path)])
    return sorted({d.code for d in report.diagnostics if d.severity == "error"})


def truth_launches(cases: list[dict[str, Any]], timeout: float = 600.0) -> list[tuple]:
    """The gloo launches that judge the real runs, as ``run_distributed`` arguments: one of 2 ranks
    for the TP 1 and 2 cases, one of 4 for the TP 4 ones (prepared cases: their files written)."""
    launches = []
    for world, sizes in ((2, (1, 2)), (4, (4,))):
        batch = [
            {"id": c["id"], "config": c["config_path"], "plan": c["plan_path"], "tp_size": c["tp_size"]}
            for c in cases if c["tp_size"] in sizes
        ]  # fmt: skip
        if batch:
            launches.append(("tests/distributed/edit_cases.py:run_cases", world, {"cases": batch}, timeout))
    return launches


def truth_from(launches: list[tuple], results: list[list[dict]]) -> dict[str, str | None]:
    """Case id -> why the real run differs from the unsharded model (None: it matches), from each
    launch's per-rank results."""
    truth: dict[str, str | None] = {}
    for (_, _, payload, _), per_rank in zip(launches, results, strict=True):
        for case in payload["cases"]:
            problems = [rank[case["id"]] for rank in per_rank if case["id"] in rank]
            assert problems, f"{case['id']}: no rank ran it"
            truth[case["id"]] = next((p for p in problems if p is not None), None)
    return truth


def prepare_cases(cases: list[dict[str, Any]], folder: Path) -> None:
    """Write every case's files under ``folder`` (one folder per case: its own config.json)."""
    for case in cases:
        plan_path = write_case(case, folder / case["id"])
        case["plan_path"], case["config_path"] = str(plan_path), str(plan_path.parent / "config.json")


def judge_prepared(cases: list[dict[str, Any]], truth: dict[str, str | None]) -> list[dict[str, Any]]:
    """Each prepared case with its verdicts: ``codes`` (verify's errors) and ``problem`` (the run's, None: right)."""
    for case in cases:
        case["codes"] = verify_case(Path(case["plan_path"]))
        case["problem"] = truth[case["id"]]
    return cases


def judge_cases(cases: list[dict[str, Any]], folder: Path, timeout: float = 600.0) -> list[dict[str, Any]]:
    """:func:`judge_prepared` with the files written and the runs launched here, one after the other."""
    from plangen.distributed.launch import run_distributed

    prepare_cases(cases, folder)
    launches = truth_launches(cases, timeout)
    return judge_prepared(cases, truth_from(launches, [run_distributed(*launch) for launch in launches]))


def false_cleans(cases: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in cases if not c["codes"] and c["problem"] is not None]


def false_alarms(cases: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in cases if c["codes"] and c["problem"] is None]


def confusion(cases: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per edit kind (and ``all``): counts of clean/flagged x right/wrong."""
    table: dict[str, Counter] = {}
    for case in cases:
        cell = ("clean" if not case["codes"] else "flagged") + "_" + ("right" if case["problem"] is None else "wrong")
        for kind in (case["edit"]["kind"], "all"):
            table.setdefault(kind, Counter())[cell] += 1
    cells = ("clean_right", "clean_wrong", "flagged_wrong", "flagged_right")
    order = [k for k in (*EDIT_KINDS, "all") if k in table]
    return {kind: {cell: table[kind][cell] for cell in cells} for kind in order}


def describe(case: dict[str, Any]) -> str:
    c = case["config"]
    size = (
        f"{c['model_type']} heads={c['num_attention_heads']}/{c['num_key_value_heads']} head_dim={c['head_dim']}"
        f" hidden={c['hidden_size']} inter={c['intermediate_size']} vocab={c['vocab_size']}"
        f" layers={c['num_hidden_layers']} tied={c['tie_word_embeddings']}"
    )
    return f"{case['id']} [{size}] TP={case['tp_size']} {case['what']}: verify {case['codes'] or 'clean'}, run {case['problem'] or 'right'}"


FULL_COUNT = 240  # the test and scripts/confusion_matrix.py
SUBSET_STEP = 1  # the default run takes every case (the proof: >= 200 in CI); 4 would take 60
COMMAND = "python scripts/confusion_matrix.py"


def build_record(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """What plangen/check/confusion.json holds: the counts and the cases verify got wrong."""
    return {
        "command": COMMAND,
        "cases": len(cases),
        "families": sorted(FAMILIES.values()),
        "tp_sizes": list(TP_SIZES),
        "kinds": EDIT_KINDS,
        "rtol": RTOL,
        "default_run": len(cases[::SUBSET_STEP]),
        "matrix": confusion(cases),
        "false_clean": [describe(c) for c in false_cleans(cases)],
        "false_alarm": [describe(c) for c in false_alarms(cases)],
        "false_alarm_kinds": sorted({alarm_kind(c) for c in false_alarms(cases)}),
    }


def alarm_kind(case: dict[str, Any]) -> str:
    """A false alarm without its config: the edit and the codes (another draw of cases, from another
    hypothesis version, meets the same kinds in other configs)."""
    return f"{case['edit']['kind']}: {re.sub(r'[(].*', '', case['what'])} -> {' '.join(case['codes'])}"

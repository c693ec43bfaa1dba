"""Issue 31: the ``nemo-rl-v2`` target against NeMo Automodel itself, not against a reading of its code.

Every plan ``plangen init --target nemo-rl-v2 --tp-size 2`` writes for the issue's models goes through
Automodel 0.7.0's own ``parallelize_model``, handed over as NeMo RL's v2 worker hands it
(``FSDP2Config(tp_plan="<package>.<module>.custom_parallel_plan")``), at DP 2 x TP 2 on gloo with a
tiny random model, and must match the unsharded model: logits, every parameter's gradient and the
gradient norm (Automodel's ``clip_grad_norm``) within 1e-5. What ``verify --target nemo-rl-v2``
flags (tests/test_targets.py's ``REFUSED_AT_TP2``) must be what Automodel in fact refuses, with
Automodel's own exception; with ``force_hf=True`` its MoE plans apply and match.

Automodel is not a dependency: the cases run in an interpreter that has it
(tests/distributed/automodel_cases.py): ``PLANGEN_AUTOMODEL_PYTHON``, else a venv made once under
the cache directory on top of this interpreter's packages (:func:`automodel_python`). Where neither
can be had (no network), the tests skip, saying what failed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_targets import MODELS, REFUSED_AT_TP2
from typer.testing import CliRunner

from plangen.check import VerifyOptions, verify_plan_files
from plangen.commands.cli import app
from plangen.distributed.launch import run_distributed

AUTOMODEL = "0.7.0"  # the release plangen/plan/targets.py's nemo-rl-v2 row is read from
# What it needs beyond this test environment (torch, transformers, accelerate come from it, unchanged):
# torchao, which `from nemo_automodel import NeMoAutoModelForCausalLM` imports.
INSTALL = [f"nemo-automodel=={AUTOMODEL}", "torchao==0.18.0"]
TOL = 1e-5
PACKAGE = "automodel_plans"  # the plans' package, importable on the ranks as on NeMo RL's workers
# Gemma 3 as transformers' default config has it (2 KV heads in its tiny form): a tied pair Automodel takes.
EXTRA = {"gemma3_text": "gemma3_text"}

# Automodel's registry replaces these by model code of its own (force_hf=False, NeMo RL's default).
OWN_CLASS = {"llama", "qwen3", "qwen3_moe", "deepseek_v3"}
# Automodel's own LlamaForCausalLM (not the Hugging Face class) comes out of its parallelize_model with
# a wrong embedding gradient here, the same under its own TP plan (tp_plan=None, the control case):
# not the plan's doing. Measured max |diff| 0.16; the unsharded classes agree (the reference).
OWN_LLAMA_EMBEDDING = "model.embed_tokens.weight"


def _interpreter_facts(python: str) -> dict:
    """The versions ``python`` imports (and where its plangen is), or raises with stderr's last line."""
    code = (
        "import json, torch, transformers, plangen, nemo_automodel; import importlib.metadata as m; "
        # What the cases call: Automodel 0.7.0 imports transformers internals of its own pin's age
        # (transformers 5.8.1 lacks utils.hub.resolve_revision): such a pair cannot run it at all.
        "from nemo_automodel import NeMoAutoModelForCausalLM; "
        "from nemo_automodel.components.distributed.model_parallelizer import parallelize_model; "
        "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__, "
        "'plangen': plangen.__file__, 'nemo_automodel': m.version('nemo-automodel')}))"
    )
    done = subprocess.run([python, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} cannot import what the cases need: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plangen"


def _make_venv(where: Path) -> None:
    """A venv whose packages are this interpreter's plus Automodel's.

    ``venv --system-site-packages`` would add the base interpreter's packages, not this one's when
    this one is itself a venv (a venv's base is the interpreter it was made from): a ``.pth`` file
    adds this interpreter's site directories instead (``site.addsitedir``, so their own ``.pth``
    files, an editable plangen's among them, apply). Only ``INSTALL`` is installed, ``--no-deps``:
    pip never touches torch or transformers."""
    import site
    import sysconfig

    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [
            str(python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dirs = [d for d in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]) if Path(d).is_dir()]
    (Path(purelib) / "_plangen_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    )
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    if subprocess.run([sys.executable, "-m", "pip", "--version"], check=False, capture_output=True).returncode:
        subprocess.run(
            [str(python), "-m", "ensurepip"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        pip = [str(python), "-m", "pip"]
    done = subprocess.run(
        [
            *pip,
            "install",
            "--no-deps",
            "--disable-pip-version-check",
            "--timeout",
            "30",
            "--retries",
            "1",
            *INSTALL,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pip install {' '.join(INSTALL)} failed: {last}")


def automodel_python() -> tuple[str, dict]:
    """An interpreter with NeMo Automodel (and this torch, transformers and plangen), and what it has.

    ``PLANGEN_AUTOMODEL_PYTHON`` names one; else a venv is made once per test environment under
    ``$XDG_CACHE_HOME/plangen`` (a lock keeps two test runs from making it at once). Raises
    ``RuntimeError`` (one line) where none can be had."""
    import torch
    import transformers

    import plangen

    given = os.environ.get("PLANGEN_AUTOMODEL_PYTHON")
    if given:
        python = given
    else:
        key = hashlib.sha1(f"{sys.prefix}|{torch.__version__}|{transformers.__version__}".encode()).hexdigest()[:10]
        where = _cache_dir() / f"automodel-{AUTOMODEL}-venv-{key}"
        where.parent.mkdir(parents=True, exist_ok=True)
        with open(where.parent / f"{where.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (where / "plangen-ready").exists():
                shutil.rmtree(where, ignore_errors=True)  # a half-made one (an install that failed)
                try:
                    _make_venv(where)
                except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
                    shutil.rmtree(where, ignore_errors=True)
                    raise RuntimeError(f"making the Automodel venv in {where}: {exc}") from None
                (where / "plangen-ready").write_text(" ".join(INSTALL) + "\n")
        python = str(where / "bin" / "python")
    facts = _interpreter_facts(python)
    if facts["nemo_automodel"] != AUTOMODEL:
        raise RuntimeError(
            f"{python} has nemo-automodel {facts['nemo_automodel']}; the nemo-rl-v2 target is read from {AUTOMODEL}"
        )
    if Path(facts["plangen"]).resolve() != Path(plangen.__file__).resolve():
        raise RuntimeError(f"{python} imports another plangen ({facts['plangen']}) than the one under test")
    if not given and (facts["torch"], facts["transformers"]) != (
        torch.__version__,
        transformers.__version__,
    ):
        raise RuntimeError(
            f"the Automodel venv has torch {facts['torch']}, transformers {facts['transformers']}, "
            f"not this environment's {torch.__version__}, {transformers.__version__}"
        )
    return python, facts


@pytest.fixture(scope="module")
def automodel():
    started = time.perf_counter()
    try:
        python, facts = automodel_python()
    except RuntimeError as exc:
        pytest.skip(f"no NeMo Automodel {AUTOMODEL} to check against: {exc}")
    facts["seconds_to_get"] = time.perf_counter() - started
    return python, facts


def _module(name: str) -> str:
    return re.sub(r"\W", "_", name)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """``plangen init --target nemo-rl-v2 --tp-size 2`` for each model (and ``EXTRA``), in one package;
    where init refuses (Gemma-3-1B's one KV head), the file init writes for plangen's own runtime.
    Returns the package's folder and the issue's models' files."""
    root = tmp_path_factory.mktemp("automodel")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    runner, written, refused = CliRunner(), {}, {}
    for name, spec in MODELS.items():
        path = root / PACKAGE / f"{_module(name)}_plan.py"
        result = runner.invoke(
            app,
            ["init", spec, "-o", str(path), "--tp-size", "2", "--target", "nemo-rl-v2"],
        )
        if result.exit_code:
            refused[name] = result.output
            result = runner.invoke(app, ["init", spec, "-o", str(path), "--tp-size", "2"])
        assert result.exit_code == 0, result.output
        written[name] = path
    for name, spec in EXTRA.items():
        result = runner.invoke(
            app,
            [
                "init",
                spec,
                "-o",
                str(root / PACKAGE / f"{_module(name)}_plan.py"),
                "--tp-size",
                "2",
                "--target",
                "nemo-rl-v2",
            ],
        )
        assert result.exit_code == 0, result.output
    # What init refused is exactly what the table says the target refuses at init (the head counts).
    assert set(refused) == {m for m, code in REFUSED_AT_TP2["nemo-rl-v2"].items() if code == "PG216"}, refused
    return root, written


def _dotted(name: str) -> str:
    return f"{PACKAGE}.{_module(name)}_plan.custom_parallel_plan"


# name -> (model, force_hf, the plan's dotted path, or None: Automodel's own plan)
CASES = {
    **{
        name: (name, False, _dotted(name)) for name in [*MODELS, *EXTRA]
    },  # Automodel's choice of class (NeMo RL's default)
    "qwen3_moe-force_hf": ("qwen3_moe", True, _dotted("qwen3_moe")),
    "deepseek_v3-force_hf": ("deepseek_v3", True, _dotted("deepseek_v3")),
    "llama-force_hf": ("llama", True, _dotted("llama")),
    "llama-automodel-plan": (
        "llama",
        False,
        None,
    ),  # control: Automodel's own plan for its own Llama
}


@pytest.fixture(scope="module")
def results(automodel, plans) -> dict[str, dict]:
    python, _ = automodel
    root, _ = plans
    specs = {**MODELS, **EXTRA}
    cases = [
        {"name": name, "spec": specs[model], "force_hf": force_hf, "plan": plan}
        for name, (model, force_hf, plan) in CASES.items()
    ]
    started = time.perf_counter()
    per_rank = run_distributed(
        "tests/distributed/automodel_cases.py:run_cases",
        4,
        {"plans_dir": str(root), "cases": cases},
        timeout=480,
        python=python,
    )
    seconds = time.perf_counter() - started
    for name in CASES:  # every rank computed the same comparison of the whole tensors
        for rank, per_case in enumerate(per_rank):
            assert "error" not in per_case[name], f"{name}, rank {rank}: {per_case[name].get('trace')}"
    worst = {
        name: {k: max(r[name].get(k) or 0.0 for r in per_rank) for k in ("logits", "grad", "grad_norm")}
        for name in CASES
    }
    print(f"Automodel cases: {seconds:.0f} s; max differences: {json.dumps(worst)}")
    return {name: {**per_rank[0][name], **worst[name], "ranks": [r[name] for r in per_rank]} for name in CASES}


APPLIED = [
    "llama",
    "llama-force_hf",
    "qwen3",
    "gemma3_text",
    "phi3",
    "mixtral",
    "qwen3_moe-force_hf",
    "deepseek_v3-force_hf",
]


@pytest.mark.distributed
@pytest.mark.parametrize("case", APPLIED)
def test_each_plan_applies_under_automodel_and_matches_the_unsharded_model(results, case):
    r = results[case]
    model, force_hf, _ = CASES[case]
    assert r["automodel_class"] == (model in OWN_CLASS and not force_hf), r["class"]
    assert r["same_weights"], "the ranks built different weights"
    assert "capabilities" not in r and "parallelize" not in r, r
    assert r["unmatched_keys"] == [] and r["tp_sharded"] > 0, r  # the plan did split the model
    assert r["tied"] == (model == "gemma3_text")  # Automodel re-ties; plangen's pair keeps one parameter
    assert r["missing_grads"] == [] and r["extra_grads"] == [], r
    assert r["logits"] < TOL, r["logits"]
    grads = {n: max(rank["grads"][n] for rank in r["ranks"]) for n in r["grads"]}
    if case == "llama":  # Automodel's own Llama: its defect, the same under its own plan (next test)
        assert grads.pop(OWN_LLAMA_EMBEDDING) > TOL
    else:
        assert r["grad"] < TOL and r["grad_norm"] < TOL, (
            r["worst_grad"],
            r["grad"],
            r["grad_norm"],
        )
    assert max(grads.values()) < TOL, grads


@pytest.mark.distributed
def test_automodels_own_llama_gets_the_same_embedding_gradient_under_its_own_plan(
    results,
):
    """The one gradient that does not match, under Automodel's own LlamaForCausalLM, is Automodel's:
    its own TP plan for that class gives the very same embedding gradient, and the Hugging Face class
    (force_hf=True) under plangen's plan matches everywhere."""
    ours, theirs = results["llama"], results["llama-automodel-plan"]
    assert "parallelize" not in theirs and theirs["automodel_class"]
    for a, b in zip(ours["ranks"], theirs["ranks"]):
        assert abs(a["embedding_grad"] - b["embedding_grad"]) < 1e-6
        assert abs(a["grads"][OWN_LLAMA_EMBEDDING] - b["grads"][OWN_LLAMA_EMBEDDING]) < 1e-6
    assert results["llama-force_hf"]["grad"] < TOL


NUM_KV = "num_key_value_heads (1) must be divisible by TP size (2)"
MOE_RULE = re.compile(
    r"Tensor parallelism must not target routed-expert parameters or router outputs .* "
    r"Remove these paths from tp_shard_plan: (.*)\. Shared-expert leaf modules remain supported\."
)


@pytest.mark.distributed
def test_automodel_refuses_exactly_what_verify_flags_for_it(results, plans):
    _, written = plans
    report = verify_plan_files(list(written.values()), VerifyOptions(target="nemo-rl-v2"))
    flagged: dict[str, set] = {}
    for d in report.diagnostics:
        name = next(n for n, p in written.items() if Path(d.path) == p)
        line = written[name].read_text().splitlines()[d.line - 1][d.col - 1 :]
        flagged.setdefault(name, set()).add((d.code, line.split(":")[0].strip('"')))
    refused = {name for name in MODELS if "capabilities" in results[name] or "parallelize" in results[name]}
    assert refused == set(flagged) == set(REFUSED_AT_TP2["nemo-rl-v2"]), (
        refused,
        flagged,
    )
    for name in refused:
        r, codes = results[name], {code for code, _ in flagged[name]}
        assert codes == {REFUSED_AT_TP2["nemo-rl-v2"][name]}, flagged[name]
        if codes == {"PG216"}:  # the head check, on the Hugging Face class, before the plan is read
            assert not r["automodel_class"] and "capabilities" not in r
            assert r["parallelize"] == {"type": "ValueError", "message": NUM_KV}
        else:  # PG217: Automodel's own MoE class, refused twice; the keys are those verify names
            assert r["automodel_class"] and r["class"].startswith("nemo_automodel.components.models.")
            cls = r["class"].rsplit(".", 1)[1]
            assert r["capabilities"]["type"] == "ValueError"
            assert r["capabilities"]["message"].startswith(
                f"Unsupported configuration for {cls}:\n  - Tensor parallelism (tp_size=2) requested but {cls} has no TP plan"
            )
            match = MOE_RULE.fullmatch(r["parallelize"]["message"])
            assert r["parallelize"]["type"] == "ValueError" and match, r["parallelize"]
            assert set(match.group(1).split(", ")) == {key for _, key in flagged[name]}


def test_the_venv_keeps_this_environments_torch_and_transformers(automodel):
    import torch
    import transformers

    python, facts = automodel
    assert facts["nemo_automodel"] == AUTOMODEL
    if not os.environ.get("PLANGEN_AUTOMODEL_PYTHON"):
        assert (facts["torch"], facts["transformers"]) == (
            torch.__version__,
            transformers.__version__,
        )
    print(f"Automodel interpreter {python}: {facts}")

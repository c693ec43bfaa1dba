"""`plangen init`: the generated module means the seed plan, reads well, is deterministic, and is written safely."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import DATA, pinned_release_only
from plangen.commands.cli import app
from plangen.output.files import write_plan_file
from plangen.commands.init import init_plan, load_model, render_plan_module
from plangen.output.errors import InitError
from plangen.plan.source import load_custom_plan
from plangen.commands.render import (
    ENTRY_WIDTH,
    LINE_WIDTH,
    complete_kwargs,
    describe_modules,
    package_template_dir,
    render_value,
)

ROOT = Path(__file__).resolve().parent.parent
LLAMA_405B = DATA / "model-configs" / "llama-3.1-405b.json"
runner = CliRunner()


def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def regenerate():
    return _load_script("plangen_regenerate", ROOT / "scripts" / "regenerate.py")


@pytest.fixture(scope="module")
def models():
    """Meta models by spec, built once for the module."""
    cache: dict = {}

    def get(spec: str):
        if spec not in cache:
            cache[spec] = load_model(spec)
        return cache[spec]

    return get


def invoke(*args: str):
    return runner.invoke(app, ["init", *args])


def error_line(result) -> str:
    """The error output, which must be exactly one line (no traceback)."""
    text = result.stderr if result.stderr else result.output
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("plangen: error: "), text
    return lines[0]


# --- generated/ -------------------------------------------------------------------------------


@pinned_release_only
def test_generated_files_are_up_to_date(regenerate):
    """Fails when any file of generated/ is stale: fix with `python scripts/regenerate.py`."""
    cache: dict = {}
    targets = regenerate.targets()
    stale = [str(t.output) for t in targets if regenerate.stale(t, cache)]
    assert not stale, f"stale or missing: {stale}; run: python scripts/regenerate.py"
    assert regenerate.unexpected_files(targets) == []


def test_generated_covers_every_hand_written_plan_with_tp_and_sp_variants(regenerate):
    from plangen.plans import HAND_WRITTEN

    targets = regenerate.targets()
    assert {t.class_name for t in targets} == set(HAND_WRITTEN)
    names = {t.output.name for t in targets}
    for base in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text"):
        assert {f"{base}_plan.py", f"{base}_sp_plan.py"} <= names
        assert (ROOT / "generated" / f"{base}_plan.py").is_file()
        assert (ROOT / "generated" / f"{base}_sp_plan.py").is_file()


@pytest.mark.parametrize("name", ["llama_plan.py", "qwen3_sp_plan.py"])
def test_regenerate_command_in_the_header_reproduces_the_file(name, tmp_path, monkeypatch):
    text = (ROOT / "generated" / name).read_text()
    command = re.search(r"^Regenerate: +(.+)$", text, re.MULTILINE).group(1)
    args = shlex.split(command)
    assert args[:2] == ["plangen", "init"]
    (tmp_path / "generated").mkdir()
    monkeypatch.chdir(tmp_path)
    result = invoke(*args[2:])
    assert result.exit_code == 0, result.output
    versions = re.search(r"^Made with: .*$", text, re.MULTILINE).group(0)
    fresh = re.sub(r"^Made with: .*$", versions, (tmp_path / "generated" / name).read_text(), flags=re.MULTILINE)
    assert fresh == text


# --- the file means the seed plan ---------------------------------------------------------------


def _style_state(style) -> tuple:
    from torch.distributed.tensor.parallel import ParallelStyle

    # PrepareModuleInputOutput holds two styles: compared by their state too, not by identity.
    return type(style), {k: _style_state(v) if isinstance(v, ParallelStyle) else v for k, v in vars(style).items()}


@pytest.mark.parametrize(
    "spec, sequence_parallel",
    [
        ("llama", False),
        ("llama", True),
        ("qwen3", True),
        ("gemma3_text", False),
        ("nemotron_h", False),
        ("phi3", True),
        ("olmo", False),
        ("exaone4", False),
    ],
)
def test_rendered_file_loads_as_the_seed_plan(spec, sequence_parallel, models, tmp_path, monkeypatch):
    """Round trip: the file's styles equal, key by key, the seed plan's styles (listed group by group)."""
    from plangen.plan import GROUPS
    from plangen.styles import build_parallel_styles

    if spec == "olmo":  # nothing proven: the seed is its Hugging Face plan
        from conftest import set_proofs

        set_proofs(monkeypatch, {})

    rendered = render_plan_module(spec, tmp_path / "plan.py", sequence_parallel=sequence_parallel, loaded=models(spec))
    write_plan_file(rendered.path, rendered.text)
    loaded = load_custom_plan(str(rendered.path))
    expected = build_parallel_styles(rendered.plan)
    by_group = sorted(rendered.plan.entries, key=lambda e: GROUPS.index(e.group) if e.group in GROUPS else len(GROUPS))
    assert list(loaded) == [e.pattern for e in by_group]
    assert set(loaded) == set(expected)
    for key in expected:
        assert _style_state(loaded[key]) == _style_state(expected[key]), key
    if spec == "olmo":  # a Hugging Face plan
        assert rendered.plan.source == "hf" and "Hugging Face plan" in rendered.seed
    elif spec == "exaone4":  # no hand-written plan: synthesized, proven by the sweep
        assert rendered.plan.source == "synthesized" and "numerically proven" in rendered.seed
    else:
        assert rendered.plan.source == "hand-written"


def test_header_constants_for_verify(models, tmp_path):
    rendered = render_plan_module("qwen3", tmp_path / "p.py", tp_size=4, sequence_parallel=True, loaded=models("qwen3"))
    tree = ast.parse(rendered.text)
    constants = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert constants == {"PLANGEN_MODEL": "qwen3", "PLANGEN_TP_SIZE": 4, "PLANGEN_SEQUENCE_PARALLEL": True}
    doc = ast.get_docstring(tree)
    assert "plangen init qwen3 -o" in doc and "--tp-size 4 --sequence-parallel --force" in doc
    assert re.search(r"plangen \S+, transformers \S+, torch \S+", doc)


def test_imports_are_exactly_the_names_used(models, tmp_path):
    for spec, sp in (("llama", False), ("qwen3", True), ("phi3", False), ("exaone4", False)):
        text = render_plan_module(spec, tmp_path / "p.py", sequence_parallel=sp, loaded=models(spec)).text
        tree = ast.parse(text)
        imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        used -= {"dict", "str"}  # builtins of the annotation
        assert imported == used, (spec, imported ^ used)
        modules = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert modules <= {"torch.distributed.tensor", "torch.distributed.tensor.parallel", "plangen.styles"}


def test_every_constructor_argument_is_written_out(models, tmp_path):
    import inspect

    from plangen.styles import STYLE_CLASSES

    text = render_plan_module("llama", tmp_path / "p.py", sequence_parallel=True, loaded=models("llama")).text
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in STYLE_CLASSES]
    assert calls
    for call in calls:
        params = [p for p in inspect.signature(STYLE_CLASSES[call.func.id].__init__).parameters if p != "self"]
        assert [k.arg for k in call.keywords] == params, call.func.id


def test_entries_grouped_with_comments_and_replicated_modules_shown(models, tmp_path):
    loaded = models(str(LLAMA_405B))
    text = render_plan_module(str(LLAMA_405B), tmp_path / "p.py", loaded=loaded).text
    body = text[text.index("custom_parallel_plan: dict[str, ParallelStyle] = {") :]
    titles = [
        line.strip()
        for line in body.splitlines()
        if line.strip() in {"# Embeddings", "# Attention", "# MLP", "# Norms", "# Output head"}
    ]
    assert titles == ["# Embeddings", "# Attention", "# MLP", "# Norms", "# Output head"]
    assert "# 126 × Linear [16384, 16384] → local [8192, 16384] at TP=2; column-parallel" in text  # q_proj
    assert "# 126 × Linear [1024, 16384] → local [512, 16384] at TP=2" in text  # k_proj (8 KV heads)
    assert "# 126 × Linear [16384, 16384] → local [16384, 8192] at TP=2; row-parallel" in text  # o_proj
    assert "# 1 × Embedding [128256, 16384] → local [64128, 16384] at TP=2" in text  # rowwise: vocab
    assert "# 1 × Linear [128256, 16384] → local [64128, 16384] at TP=2" in text  # lm_head
    # Left replicated on purpose: commented out, with the reason.
    assert '    # "model.norm": 1 × LlamaRMSNorm [16384]' in text
    assert "    # Left replicated on purpose: sees the full hidden state" in text
    for line in body.splitlines():  # the code; the docstring holds paths as long as they are
        limit = LINE_WIDTH if line.lstrip().startswith("#") else ENTRY_WIDTH
        assert len(line) <= limit, line


def test_describe_modules_local_shapes():
    from torch import nn

    with __import__("torch").device("meta"):
        emb, linear = nn.Embedding(1000, 64), nn.Linear(64, 30)
        norm = nn.LayerNorm(64)
    assert describe_modules([emb], "RowwiseParallel", 4) == "1 × Embedding [1000, 64] → local [250, 64] at TP=4"
    assert describe_modules([emb], "ColwiseParallel", 4) == "1 × Embedding [1000, 64] → local [1000, 16] at TP=4"
    assert (
        describe_modules([linear, linear], "ColwiseParallel", 4)
        == "2 × Linear [30, 64] → local [8, 64] at TP=4 (uneven split)"
    )
    assert describe_modules([linear], "RowwiseParallel", 2) == "1 × Linear [30, 64] → local [30, 32] at TP=2"
    assert describe_modules([norm], "SequenceParallel", 2) == "1 × LayerNorm [64], replicated at TP=2"
    assert describe_modules([], "ColwiseParallel", 2) == "matches no module of this model"


def test_render_value_and_complete_kwargs():
    from torch.distributed.tensor import Partial, Replicate, Shard

    used: set[str] = set()
    assert render_value((Shard(1),), used) == "(Shard(1),)"
    assert render_value({"hidden_states": Shard(1)}, used) == '{"hidden_states": Shard(1)}'
    assert render_value((Replicate(), None), used) == "(Replicate(), None)"
    assert render_value(Shard(-1), used) == "Shard(-1)"
    assert render_value(Partial(), used) == 'Partial(reduce_op="sum")'
    assert [render_value(v) for v in (None, True, 3)] == ["None", "True", "3"]
    assert used == {"Shard", "Replicate", "Partial"}
    # torch's None defaults are written as the placements torch would pick.
    assert complete_kwargs("ColwiseParallel", {}) == {
        "input_layouts": Replicate(),
        "output_layouts": Shard(-1),
        "use_local_output": True,
    }
    assert complete_kwargs("SequenceParallel", {"sequence_dim": 1}) == {"sequence_dim": 1, "use_local_output": False}
    with pytest.raises(InitError, match="takes no argument"):
        complete_kwargs("ColwiseParallel", {"bogus": 1})


def test_deterministic_bytes(tmp_path):
    a = render_plan_module("qwen3", "generated/qwen3_sp_plan.py", sequence_parallel=True).text
    b = render_plan_module(
        "qwen3", "generated/qwen3_sp_plan.py", sequence_parallel=True, loaded=load_model("qwen3")
    ).text
    assert a == b


# --- the command ------------------------------------------------------------------------------


def test_cli_writes_default_path_and_says_what_next(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("qwen3", "--sequence-parallel")
    assert result.exit_code == 0, result.output
    path = Path("generated/qwen3_sp_plan.py")
    assert path.is_file()
    out = result.output
    assert f"wrote {path}" in out
    assert "seed: the hand-written plan for Qwen3ForCausalLM" in out and "sequence parallel on" in out
    assert f"next: plangen verify {path}" in out
    # Same input, same bytes: running it again changes nothing.
    before = path.read_bytes()
    again = invoke("qwen3", "--sequence-parallel")
    assert again.exit_code == 0 and "already up to date" in again.output
    assert path.read_bytes() == before


def test_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "plan.py"
    path.write_bytes(b"# my edits\nx = 1\n")
    result = invoke("llama", "-o", str(path))
    assert result.exit_code == 2
    assert "--force" in error_line(result)
    assert path.read_bytes() == b"# my edits\nx = 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.py"]


def test_force_keeps_the_previous_file_and_says_so(tmp_path):
    path = tmp_path / "plan.py"
    path.write_bytes(b"# my edits\nx = 1\n")
    result = invoke("llama", "-o", str(path), "--force")
    assert result.exit_code == 0, result.output
    backup = tmp_path / "plan.py.bak"
    assert backup.read_bytes() == b"# my edits\nx = 1\n"
    assert f"kept as {backup}" in result.output
    assert "custom_parallel_plan" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.py", "plan.py.bak"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["llamaa"], "unknown model spec 'llamaa': did you mean llama"),
        (["no/such-model-anywhere"], "in the local Hugging Face cache, and plangen never downloads"),
        (
            [str(LLAMA_405B), "--tp-size", "256"],
            "num_attention_heads=128 is not divisible by the TP size 256: the largest legal TP size for LlamaForCausalLM is 128 (8 without KV head replication)",
        ),
        # Falcon-7B's 71 query heads padded with zero heads: a TP size leaving ranks only pad heads.
        (
            ["falcon", "--tp-size", "128"],
            "num_attention_heads=71 padded to 128 leaves ranks of the TP size 128 with only pad heads (1 per rank): the largest legal TP size for FalconForCausalLM is 71",
        ),
        (["qwen3", "--tp-size", "0"], "--tp-size must be at least 1, got 0"),
        (["qwen3", "--tp-size", "-2"], "--tp-size must be at least 1, got -2"),
        (
            ["xlm", "--sequence-parallel"],
            "--sequence-parallel: no plan for XLMWithLMHeadModel: Hugging Face plans have no sequence parallel",
        ),
        (["llama", "--variant", "fast"], "--variant: unknown plan variant 'fast': expected one of optimized, stable"),
        (
            ["llama", "--variant", "stable", "--sequence-parallel"],
            "--variant stable: the stable variant has no sequence parallel",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_file(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args, "-o", "out/plan.py")
    assert result.exit_code == 2, result.output
    assert message in error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_path_exits_2_with_one_line_and_no_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke("llama", "-o", str(blocker / "sub" / "plan.py"))
    assert result.exit_code == 2, result.output
    assert "cannot" in error_line(result)
    result = invoke("llama", "-o", "/proc/plangen-test/plan.py")
    assert result.exit_code == 2, result.output
    assert "cannot" in error_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_template_override_is_used(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    shipped = (package_template_dir() / "plan.py.j2").read_text()
    (templates / "plan.py.j2").write_text(shipped.replace('"""Tensor-parallel plan for', '"""OUR TEAM\'S plan for'))
    out = tmp_path / "plan.py"
    result = invoke("llama", "-o", str(out), "--template", str(templates))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith('"""OUR TEAM\'S plan for LlamaForCausalLM')
    assert f"--template {templates}" in text  # the regenerate command keeps the override


def test_template_that_renders_invalid_python_is_refused(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "plan.py.j2").write_text(
        "custom_parallel_plan = {\n{% for g in groups %}{{ g.title }}\n{% endfor %}\n"
    )
    out = tmp_path / "plan.py"
    result = invoke("llama", "-o", str(out), "--template", str(templates))
    assert result.exit_code == 2
    assert "is not valid Python" in error_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["templates"]


def test_template_with_an_undefined_variable_is_refused(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "plan.py.j2").write_text("x = {{ no_such_variable }}\n")
    result = invoke("llama", "-o", str(tmp_path / "plan.py"), "--template", str(templates))
    assert result.exit_code == 2
    assert "no_such_variable" in error_line(result)
    assert not (tmp_path / "plan.py").exists()


def test_missing_template_dir_and_non_py_output(tmp_path):
    result = invoke("llama", "-o", str(tmp_path / "p.py"), "--template", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "no such directory" in error_line(result)
    result = invoke("llama", "-o", str(tmp_path / "plan.txt"))
    assert result.exit_code == 2 and ".py" in error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_write_plan_file_is_atomic_and_checks_python(tmp_path):
    path = tmp_path / "plan.py"
    with pytest.raises(InitError, match="not valid Python"):
        write_plan_file(path, "x = (\n")
    assert list(tmp_path.iterdir()) == []
    assert write_plan_file(path, "x = 1\n").backup is None
    assert write_plan_file(path, "x = 1\n").unchanged
    outcome = write_plan_file(path, "x = 2\n", force=True)
    assert outcome.backup == tmp_path / "plan.py.bak"
    assert (path.read_text(), outcome.backup.read_text()) == ("x = 2\n", "x = 1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.py", "plan.py.bak"]  # no temp file left


def test_init_plan_api_creates_missing_directories(tmp_path):
    result = init_plan("llama", tmp_path / "a" / "b" / "plan.py")
    assert result.path.is_file() and result.backup is None and result.next_command.startswith("plangen verify ")


def test_console_script_subprocess(tmp_path):
    script = Path(sys.executable).parent / "plangen"
    command = [str(script)] if script.exists() else [shutil.which("plangen") or "plangen"]
    out = tmp_path / "plan.py"
    done = subprocess.run([*command, "init", "mistral", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout and "next: plangen verify" in done.stdout
    load_custom_plan(str(out))
    bad = subprocess.run(
        [*command, "init", "mistral", "--tp-size", "3", "-o", str(tmp_path / "x.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_init_speed_benchmark():
    """`plangen init` on Llama 3.1 405B within 1.2x of importing torch+transformers and building it on meta."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "init_speed.py"), "--repeat", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ratio:" in done.stdout


# --- the example ------------------------------------------------------------------------------


@pytest.mark.distributed
def test_example_trains_llama_with_the_generated_plan():
    from plangen.distributed.launch import run_distributed

    results = run_distributed(f"{ROOT / 'examples' / 'train_llama.py'}:train", 4, {"steps": 6}, timeout=240)
    losses = results[0]["losses"]
    assert all(r["losses"] == losses for r in results)  # every rank saw the same DP-averaged loss
    assert len(losses) == 6
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.5, losses


# --- plan variants ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["llama", "gemma3_text"])
def test_stable_variant_file_records_it_and_verifies_clean(spec, tmp_path, monkeypatch):
    """``plangen init --variant stable``: o_proj/down_proj column-parallel on their gathered input
    (plangen.plans.variants), the variant recorded and in the regenerate command, levels 1+2 clean."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    from plangen.check import verify_plan_files
    from plangen.check.static import read_plan_metadata

    monkeypatch.chdir(tmp_path)
    (tmp_path / "generated").mkdir()
    result = invoke(spec, "--variant", "stable")
    assert result.exit_code == 0, result.output
    path = tmp_path / "generated" / f"{spec}_stable_plan.py"
    assert "stable variant: no cross-rank sums in the forward" in result.output
    assert read_plan_metadata(path)["PLANGEN_PLAN_VARIANT"] == "stable"
    assert "--tp-size 2 --variant stable --force" in path.read_text()
    styles = load_custom_plan(str(path))
    for key in ("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"):
        style = styles[key]
        assert type(style) is ColwiseParallel and style.input_layouts == (Shard(-1),), key
        assert style.output_layouts == (Replicate(),) and style.use_local_output, key
    assert not any(type(s).__name__ == "RowwiseParallel" and "layers" in k for k, s in styles.items())
    report = verify_plan_files([path])
    assert report.diagnostics == [] and report.notes == []
    again = invoke(spec, "--variant", "stable")  # the same settings: left alone, not refused
    assert again.exit_code == 0 and "already up to date" in again.output


@pytest.mark.parametrize(
    "spec", ["olmo2", "gpt2", "qwen3_moe", "qwen2_moe", "deepseek_v3", "gpt_oss", "llama4", "nemotron_h"]
)
def test_stable_variant_of_every_other_hand_written_family_verifies_clean_and_sums_nothing(spec, tmp_path, monkeypatch):
    """Whole-projection norms (GatheredNormParallel), Conv1D row-parallel projections (column-parallel
    on the gathered input) and experts (kept whole over TP, listed as such in the file): the file has
    no style that sums across ranks in forward, and verifies clean at levels 1+2."""
    from torch.distributed.tensor import Partial, Replicate

    from plangen.check import verify_plan_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "generated").mkdir()
    result = invoke(spec, "--variant", "stable")
    assert result.exit_code == 0, result.output
    path = tmp_path / "generated" / f"{spec}_stable_plan.py"
    styles = load_custom_plan(str(path))
    summing = {
        "RowwiseParallel",
        "Conv1DRowwiseParallel",
        "ExpertsParallel",
        "ShardedNormParallel",
        "AllReduceOutputGrad",
        "GatedRMSNormParallel",
    }
    # The vocab-parallel embedding's all-reduce stays: one rank holds each token's row, the others add zeros.
    embedding = {
        k for k, s in styles.items() if type(s).__name__ == "RowwiseParallel" and s.input_layouts == (Replicate(),)
    }
    assert embedding == ({"model.embeddings"} if spec == "nemotron_h" else {"model.embed_tokens"}) or spec == "gpt2"
    assert not {type(s).__name__ for k, s in styles.items() if k not in embedding} & summing, styles
    outputs = [getattr(getattr(s, "prepare_module_output", s), "output_layouts", None) or () for s in styles.values()]
    assert not any(isinstance(o, Partial) for layouts in outputs for o in layouts)
    if spec == "olmo2":
        assert type(styles["model.layers.*.self_attn.q_norm"]).__name__ == "GatheredNormParallel"
    if spec == "nemotron_h":  # Mamba2 mixers stay split by heads; the gated norm gathers instead of summing
        assert type(styles["model.layers.*.mixer.norm"]).__name__ == "GatheredGatedRMSNormParallel"
        assert type(styles["model.layers.0.mixer"]).__name__ == "Mamba2MixerParallel"
    if "moe" in spec or spec in ("deepseek_v3", "gpt_oss", "llama4"):
        assert "experts whole over TP" in path.read_text()
    report = verify_plan_files([path])
    assert report.diagnostics == [] and report.notes == []


@pytest.mark.parametrize("tp_size", ["2", "4", "8"])
def test_falcon_7b_takes_even_tp_sizes_with_its_heads_padded(tp_size, tmp_path):
    """Its 71 heads padded where the synthesizer reads its attention; where it keeps it whole
    (transformers 5.25.0) any TP size too (init had refused every one above 1 by the head count)."""
    from conftest import falcon_attention_left_whole

    path = tmp_path / "falcon_plan.py"
    result = invoke("falcon", "-o", str(path), "--tp-size", tp_size)
    assert result.exit_code == 0, result.output
    padded = "padded_heads=True" in path.read_text()
    assert padded == (falcon_attention_left_whole() is None)
    assert padded or '\n    "transformer.h.*.self_attention' not in path.read_text()  # only as a comment: kept whole

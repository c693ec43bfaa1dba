"""The docs that say where things live stay true: docs/architecture.md (rendered from the docstrings) and\ndocs/contributing.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "docs" / "contributing.md").read_text()


def _architecture_doc():
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture_doc", ROOT / "scripts" / "architecture_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_map_is_rendered_from_the_docstrings():
    """docs/architecture.md is what ``python scripts/architecture_doc.py`` writes now: a module added,
    moved or redescribed without rerunning it fails here."""
    doc = _architecture_doc()
    assert doc.DOC_PATH.read_text() == doc.render(), "run: python scripts/architecture_doc.py"


def test_the_architecture_map_has_an_entry_for_every_module_and_refuses_one_without_a_docstring(tmp_path):
    doc = _architecture_doc()
    text = doc.DOC_PATH.read_text()
    modules = [p for p in (ROOT / "plangen").rglob("*.py") if p.name != "__init__.py"]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if f"- `{p.relative_to(ROOT)}`:" not in text)
    assert not missing
    for package in {p.parent for p in modules}:
        assert f"## `{package.relative_to(ROOT)}/`" in text
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    doc.ROOT, saved = tmp_path, doc.ROOT
    try:
        with pytest.raises(doc.MissingDocstring, match="bare.py has no docstring"):
            doc._entry(bare)
    finally:
        doc.ROOT = saved


def test_readme_points_to_the_architecture_map():
    assert "`docs/architecture.md`" in README and "| file | holds |" not in README


def test_readme_links_the_contributing_guide():
    assert "`docs/contributing.md`" in README


def test_readme_uses_the_plan_sources_vocabulary():
    from plangen.plans.choice import SOURCES

    assert "hand-written" in SOURCES and "optimized" not in README.lower()


def test_contributing_names_only_files_that_exist():
    names = set(re.findall(r"`((?:plangen|tests|scripts|docs|benchmarks|generated)/[\w./]+?)(?:::\w+)?`", CONTRIBUTING))
    names = {n for n in names if "*" not in n and "<" not in n}
    assert names, "no paths found"
    for name in sorted(names):
        assert (ROOT / name).exists(), f"docs/contributing.md names {name}, which does not exist"


def test_contributing_names_only_tests_that_exist():
    tests_text = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for name in sorted(set(re.findall(r"`(?:tests/[\w.]+::)?(test_\w+)`", CONTRIBUTING))):
        assert f"def {name}(" in tests_text, f"docs/contributing.md names {name}, which no test defines"


# The names docs/contributing.md tells a contributor to use, where it says they live.
NAMED = [
    ("plangen.plans.choice", "choose_plan"),
    ("plangen.plans.registry", "register_plan"),
    ("plangen.plans.registry", "HAND_WRITTEN"),
    ("plangen.plans.registry", "CHECKPOINT_FILTERS"),
    ("plangen.plans.dense", "build_dense_decoder_plan"),
    ("plangen.plans.moe", "build_moe_decoder_plan"),
    ("plangen.plans.hybrid", "checkpoint_nemotron_h_block"),
    ("plangen.plan", "Plan"),
    ("plangen.plan", "PlanEntry"),
    ("plangen.plan", "Replicated"),
    ("plangen.plan", "GROUPS"),
    ("plangen.styles", "STYLE_CLASSES"),
    ("plangen.styles", "HF_UNSUPPORTED_STYLES"),
    ("plangen.plan.style_facts", "StyleFacts"),
    ("plangen.plan.style_table", "STYLE_FACTS"),
    ("plangen.plan.style_table", "STYLE_PARAMS"),
    ("plangen.styles.base", "PlangenStyle"),
    ("plangen.styles.local_tensors", "run_on_local_tensors"),
    ("plangen.styles.hf_strings", "HF_STYLE_SPECS"),
    ("plangen.plan.style_facts", "ValueKind"),
    ("plangen.check.known_styles", "HF_STYLE_EQUIVALENTS"),
    ("plangen.check.rule", "Rule"),
    ("plangen.check.plan_file", "StaticRule"),
    ("plangen.check.plan_file", "Invalid"),
    ("plangen.check.model_plan", "ModelRule"),
    ("plangen.check.model_plan", "ModelPlan"),
    ("plangen.check.rules", "discover"),
    ("plangen.check.model", "MODEL_RULES"),
    ("plangen.check.model", "PlanLoadFailureRule"),
    ("plangen.check.codes", "CODES"),
]


@pytest.mark.parametrize(("module", "name"), NAMED, ids=lambda v: v)
def test_contributing_names_live_where_it_says(module, name):
    assert re.search(rf"\b{name}\b", CONTRIBUTING), f"{name} is no longer in docs/contributing.md: drop it here"
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} does not exist"

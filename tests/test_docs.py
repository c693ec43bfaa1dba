"""The docs that say where things live stay true: README's architecture table and docs/contributing.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "docs" / "contributing.md").read_text()


def _architecture_rows() -> list[tuple[str, str]]:
    section = README.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return [(first.strip(), second.strip()) for first, second in rows]


def _named_paths(cell: str) -> list[Path]:
    """The paths a table cell names; a bare name (`hybrid.py`) is in the folder of the one before it,
    and a pattern (`rules_*.py`) names every file it matches (at least one)."""
    paths: list[Path] = []
    folder = ROOT
    for name in re.findall(r"`([^`]+)`", cell):
        path = ROOT / name if "/" in name else folder / name
        folder = path if name.endswith("/") else path.parent
        if "*" in path.name:
            matched = sorted(path.parent.glob(path.name))
            paths += matched or [path]  # no match: reported as missing
        else:
            paths.append(path)
    return paths


def test_architecture_table_names_only_what_exists():
    for first, _ in _architecture_rows():
        for path in _named_paths(first):
            assert path.exists(), f"README's architecture table names {path.relative_to(ROOT)}, which does not exist"


def test_architecture_table_has_a_row_for_every_module():
    covered: set[Path] = set()
    for first, _ in _architecture_rows():
        for path in _named_paths(first):
            covered |= set(path.rglob("*")) if path.is_dir() else {path}
    modules = [p for p in (ROOT / "plangen").rglob("*.py") if p.name != "__init__.py" or p.parent.name == "plans"]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if p not in covered)
    assert not missing, f"README's architecture table has no row for {missing}"


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
    ("plangen.styles", "HF_STYLE_SPECS"),
    ("plangen.styles", "HF_UNSUPPORTED_STYLES"),
    ("plangen.style_facts", "StyleFacts"),
    ("plangen.style_facts", "STYLE_FACTS"),
    ("plangen.style_facts", "PLANGEN_STYLES"),
    ("plangen.check.known_styles", "STYLES"),
    ("plangen.check.known_styles", "StyleParam"),
    ("plangen.check.known_styles", "HF_STYLE_EQUIVALENTS"),
    ("plangen.check.rule", "Rule"),
    ("plangen.check.plan_file", "StaticRule"),
    ("plangen.check.plan_file", "Invalid"),
    ("plangen.check.model_plan", "ModelRule"),
    ("plangen.check.model_plan", "ModelPlan"),
    ("plangen.check.rules_structure", "STRUCTURE_RULES"),
    ("plangen.check.rules_styles", "STYLE_RULES"),
    ("plangen.check.rules_placements", "PLACEMENT_RULES"),
    ("plangen.check.rules_model", "SHAPE_RULES"),
    ("plangen.check.rules_model_regions", "REGION_RULES"),
    ("plangen.check.rules_run", "RUN_RULES"),
    ("plangen.check.model", "MODEL_RULES"),
    ("plangen.check.model", "PlanLoadFailureRule"),
    ("plangen.check.codes", "CODES"),
    ("plangen.check.codes", "RULE_CLASSES"),
]


@pytest.mark.parametrize(("module", "name"), NAMED, ids=lambda v: v)
def test_contributing_names_live_where_it_says(module, name):
    assert re.search(rf"\b{name}\b", CONTRIBUTING), f"{name} is no longer in docs/contributing.md: drop it here"
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} does not exist"

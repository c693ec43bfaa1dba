"""plangen's layering, checked on the source: no import cycles, the runtime and the CLI on top, small modules.

The import graph is read statically (ast), so it sees every import, including those inside
functions that only run on some paths. Imports under ``if TYPE_CHECKING:`` are left out: they
never run, and annotations may name any layer.
"""

from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "plangen"
# The stages, lowest first: a module imports only from its own stage or a lower one. A stage is a
# package under plangen/ (or one of the public modules beside them); the package's __init__ holds only
# the version, and sits at the bottom.
STAGES = (
    ("plangen", "plangen.output"),  # one-line errors, files written safely
    ("plangen.stack",),  # the torch and transformers releases and their differences
    ("plangen.model",),  # a Hugging Face model: resolved, its tree, heads, tiny versions
    ("plangen.plan",),  # a plan as data, the words styles are described in
    ("plangen.distributed",),  # launching ranks, the fake group, counting collectives
    ("plangen.styles",),  # the parallel styles
    ("plangen.plans",),  # which plan a model gets, hand-written and synthesized
    ("plangen.runtime", "plangen.parallelize", "plangen.loss"),  # applying plans; the public runtime
    ("plangen.check",),  # plangen verify
    ("plangen.cost",),  # plangen cost
    ("plangen.commands", "plangen.__main__"),  # the CLI and its commands' cores
)
RANK = {name: rank for rank, names in enumerate(STAGES) for name in names}
# `python -m plangen` is the CLI's other entry point.
MAY_IMPORT_CLI = {"plangen.commands.cli", "plangen.__main__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST):
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _target(name: str) -> str | None:
    """The plangen module an import of ``name`` loads (the longest existing prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from plangen.check import model` loads the module plangen.check.model; `from
            # plangen.check import verify_plan_files` loads plangen.check (its __init__).
            names = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names
            ]
        for name in names:
            if name == "plangen" or name.startswith("plangen."):
                target = _target(name)
                if target is not None and target != module:
                    found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    return {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def test_the_graph_reader_sees_function_level_and_relative_imports(tmp_path):
    assert "plangen.check.run" in MODULES and "plangen.check" in MODULES
    # check/run imports the runtime inside a function only.
    assert "plangen.parallelize" in _imports("plangen.check.run")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles among plangen modules: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_only_the_entry_points_import_the_cli():
    importers = sorted(
        m for m, targets in _graph().items() if "plangen.commands.cli" in targets and m not in MAY_IMPORT_CLI
    )
    assert not importers, f"these modules import plangen.commands.cli: {importers}"


def _stage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_module_belongs_to_a_stage():
    unplaced = sorted({_stage(m) for m in MODULES} - set(RANK))
    assert not unplaced, f"top-level entries of plangen/ in no stage of STAGES: {unplaced}"


def _stage_rank(module: str) -> int | None:
    return RANK.get(_stage(module))


def _upward(graph: dict[str, set[str]], level) -> list[str]:
    """Each import from a module up to one of a higher ``level`` (modules ``level`` places nowhere: None)."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if level(m) is not None and level(t) is not None and level(t) > level(m)
    )


def test_no_stage_imports_a_higher_one():
    upward = _upward(_graph(), _stage_rank)
    assert not upward, "imports from a lower stage up to a higher one: " + "; ".join(upward)


def test_the_stage_reader_sees_an_upward_import():
    # The check stage imports the runtime below it: allowed; the runtime importing check is flagged.
    graph = {"plangen.check.run": {"plangen.parallelize"}, "plangen.runtime.compile": {"plangen.check.model"}}
    assert _upward(graph, _stage_rank) == ["plangen.runtime.compile -> plangen.check.model"]


def test_the_top_level_is_about_a_dozen_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))
    packages = [e for e in entries if (PACKAGE / e / "__init__.py").exists()]
    assert len(entries) <= 16 and len(packages) >= 10, entries


def test_the_wheel_lists_every_package():
    """pyproject.toml names plangen's packages one by one (the templates live outside plangen/, so
    setuptools' finder cannot be used); a package missing there would be missing from a wheel."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert packages | {"plangen.templates"} == listed


# Inside plans: reading a block's source, then the families that recognize and plan blocks, then the
# synthesizer that asks them; the choice above all three.
PLANS_ORDER = ("plangen.plans.source", "plangen.plans.families", "plangen.plans.synthesis")


def test_inside_plans_the_source_readers_families_and_synthesizer_are_layered():
    def level(module: str) -> int | None:
        return next((i for i, p in enumerate(PLANS_ORDER) if module == p or module.startswith(p + ".")), None)

    upward = _upward(_graph(), level)
    assert not upward, "; ".join(upward)

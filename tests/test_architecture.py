"""plangen's layering, checked on the source: no import cycles, the runtime and the CLI on top, small modules.

The import graph is read statically (ast), so it sees every import, including those inside
functions that only run on some paths. Imports under ``if TYPE_CHECKING:`` are left out: they
never run, and annotations may name any layer.
"""

from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "plangen"
# What runs plans on processes: the runtime itself, the commands around it, `plangen verify --run`
# and `plangen cost --peak` (plangen.cost.peak), which run a plan through the runtime's FSDP2 and
# activation checkpointing on purpose. Everything else (plans, their checks,
# styles, the module tree, models, rendering, cost's measurements) sits below and never imports it.
MAY_IMPORT_RUNTIME = {
    "plangen.parallelize",
    "plangen.cli",
    "plangen.__main__",
    "plangen.check.run",
    "plangen.check.fake_run",
    "plangen.cost.peak",
}
# `python -m plangen` is the CLI's other entry point.
MAY_IMPORT_CLI = {"plangen.cli", "plangen.__main__"}


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
    importers = sorted(m for m, targets in _graph().items() if "plangen.cli" in targets and m not in MAY_IMPORT_CLI)
    assert not importers, f"these modules import plangen.cli: {importers}"


def test_lower_modules_never_import_the_runtime():
    importers = sorted(
        m for m, targets in _graph().items() if "plangen.parallelize" in targets and m not in MAY_IMPORT_RUNTIME
    )
    assert not importers, f"below the runtime, these import plangen.parallelize: {importers}"

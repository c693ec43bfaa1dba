"""Level 1 of ``plangen verify``: check a plan file's source without importing or running it.

The file is compiled (to get Python's own syntax errors) and parsed with libcst, never executed: a
plan whose top level writes files or raises is checked safely, and torch is not imported, so the
check is fast enough for editors, pre-commit hooks and CI. Its rules are found in
:mod:`plangen.check.rules.static` (the file's structure, PG0xx; styles, arguments and placements,
PG1xx), in the style of Fixit: each a class with its code, story, message, check and valid/invalid
examples.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, Iterator

import libcst as cst

from plangen.check.diagnostics import Diagnostic, drop_ignored
from plangen.check.plan_file import PlanFile, StaticRule
from plangen.check.rules import discover
from plangen.check.rules.static.structure import SyntaxErrorRule, check_syntax

# Every level-1 rule (plangen/check/rules/static/), in code order.
RULES: tuple[StaticRule, ...] = tuple(rule() for rule in discover("static"))  # type: ignore[misc]


def decode_source(data: bytes) -> str:
    """Decode like Python's import system does (coding cookie, BOM, universal newlines)."""
    return importlib.util.decode_source(data)


def check_static_source(source: str | bytes, path: str = "<plan>") -> list[Diagnostic]:
    """Level-1 findings for one plan file's source, sorted; the source is parsed, never run."""
    if isinstance(source, bytes):
        try:
            source = decode_source(source)
        except (UnicodeDecodeError, SyntaxError) as error:
            message = f"syntax error: cannot decode the file: {error}"
            return [Diagnostic(path, 1, 1, SyntaxErrorRule.code, message, SyntaxErrorRule.severity)]
    syntax_error = check_syntax(source, path)
    if syntax_error is not None:
        return [syntax_error]
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:  # Python accepts what libcst cannot parse (rare)
        return [
            Diagnostic(
                path,
                error.editor_line,
                error.editor_column,
                SyntaxErrorRule.code,
                f"libcst cannot parse the file: {error.message}",
                SyntaxErrorRule.severity,
            )
        ]
    plan = PlanFile(module)
    findings = [(rule, node, message) for rule in RULES for node, message in rule.check(plan)]
    if not findings:
        return []
    diagnostics = [
        Diagnostic(path, *plan.position(node), rule.code, message, rule.severity) for rule, node, message in findings
    ]
    return sorted(set(drop_ignored(diagnostics, plan.ignore_comments())))


def check_static(path: str | Path) -> list[Diagnostic]:
    """Level-1 findings for the plan file at ``path``; raises OSError if it cannot be read."""
    return check_static_source(Path(path).read_bytes(), str(path))


def read_plan_metadata(path: str | Path) -> dict[str, Any]:
    """The ``PLANGEN_*`` constants a generated plan file carries, read without running it.

    Only module-level assignments of literals count (``PLANGEN_TP_SIZE = 2``); anything else, and a
    file that does not parse, yields no entry.
    """
    return read_plan_metadata_source(Path(path).read_bytes())


def read_plan_metadata_source(source: str | bytes) -> dict[str, Any]:
    try:
        tree = ast.parse(decode_source(source) if isinstance(source, bytes) else source)
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return {}
    metadata: dict[str, Any] = {}
    for targets, value in _module_assignments(tree):
        for target in targets:
            if isinstance(target, ast.Name) and target.id.startswith("PLANGEN_"):
                try:
                    metadata[target.id] = ast.literal_eval(value)
                except ValueError:
                    metadata.pop(target.id, None)  # no longer a known constant
    return metadata


def read_constant_position(path: str | Path, name: str) -> tuple[int, int]:
    """Where the module-level constant ``name`` is given its value in the file (1, 1 if nowhere)."""
    try:
        tree = ast.parse(decode_source(Path(path).read_bytes()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return 1, 1
    for targets, value in _module_assignments(tree):
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return value.lineno, value.col_offset + 1
    return 1, 1


def _module_assignments(tree: ast.Module) -> Iterator[tuple[list[ast.expr], ast.expr]]:
    """(targets, value) of each module-level assignment, annotated ones with a value included."""
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            yield statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            yield [statement.target], statement.value

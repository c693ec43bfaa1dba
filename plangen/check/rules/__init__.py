"""The diagnostic rules of ``plangen verify``, one class per code, found by level rather than listed.

- ``plangen/check/rules/static/``: level 1, read from the plan file's source, never run, no torch:
  its structure (PG0xx), its styles, their arguments and placements (PG1xx);
- ``plangen/check/rules/model/``: level 2, the plan against the model on the meta device, then the
  layouts through a shrunk model and one step on a fake process group (PG2xx), and the rules of
  the runtime a plan is handed to (``--target``);
- ``plangen/check/rules/run.py``: level 3's codes, which the run itself emits (PG3xx).

:func:`discover` imports every module of a level and returns the rules defined there: a new rule is
a class in the module of its concern (or a new module in its level's folder), nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from plangen.check.rule import Level, Rule, defined_rules

# The module or package each level's rules are defined in.
_HOMES: dict[Level, str] = {
    "static": "plangen.check.rules.static",
    "model": "plangen.check.rules.model",
    "run": "plangen.check.rules.run",
    "load": "plangen.check.model",
}


def discover(level: Level) -> tuple[type[Rule], ...]:
    """Every rule of ``level``, in code order: the modules of its home imported, its classes read."""
    home = importlib.import_module(_HOMES[level])
    for module in pkgutil.iter_modules(getattr(home, "__path__", [])):
        importlib.import_module(f"{home.__name__}.{module.name}")
    return defined_rules(level)


def discover_all() -> tuple[type[Rule], ...]:
    """Every rule of every level, in code order."""
    return tuple(sorted((rule for level in _HOMES for rule in discover(level)), key=lambda r: r.code))

"""The base of every diagnostic rule: a code and its story, as Fixit rules and Ruff's violations carry theirs.

A rule is a small class: its ``code`` (stable, never reused), a ``title``, an ``explanation``, a
``wrong`` and a ``right`` example file, a ``severity``, its ``level``, and (for the rules that find
things in a file) a ``check`` method beside them. Level-1 rules subclass
:class:`plangen.check.plan_file.StaticRule`, level-2 rules :class:`plangen.check.model_plan.ModelRule`.
A class of plangen's that declares a code is registered by being defined (:func:`defined_rules`);
:mod:`plangen.check.rules` finds each level's rules by importing its modules, and
:mod:`plangen.check.codes` collects them all into the registry and ``docs/diagnostics.md``.

Examples of levels 2 and 3 carry their model as generated files do (``PLANGEN_MODEL = "llama"``);
the tests run every wrong and right example. Nothing here imports torch or libcst.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

Severity = Literal["error", "warning"]
# Where a rule's code is found: level 1 in the source, level 2 against the model (meta device, then
# a shrunk model), level 3 in a run; "load": by the loader that hands level 2 its plan (PG201).
Level = Literal["static", "model", "run", "load"]

# The import lines examples (and rules' own valid/invalid files) start with.
TP_IMPORT = "from torch.distributed.tensor.parallel import"
DTENSOR_IMPORT = "from torch.distributed.tensor import"


@dataclass(frozen=True)
class CodeInfo:
    """A code's story as the registry and the docs show it."""

    code: str
    title: str
    explanation: str
    wrong: str
    right: str
    severity: Severity = "error"


class Rule:
    """A diagnostic code and its story.

    Errors set verify's exit status; a warning reports something right but likely not what was
    meant, and counts only under ``--strict``. ``wrong`` and ``right`` are whole plan files; they
    are stored with exactly one trailing newline, however the class writes them.
    """

    code: ClassVar[str]
    title: ClassVar[str]
    explanation: ClassVar[str]
    wrong: ClassVar[str]
    right: ClassVar[str]
    severity: ClassVar[Severity] = "error"
    level: ClassVar[Level]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("wrong", "right"):
            if name in cls.__dict__:
                setattr(cls, name, cls.__dict__[name].strip("\n") + "\n")
        # plangen's own rules only: a subclass made elsewhere (a test's) is not one of verify's checks.
        if "code" in cls.__dict__ and cls.__module__.startswith("plangen."):
            _DEFINED.append(cls)

    @classmethod
    def info(cls) -> CodeInfo:
        return CodeInfo(cls.code, cls.title, cls.explanation, cls.wrong, cls.right, cls.severity)


_DEFINED: list[type[Rule]] = []


def defined_rules(level: Level | None = None) -> tuple[type[Rule], ...]:
    """plangen's rule classes defined so far (of ``level`` only, when given), in code order."""
    return tuple(sorted((r for r in _DEFINED if level is None or r.level == level), key=lambda r: r.code))

"""Plan keys against a module tree, under torch's own matching rule.

``parallelize_module`` splits a key on dots and matches each segment against child names with
``fnmatch``; a key therefore matches a module path with the same number of segments whose every
segment matches. Torch only warns when a key matches nothing; plangen makes that an error.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable

from torch import nn


def key_matches(pattern: str, module_path: str) -> bool:
    atoms, parts = pattern.split("."), module_path.split(".")
    return len(atoms) == len(parts) and all(fnmatchcase(p, a) for p, a in zip(parts, atoms))


def find_matching_modules(model: nn.Module, pattern: str) -> list[str]:
    """Paths of the modules that ``pattern`` selects, in module order."""
    return [name for name, _ in model.named_modules() if name and key_matches(pattern, name)]


def find_unmatched_keys(model: nn.Module, patterns: Iterable[str]) -> list[str]:
    names = [name for name, _ in model.named_modules() if name]
    return [p for p in patterns if not any(key_matches(p, n) for n in names)]

"""The torch and transformers releases plangen supports, and whether the installed pair is inside.

One place for the window: ``pyproject.toml``'s dependency bounds, ``plangen --version`` and
``plangen doctor``, the README and ``docs/compat.md`` say what is written here (a test keeps
``pyproject.toml`` in step). The window's ends are the releases the test suite and the sweep run
on: NeMo RL's pins (torch 2.11.0, transformers 5.5-5.8) at the low end, the newest releases at the
high end. Versions are read from the installed distributions' metadata: nothing here imports torch
or transformers, so ``--version`` stays instant.

What differs between the releases of the window is answered beside it, each library in one module
that nothing else bypasses: :mod:`~plangen.stack.torch_compat` (torch's version-dependent and private
names) and :mod:`~plangen.stack.transformers_compat` (transformers' renamed internals and changed
model code).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

# (lowest, highest) release tested, inclusive; a release between them is inside the window.
SUPPORTED = {
    "torch": ("2.11.0", "2.15.0"),
    "transformers": ("5.5.0", "5.25.0"),
}
# The pair the shipped proofs and the test suite's figures were made on (the test extra's pins).
PINNED = {"torch": "2.13.0", "transformers": "5.24.0"}


@dataclass(frozen=True)
class Installed:
    package: str
    version: str | None  # None: not installed

    @property
    def inside(self) -> bool:
        if self.version is None:
            return False
        low, high = SUPPORTED[self.package]
        return release(low) <= release(self.version) <= release(high)

    def describe(self) -> str:
        low, high = SUPPORTED[self.package]
        if self.version is None:
            return f"{self.package} not installed (supported: {low} to {high})"
        where = "inside" if self.inside else "OUTSIDE"
        return f"{self.package} {self.version} ({where} the tested window {low} to {high})"


def release(version: str) -> tuple[int, ...]:
    """``2.13.0+cpu`` -> (2, 13, 0); a pre-release counts as its release (``5.26.0.dev0`` -> 5.26.0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts + [0] * (3 - len(parts)))


def installed_versions() -> list[Installed]:
    found = []
    for package in SUPPORTED:
        try:
            found.append(Installed(package, metadata.version(package)))
        except metadata.PackageNotFoundError:
            found.append(Installed(package, None))
    return found


def stack_report() -> tuple[bool, list[str]]:
    """Whether every package is inside the window, and a line for each."""
    stack = installed_versions()
    return all(i.inside for i in stack), [i.describe() for i in stack]


def recorded_stack() -> dict[str, str]:
    """The releases a proof made here is recorded with (local tags such as ``+cpu`` dropped)."""
    return {i.package: (i.version or "none").split("+")[0] for i in installed_versions()}

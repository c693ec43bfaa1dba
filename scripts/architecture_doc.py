"""Write docs/architecture.md, the map of the code, from the package's own docstrings.

Each package is a section opened by its docstring; each module is one entry, the first paragraph of
its docstring. The docstrings are the truth (they sit beside the code they describe); the map is
rendered from them, and ``tests/test_docs.py`` fails when the committed map differs from a fresh
rendering or a module has no docstring:

    python scripts/architecture_doc.py
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC_PATH = ROOT / "docs" / "architecture.md"
WIDTH = 100

_INTRO = """\
# Architecture

The map of the code, rendered from the docstrings of its packages and modules by
`python scripts/architecture_doc.py` (a test keeps it current: edit the docstring, then rerun).
Where to add a plan, a style, a block family or a diagnostic, step by step: `docs/contributing.md`.
"""

# Sections in the order a reader meets them: the package and its top-level stages, then each
# subpackage, then the tooling around it.
_SECTIONS = (
    "plangen",
    "plangen/output",
    "plangen/stack",
    "plangen/model",
    "plangen/plan",
    "plangen/distributed",
    "plangen/styles",
    "plangen/plans",
    "plangen/plans/families",
    "plangen/plans/source",
    "plangen/plans/synthesis",
    "plangen/runtime",
    "plangen/check",
    "plangen/check/rules",
    "plangen/check/rules/static",
    "plangen/check/rules/model",
    "plangen/cost",
    "plangen/commands",
    "scripts",
    "benchmarks",
)
_TOOLING = {
    "scripts": "Maintenance commands: regenerate the generated files and docs, run the sweeps.",
    "benchmarks": "plangen measured against the alternatives, each figure with its goal (`docs/benchmarks.md`).",
}


class MissingDocstring(ValueError):
    """A module the map would have to describe from nothing."""


def _docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise MissingDocstring(f"{path.relative_to(ROOT)} has no docstring: the architecture map is made of them")
    return doc


def _markdown(text: str) -> str:
    """reStructuredText's roles and literals, as Markdown code spans."""
    text = re.sub(r":(?:mod|func|class|data|meth|attr|exc):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _paragraphs(doc: str) -> list[str]:
    """The docstring's paragraphs, each on one line; a bulleted paragraph as one entry per item."""
    paragraphs = []
    for block in (b for b in doc.split("\n\n") if b.strip()):
        lines = block.strip().splitlines()
        if not lines[0].lstrip().startswith(("* ", "- ")):
            paragraphs.append(_markdown(" ".join(block.split())))
            continue
        items: list[str] = []
        for line in lines:
            if line.lstrip().startswith(("* ", "- ")):
                items.append(line.lstrip()[2:])
            else:
                items[-1] += " " + line.strip()
        paragraphs += [f"- {_markdown(' '.join(item.split()))}" for item in items]
    return paragraphs


def _wrapped(paragraph: str) -> str:
    indent = "  " if paragraph.startswith("- ") else ""
    return textwrap.fill(paragraph, WIDTH, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def _entry(path: Path) -> str:
    first = _paragraphs(_docstring(path))[0]
    return _wrapped(f"- `{path.relative_to(ROOT)}`: {first}")


def _section(folder: str) -> list[str]:
    directory = ROOT / folder
    init = directory / "__init__.py"
    lines = [f"## `{folder}/`", ""]
    paragraphs = _paragraphs(_docstring(init)) if init.exists() else [_TOOLING[folder]]
    for previous, paragraph in zip([None, *paragraphs], paragraphs):
        if previous is not None and not (previous.startswith("- ") and paragraph.startswith("- ")):
            lines.append("")  # a blank line between paragraphs, none between a list's items
        lines.append(_wrapped(paragraph))
    lines.append("")
    modules = sorted(p for p in directory.glob("*.py") if p.name != "__init__.py")
    lines += [_entry(p) for p in modules]
    lines.append("")
    return lines


def render() -> str:
    """The text of docs/architecture.md for the code as it is now."""
    lines = [_INTRO]
    for folder in _SECTIONS:
        lines += _section(folder)
    packages = sorted(
        str(p.parent.relative_to(ROOT)) for p in (ROOT / "plangen").rglob("__init__.py") if p.parent != ROOT / "plangen"
    )
    unmapped = [p for p in packages if p not in _SECTIONS]
    if unmapped:
        raise MissingDocstring(
            f"packages without a section in the architecture map: {unmapped} (add them to _SECTIONS)"
        )
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    text = render()
    if DOC_PATH.exists() and DOC_PATH.read_text(encoding="utf-8") == text:
        print(f"{DOC_PATH.relative_to(ROOT)}: already current")
    else:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"{DOC_PATH.relative_to(ROOT)}: written")
    sys.exit(0)

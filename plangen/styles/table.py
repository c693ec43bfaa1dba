"""Writes :mod:`plangen.plan.style_table`, the torch-free table of every registered style, from the classes.

``plangen verify --static`` and ``plangen init`` must not import torch, so what they need to know
of each style (its facts, where a plan file imports it from, its keyword parameters as far as a
literal can show them) is written out as Python literals. The classes are the truth; this module
reads them (``inspect.signature`` for the parameters) and renders the table, and
``tests/test_styles.py`` fails when the committed table differs from a fresh rendering:

    python -m plangen.styles.table
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from plangen.plan.style_facts import REQUIRED, VALUE_KINDS, StyleFacts
from plangen.styles import STYLE_CLASSES, STYLE_FACTS

TABLE_PATH = Path(__file__).resolve().parent.parent / "plan" / "style_table.py"

_HEADER = '''"""Every registered parallel style's facts and keyword parameters, as data that needs no torch.

Generated from the style classes (:mod:`plangen.styles`) by ``python -m plangen.styles.table``: do
not edit; ``tests/test_styles.py`` compares it with a fresh rendering.
"""

from __future__ import annotations

from plangen.plan.style_facts import (
{kinds}
    REQUIRED,
    StyleFacts,
    StyleParam,
)
'''

_KIND_NAMES = {kind: name for name, kind in VALUE_KINDS.items()}


class StyleSignatureError(TypeError):
    """A registered style's signature the static checks cannot describe."""


def _annotation_text(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return text.replace("torch.distributed.tensor.placement_types.", "")


def _kind_name(cls: type, parameter: inspect.Parameter) -> str:
    text = _annotation_text(parameter.annotation)
    if text == "Any":  # passed on to a torch base class: its annotation is the contract
        for base in cls.__mro__[1:]:
            if parameter.name in getattr(base.__init__, "__annotations__", {}):
                text = _annotation_text(inspect.signature(base).parameters[parameter.name].annotation)
                break
    kind = next((k for k in VALUE_KINDS.values() if k.name == text), None)
    if kind is None:
        known = ", ".join(sorted(k.name for k in VALUE_KINDS.values()))
        raise StyleSignatureError(
            f"{cls.__name__}({parameter.name}: {text}): an annotation the static checks have no value kind for "
            f"(known: {known})"
        )
    return _KIND_NAMES[kind]


def style_params(cls: type) -> list[tuple[str, str, object]]:
    """``(name, kind, default)`` of each keyword parameter of ``cls``; positional ones are refused,
    since plan files are checked for keywords only (PG105)."""
    params = []
    for parameter in inspect.signature(cls).parameters.values():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise StyleSignatureError(f"{cls.__name__}: parameter {parameter.name!r} must be keyword-only")
        default = REQUIRED if parameter.default is inspect.Parameter.empty else parameter.default
        params.append((parameter.name, _kind_name(cls, parameter), default))
    return params


def _literal(value: object) -> str:
    """``value`` as Python source in the formatter's style (double quotes)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        items = [_literal(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return repr(value)


def _facts_literal(facts: StyleFacts) -> str:
    fields = [f"role={_literal(facts.role)}"]
    for field in dataclasses.fields(StyleFacts):
        if field.name == "role":
            continue
        value = getattr(facts, field.name)
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
        if value != default:
            fields.append(f"{field.name}={_literal(value)}")
    return "StyleFacts(\n" + "".join(f"        {f},\n" for f in fields) + "    )"


def render_table() -> str:
    """The text of :mod:`plangen.plan.style_table` for the styles registered now, sorted by name."""
    names = sorted(STYLE_CLASSES)
    params = {name: style_params(STYLE_CLASSES[name]) for name in names}
    kinds = sorted({kind for rows in params.values() for _, kind, _ in rows})
    lines = [_HEADER.format(kinds="".join(f"    {k},\n" for k in kinds).rstrip("\n")), ""]
    lines.append("# What each style does to the module it is applied to.")
    lines.append("STYLE_FACTS: dict[str, StyleFacts] = {")
    lines += [f"    {_literal(name)}: {_facts_literal(STYLE_FACTS[name])}," for name in names]
    lines.append("}")
    lines.append("")
    lines.append("# Each style's keyword-only parameters: name, the kind of literal it takes, its default.")
    lines.append("STYLE_PARAMS: dict[str, tuple[StyleParam, ...]] = {")
    for name in names:
        rows = [f"StyleParam({_literal(p)}, {kind}, {_literal(default)})," for p, kind, default in params[name]]
        one_line = f"    {_literal(name)}: ({''.join(rows)}),"
        if len(rows) <= 1 and len(one_line) <= 120:  # as ruff format writes it
            lines.append(one_line)
        else:
            lines.append(f"    {_literal(name)}: (\n" + "".join(f"        {row}\n" for row in rows) + "    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_table(path: Path = TABLE_PATH) -> bool:
    """Write the table at ``path`` if it differs (atomically); whether it was written."""
    text = render_table()
    if path.exists() and path.read_text() == text:
        return False
    # Not plangen.output.files: that imports plan rendering, which reads the table being written.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


if __name__ == "__main__":
    written = write_table()
    print(f"{TABLE_PATH}: {'written' if written else 'already current'}")
    sys.exit(0)

"""Render plan data as Python source through jinja2 templates, and refuse what does not parse.

Two halves, both pure:

* values: :func:`render_value` writes a keyword argument (placements, tuples, dicts, literals) as
  the Python expression that builds it, and records which placement classes it used, so the
  generated import block names exactly what the file needs;
* templates: :func:`build_environment` loads templates from a user directory first (``--template
  DIR``), then from the package (``templates/`` in the repository, ``plangen.templates`` once
  installed), with ``StrictUndefined`` so a misspelt variable fails instead of rendering empty.

:func:`check_python` parses the rendered text with libcst; callers write nothing that fails it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Mapping

from plangen.errors import one_line

PLAN_TEMPLATE = "plan.py.j2"
# Comments and imports wrap past LINE_WIDTH; a plan entry stays on one line up to ENTRY_WIDTH, so
# that the usual entries read one a line (the templates decide how to wrap the others).
LINE_WIDTH = 120
ENTRY_WIDTH = 140


class RenderError(ValueError):
    """A value, template or rendered text that cannot become a valid plan module; one line."""


# ---------------------------------------------------------------------------------------------
# Values


def render_value(value: Any, used: set[str] | None = None) -> str:
    """``value`` as a Python expression: ``Shard(1)``, ``(Replicate(),)``, ``{"x": Shard(1)}``, literals.

    Placement class names are added to ``used`` (when given).
    """
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    used = set() if used is None else used
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, _StridedShard):  # a Shard subclass with no public constructor
        raise RenderError(f"cannot write the private placement {value!r} in a plan file")
    if isinstance(value, Shard):
        used.add("Shard")
        return f"Shard({value.dim})"
    if isinstance(value, Replicate):
        used.add("Replicate")
        return "Replicate()"
    if isinstance(value, Partial):
        used.add("Partial")
        return f"Partial(reduce_op={json.dumps(value.reduce_op)})"
    if isinstance(value, tuple):
        items = [render_value(v, used) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(render_value(v, used) for v in value)}]"
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise RenderError(f"cannot write a dict with the non-string key {key!r} in a plan file")
            pairs.append(f"{render_value(key, used)}: {render_value(item, used)}")
        return "{" + ", ".join(pairs) + "}"
    raise RenderError(f"cannot write a value of type {type(value).__name__} ({value!r}) in a plan file")


def render_arguments(kwargs: Mapping[str, Any], used: set[str] | None = None) -> list[str]:
    """``["name=value", ...]`` in the order given."""
    return [f"{name}={render_value(value, used)}" for name, value in kwargs.items()]


# ---------------------------------------------------------------------------------------------
# Templates


def package_template_dir() -> Path:
    """Where the shipped templates are: ``plangen/templates`` installed, ``templates/`` in a checkout."""
    spec = importlib.util.find_spec("plangen.templates")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / PLAN_TEMPLATE).is_file():
                return Path(location)
    checkout = Path(__file__).resolve().parent.parent / "templates"
    if (checkout / PLAN_TEMPLATE).is_file():
        return checkout
    raise RenderError("plangen's templates are missing from this installation (plangen.templates)")


def build_environment(template_dir: Path | str | None = None):
    """A jinja2 environment: ``template_dir`` first (a user's overrides), then plangen's templates."""
    import jinja2

    dirs: list[Path] = []
    if template_dir is not None:
        user = Path(template_dir)
        if not user.is_dir():
            raise RenderError(f"--template {user}: no such directory")
        dirs.append(user)
    dirs.append(package_template_dir())
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(d)) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["docstring"] = docstring_text
    return env


def docstring_text(text: object) -> str:
    """``text`` made safe inside a triple-quoted docstring (backslashes and quotes escaped)."""
    return str(text).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def render_template(
    context: Mapping[str, Any], template_dir: Path | str | None = None, name: str = PLAN_TEMPLATE
) -> str:
    """Render template ``name`` with ``context``; template errors become one-line :class:`RenderError`s."""
    import jinja2

    env = build_environment(template_dir)
    try:
        template = env.get_template(name)
        text = template.render(**context)
    except jinja2.TemplateError as err:
        lineno = getattr(err, "lineno", None)
        where = f"{getattr(err, 'filename', None) or name}:{lineno}" if lineno else name
        raise RenderError(f"template {where}: {one_line(getattr(err, 'message', None) or err)}") from None
    except Exception as err:  # a user's template can fail in any way: report it, write nothing
        raise RenderError(f"template {name}: {one_line(err, with_type=True)}") from None
    return text if text.endswith("\n") else text + "\n"


def check_python(text: str, what: str = "the rendered plan") -> None:
    """Raise :class:`RenderError` (with the line) unless ``text`` parses as Python (libcst)."""
    import libcst

    try:
        libcst.parse_module(text)
    except libcst.ParserSyntaxError as err:
        line = text.splitlines()[err.raw_line - 1].strip() if 0 < err.raw_line <= len(text.splitlines()) else ""
        shown = f": {line[:80]!r}" if line else ""
        raise RenderError(
            f"{what} is not valid Python (line {err.raw_line}, column {err.raw_column}: "
            f"{' '.join(err.message.split())}){shown}; nothing written"
        ) from None

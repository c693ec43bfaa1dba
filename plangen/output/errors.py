"""Error messages on one line, for CLI output, table cells and findings.

Torch's and transformers' messages span many lines (a summary, then context, then hints), but
plangen reports every failure on one line. Callers pick which part is the message: the whole text
with its whitespace collapsed, its first line (a summary), or its last line (validation errors put
the useful part last). Torch-free: the static CLI paths use it too.
"""

from __future__ import annotations

from typing import Literal

Part = Literal["all", "first", "last"]


def one_line(error: object, *, part: Part = "all", with_type: bool = False) -> str:
    """``error`` (an exception or a text) as one line.

    ``part``: ``"all"`` joins every line with single spaces; ``"first"``/``"last"`` keep only the
    first/last non-blank line, stripped. ``with_type`` prefixes an exception's class name
    (``ValueError: ...``). An exception with no message becomes its class name, so the line is
    never empty; an empty text stays empty.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        text = ""
    elif part == "first":
        text = lines[0]
    elif part == "last":
        text = lines[-1]
    else:
        text = " ".join(" ".join(lines).split())
    if not isinstance(error, BaseException):
        return text
    name = type(error).__name__
    if not text:
        return name
    return f"{name}: {text}" if with_type else text


class InitError(ValueError):
    """``plangen init`` cannot do what was asked; the message is one line and says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class RenderError(InitError):
    """A value, template or rendered text that cannot become a valid plan module."""

"""One-line error messages (plangen.output.errors.one_line), the one helper every command reports with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plangen.output.errors import one_line

MULTI = ValueError("  cannot build the config:\n\n   hidden_size   must divide\n  by num_heads (got 7)  \n")


@pytest.mark.parametrize(
    "part, with_type, expected",
    [
        ("all", False, "cannot build the config: hidden_size must divide by num_heads (got 7)"),
        ("all", True, "ValueError: cannot build the config: hidden_size must divide by num_heads (got 7)"),
        ("first", False, "cannot build the config:"),
        ("first", True, "ValueError: cannot build the config:"),
        ("last", False, "by num_heads (got 7)"),
    ],
)
def test_picks_the_part_and_keeps_it_on_one_line(part, with_type, expected):
    assert one_line(MULTI, part=part, with_type=with_type) == expected


def test_first_and_last_lines_keep_their_inner_spacing():
    # Only the whole-text form collapses whitespace; a picked line is only stripped.
    assert one_line(MULTI, part="first") == "cannot build the config:"
    assert one_line(ValueError("a  b\nc"), part="first") == "a  b"


@pytest.mark.parametrize("part", ["all", "first", "last"])
@pytest.mark.parametrize("with_type", [False, True])
def test_an_exception_without_a_message_is_its_class_name(part, with_type):
    assert one_line(KeyboardInterrupt(), part=part, with_type=with_type) == "KeyboardInterrupt"
    assert one_line(RuntimeError("  \n "), part=part, with_type=with_type) == "RuntimeError"


def test_text_is_collapsed_and_never_gets_a_class_name():
    assert one_line("unexpected\n  end of template") == "unexpected end of template"
    assert one_line("", with_type=True) == ""
    assert one_line("x\ny", part="last", with_type=True) == "y"


def test_the_copies_it_replaced_agree_with_it():
    """The five former copies, as they were, on messages they saw: the shared one gives the same."""
    samples = [ValueError("one line"), ValueError("first\nsecond\n\nlast"), OSError(2, "No such file"), ValueError("")]

    def joined(message):  # render._one_line
        return " ".join(str(message).split())

    def joined_typed(error):  # check/model._one_line
        text = " ".join(str(error).split())
        return f"{type(error).__name__}: {text}" if text else type(error).__name__

    def first_typed(error):  # check/run._one_line
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__

    def first(error):  # catalog._first_line, models._first_line
        lines = str(error).strip().splitlines()
        return lines[0] if lines else type(error).__name__

    def last(error):  # models._error_summary
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        return lines[-1] if lines else type(error).__name__

    for error in samples:
        if str(error):
            assert one_line(error) == joined(error)
        assert one_line(error, with_type=True) == joined_typed(error)
        assert one_line(error, part="first", with_type=True) == first_typed(error)
        assert one_line(error, part="first") == first(error)
        assert one_line(error, part="last") == last(error)


def test_importing_it_does_not_import_torch():
    code = "import sys, plangen.output.errors; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

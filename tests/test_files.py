"""plangen.output.files: a plan file is written whole or not at all, and a replaced one is kept as .bak."""

from __future__ import annotations

import os
import stat

import pytest

from plangen.output.files import backup_path, write_plan_file
from plangen.output.errors import InitError


def _names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_replacing_keeps_the_previous_file_and_its_mode(tmp_path):
    path = tmp_path / "plan.py"
    path.write_text("x = 1\n")
    os.chmod(path, 0o640)
    with pytest.raises(InitError, match="--force"):
        write_plan_file(path, "x = 2\n")
    assert path.read_text() == "x = 1\n" and _names(tmp_path) == ["plan.py"]
    outcome = write_plan_file(path, "x = 2\n", force=True)
    assert outcome.backup == backup_path(path) == tmp_path / "plan.py.bak"
    assert (path.read_text(), outcome.backup.read_text()) == ("x = 2\n", "x = 1\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 == stat.S_IMODE(outcome.backup.stat().st_mode)


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_plan_file(tmp_path / "plan.py", "x = 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.py").stat().st_mode) == 0o640


def test_a_failed_replace_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "plan.py"
    path.write_text("x = 1\n")
    real_replace = os.replace

    def fail_on_target(src, dst):
        if os.fspath(dst) == os.fspath(path):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_target)
    with pytest.raises(InitError, match="cannot write .*No space left on device"):
        write_plan_file(path, "x = 2\n", force=True)
    assert path.read_text() == "x = 1\n"
    assert not [n for n in _names(tmp_path) if n.endswith(".tmp")]


def test_a_failed_new_file_removes_the_directories_it_made(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "link", fail)
    with pytest.raises(InitError, match="cannot write"):
        write_plan_file(tmp_path / "a" / "b" / "plan.py", "x = 1\n")
    assert _names(tmp_path) == []


def test_a_file_that_appears_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    path = tmp_path / "plan.py"
    real_link = os.link

    def someone_else_first(src, dst):
        path.write_text("theirs\n")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", someone_else_first)
    with pytest.raises(InitError, match="appeared while writing"):
        write_plan_file(path, "x = 1\n")
    assert path.read_text() == "theirs\n" and _names(tmp_path) == ["plan.py"]


def test_text_that_does_not_parse_and_directories_are_refused(tmp_path):
    with pytest.raises(InitError, match="not valid Python"):
        write_plan_file(tmp_path / "plan.py", "x = (\n")
    (tmp_path / "d.py").mkdir()
    with pytest.raises(InitError, match="is a directory"):
        write_plan_file(tmp_path / "d.py", "x = 1\n")
    assert _names(tmp_path) == ["d.py"]

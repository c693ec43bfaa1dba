"""Write a generated file safely: parsed first, never half-written, never silently replacing one.

:func:`write_plan_file` is how ``plangen init`` (and ``scripts/regenerate.py``) put a rendered plan
on disk. The text goes to a temporary file in the target directory, is synced, and only then takes
the target's name (``os.replace`` over an old file, ``os.link`` for a new one, so a file that
appears meanwhile is not overwritten). A replaced file's content is kept beside it as
``<name>.bak``; a new file gets the permissions the umask allows, a replaced one keeps its own.
Every failure is a one-line :class:`plangen.output.errors.InitError`, and leaves no temporary file and no
directory this call created. :func:`replace_file` writes other outputs (plots) the same way,
replacing what is there.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from plangen.output.errors import InitError, RenderError


@dataclass(frozen=True)
class WriteOutcome:
    path: Path
    backup: Path | None = None
    unchanged: bool = False


def check_output_path(path: Path | str, *, force: bool = False, same_plan: bool = False) -> None:
    """Refuse, before anything is built, an output path that :func:`write_plan_file` would refuse.

    ``same_plan``: the existing file records the same model and settings, so the rendered text may
    equal it (then it is left alone): only the write can tell, so it is not refused here.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    limit = _name_max(parent)
    if len(os.fsencode(path.name)) > limit:
        raise InitError(f"-o {path}: the file name is longer than this file system allows ({limit} bytes)")
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except OSError as err:
        raise InitError(f"-o {path}: {err.strerror or err}") from None
    if is_dir:
        raise InitError(f"{path} is a directory; pass a .py file path with -o")
    if exists and not force and not same_plan:
        raise InitError(
            f"{path} already exists; pass --force to replace it (the old file is kept as {backup_path(path)})"
        )


def _name_max(folder: Path) -> int:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def write_plan_file(path: Path | str, text: str, *, force: bool = False) -> WriteOutcome:
    """Write ``text`` to ``path`` atomically, after checking that it parses as Python.

    An existing file is replaced only with ``force``, and its previous content is kept beside it
    as ``<name>.bak``; a file already holding ``text`` is left alone. Nothing is written when the
    text does not parse or any step fails.
    """
    path = Path(path)
    check_python(text, f"the rendered plan for {path}")
    if path.is_dir():
        raise InitError(f"{path} is a directory; pass a .py file path with -o")
    data = text.encode("utf-8")
    check_output_path(path, force=True)  # names too long, unreadable parents: one line, not a traceback
    exists = path.exists()
    if exists:
        try:
            if path.read_bytes() == data:
                return WriteOutcome(path, unchanged=True)
        except OSError as err:
            raise InitError(f"cannot read the existing {path}: {err.strerror or err}") from None
        if not force:
            raise InitError(
                f"{path} already exists; pass --force to replace it (the old file is kept as {backup_path(path)})"
            )

    created = _make_parents(path.parent)
    tmp: str | None = None
    try:
        tmp = _synced_temporary(path, data)
        backup = None
        if exists:
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
            backup = backup_path(path)
            _copy_atomically(path, backup)
            os.replace(tmp, path)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
            try:
                os.link(tmp, path)  # fails if a file appeared meanwhile: never replace one silently
            except FileExistsError:
                raise InitError(f"{path} appeared while writing; pass --force to replace it") from None
            os.unlink(tmp)
        tmp = None
        return WriteOutcome(path, backup=backup)
    except OSError as err:
        raise InitError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if not path.exists():
            for directory in reversed(created):
                try:
                    directory.rmdir()
                except OSError:
                    break


def replace_file(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, replacing a file there: for outputs made whole each
    time (plots), where the previous one is not kept. A new file gets the permissions the umask
    allows, a replaced one keeps its own. Raises :class:`OSError`; leaves no temporary file."""
    path = Path(path)
    tmp: str | None = _synced_temporary(path, data)
    try:
        mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _synced_temporary(path: Path, data: bytes) -> str:
    """A temporary file beside ``path`` holding ``data``, synced: it can take the name at once."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def backup_path(path: Path) -> Path:
    """Where a replaced ``path`` is kept: ``<name>.bak`` beside it."""
    return path.with_name(path.name + ".bak")


def _copy_atomically(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(src.read_bytes())
        os.chmod(tmp, stat.S_IMODE(src.stat().st_mode))
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _make_parents(directory: Path) -> list[Path]:
    """Create missing parent directories; return the ones created (outermost first)."""
    missing = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except OSError as err:
            for c in reversed(created):
                try:
                    c.rmdir()
                except OSError:
                    pass
            raise InitError(f"cannot create {d}: {err.strerror or err}") from None
        created.append(d)
    return created


def _umask() -> int:
    # Reading the umask means setting it: put it straight back.
    mask = os.umask(0)
    os.umask(mask)
    return mask


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

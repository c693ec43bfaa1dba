"""Load a user's custom parallel plan from what ``custom_parallel_plan`` names.

Accepts a dict of ``ParallelStyle``s; a dotted path to such a dict, to a zero-argument function
returning one, or to a module defining ``custom_parallel_plan``; or a path to a ``.py`` file
(optionally ``file.py:name``). NeMo RL's loader (hydra's ``get_class``) rejects a dict or a
function at a dotted path; this one does not.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Union

from torch.distributed.tensor.parallel import ParallelStyle

from plangen.output.errors import one_line

ACCEPTED = "give a dotted path (package.module.custom_parallel_plan) or a .py file (path/plan.py[:name])"
PlanLike = Union[Mapping[str, ParallelStyle], str, Callable[[], Mapping[str, ParallelStyle]]]
DEFAULT_ATTRIBUTE = "custom_parallel_plan"


class PlanLoadError(ValueError):
    """The custom plan could not be found or is not a dict of ParallelStyles."""


def load_custom_plan(spec: PlanLike) -> dict[str, ParallelStyle]:
    """Resolve ``spec`` to a validated ``{pattern: ParallelStyle}`` dict."""
    obj: Any = spec
    where = "custom_parallel_plan"
    if isinstance(spec, str):
        obj, where = _load_object(spec), spec
    if isinstance(obj, ModuleType):
        if not hasattr(obj, DEFAULT_ATTRIBUTE):
            raise PlanLoadError(f"{where}: module {obj.__name__} defines no {DEFAULT_ATTRIBUTE}")
        obj = getattr(obj, DEFAULT_ATTRIBUTE)
    if callable(obj) and not isinstance(obj, Mapping):
        required = [
            p.name
            for p in inspect.signature(obj).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise PlanLoadError(
                f"{where}: a plan function must take no arguments, this one needs {', '.join(required)}"
            )
        obj = obj()
    return validate_plan_dict(obj, where)


def validate_plan_dict(obj: Any, where: str = "custom_parallel_plan") -> dict[str, ParallelStyle]:
    if not isinstance(obj, Mapping):
        raise PlanLoadError(f"{where}: expected a dict of ParallelStyle, got {type(obj).__name__}")
    for key, style in obj.items():
        if not isinstance(key, str):
            raise PlanLoadError(f"{where}: plan key {key!r} is not a string")
        if not isinstance(style, ParallelStyle):
            hint = (
                " (a Hugging Face style name: use plangen.styles.translate_parallel_style)"
                if isinstance(style, str)
                else ""
            )
            raise PlanLoadError(f"{where}: plan[{key!r}] is a {type(style).__name__}, not a ParallelStyle{hint}")
    return dict(obj)


def _load_object(spec: str) -> Any:
    if not spec.strip():
        raise PlanLoadError(f"custom_parallel_plan is empty: {ACCEPTED}")
    path_part, _, attr = spec.partition(":") if spec.count(":") == 1 and not Path(spec).exists() else (spec, "", "")
    if path_part.endswith(".py") or Path(path_part).is_file():
        return _load_from_file(Path(path_part), attr or DEFAULT_ATTRIBUTE, spec)
    return _load_dotted(spec)


def _load_from_file(path: Path, attr: str, spec: str) -> Any:
    if not path.is_file():
        raise PlanLoadError(f"{spec}: no such plan file")
    module_name = f"_plangen_plan_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise PlanLoadError(f"{spec}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as error:
        raise _import_failure(spec, error) from error
    if not hasattr(module, attr):
        raise PlanLoadError(f"{spec}: {path} defines no {attr}")
    return getattr(module, attr)


def _load_dotted(spec: str) -> Any:
    """Import the longest importable prefix of ``spec``, then follow attributes."""
    parts = spec.split(".")
    if not all(part.isidentifier() for part in parts):
        raise PlanLoadError(f"{spec!r} is not a dotted path nor a .py file: {ACCEPTED}")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            # Only "this prefix is not a module" moves on; a missing import inside the module is real.
            if err.name is not None and not module_name.startswith(err.name) and err.name != module_name:
                raise _import_failure(spec, err) from err
            continue
        except Exception as error:
            raise _import_failure(spec, error) from error
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise PlanLoadError(f"{spec}: {'.'.join(parts[:cut])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise PlanLoadError(f"{spec}: not an importable dotted path nor a .py file")


def _import_failure(spec: str, error: BaseException) -> PlanLoadError:
    """The error a plan module raised at import, with the file and line it raised at."""
    where = ""
    if isinstance(error, SyntaxError) and error.filename:
        where = f"{error.filename}:{error.lineno}: "
        message = f"SyntaxError: {error.msg}"
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}: "
        message = one_line(error, with_type=True)
    return PlanLoadError(f"{spec}: importing the plan failed at {where}{message}")

"""Why a test's failure is only the installed transformers lacking what the test names (a model
type or class added after it, an internal module or function it has not, a default config its own
config class cannot build): such a test is skipped
with that reason, never failed. Each reason is checked against the installed transformers itself
(the model type absent from its config mapping, the module not importable), so on the release the
tests were written for nothing is ever skipped this way."""

from __future__ import annotations

import re

_NAMED = (
    re.compile(r"unknown model spec '([^']+)'"),
    re.compile(r"Unrecognized model identifier: ([\w-]+)"),
)
# What a test's own check raises, or a launch's failure that embeds a child's traceback: never a reason.
_NEVER = (AssertionError,)


def has_model(name: str) -> bool:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return name in CONFIG_MAPPING_NAMES or hasattr(transformers, name)


def _one(exc: BaseException) -> str | None:
    import transformers

    version = f"transformers {transformers.__version__}"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("transformers"):
        return f"{version} has no module {exc.name}"
    if isinstance(exc, ImportError) and (exc.name or "").startswith("transformers"):
        return f"{version}: {exc}"
    if isinstance(exc, AttributeError):
        owner = getattr(exc, "obj", None)
        module = getattr(owner, "__name__", "") if owner is not None else ""
        if isinstance(module, str) and module.startswith("transformers") and not hasattr(owner, exc.name or ""):
            return f"{version} has no {module}.{exc.name}"
    for pattern in _NAMED:
        found = pattern.search(str(exc))
        if found and not has_model(found.group(1)):
            return f"{version} has no model {found.group(1)}"
    found = _OWN_DEFAULT.search(str(exc))
    if found and not builds_default_config(found.group(1)):
        return f"{version} cannot build its own default {found.group(1)} config"
    found = _LAYER_KINDS.search(str(exc))
    if found:
        allowed = set(re.findall(r"'(\w+)'", found.group(1)))
        rejected = sorted(set(re.findall(r"'(\w+)'", found.group(2))) - allowed)
        if rejected:
            return f"{version} has no layers of kind {', '.join(rejected)} (its config validation rejects them)"
    return None


# A hybrid config's validation of its layer kinds (5.5.x's NemotronH has no MLP layers: only mamba,
# attention and moe), with the kinds it allows and the ones it was given.
_LAYER_KINDS = re.compile(r"`layer_types` entries must be in \(([^)]*)\) but got \[([^\]]*)\]")

# plangen.model.resolve' one line where transformers' own config class fails on its own defaults (5.8.1's
# MusicgenConfig: a None sub-config its strict dataclass refuses).
_OWN_DEFAULT = re.compile(r"transformers cannot build the default (\w+) config")


def builds_default_config(model_type: str) -> bool:
    from transformers import AutoConfig

    try:
        AutoConfig.for_model(model_type)
    except Exception:  # noqa: BLE001 - transformers raises many types for a config it cannot build
        return False
    return True


def absent_from_transformers(exc: BaseException) -> str | None:
    """The reason ``exc`` (or what it was raised from) is something the installed transformers
    lacks, else None."""
    if isinstance(exc, _NEVER) or type(exc).__name__ in ("DistributedRunError", "Failed", "Skipped"):
        return None
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        why = _one(exc)
        if why:
            return why
        exc = exc.__cause__ or exc.__context__
    return None

"""Turn what a user names (a model type, a class, a config file, a cached hub id) into models.

Plans are derived from the module tree, so most of plangen needs a model without weights: the
meta-device build here gives the real tree of even a 405B model in a fraction of a second. The
numerical checks need real weights of a toy-sized model instead: :mod:`plangen.model.shrink`.

Nothing here touches the network: a hub id is only accepted when its config is already in the
local Hugging Face cache. Importing this module does not import torch or transformers.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Union

from plangen.output.errors import one_line
from plangen.model.default_configs import complete_default_config

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

SpecKind = Literal["model_type", "class", "config", "hub"]

ACCEPTED_SPECS = (
    "a model_type (e.g. llama, qwen3, gemma3_text), a model class (e.g. Qwen3ForCausalLM), "
    "a path to a config.json or to a folder holding one, or a hub id (org/name) already in the "
    "local Hugging Face cache"
)

# Classes that end in these are generation heads even when no auto mapping lists them.
_GENERATION_CLASS_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelSpecError(ValueError):
    """A model spec that cannot be resolved; the message is one line and says what to pass."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@dataclass(frozen=True)
class ResolvedModel:
    """What a spec named: the config to build and the generation class to build it with."""

    spec: str
    kind: SpecKind
    config: "PretrainedConfig"
    model_class: type["PreTrainedModel"]
    # Short, file-friendly: used to name generated plan files.
    name: str


ModelSource = Union[ResolvedModel, "PretrainedConfig"]


# --------------------------------------------------------------------------------------------
# The spec a plan file records (PLANGEN_MODEL)


def record_model_spec(resolved: ResolvedModel, plan_path: Path | str) -> str:
    """``resolved``'s spec as the plan file at ``plan_path`` records it: a config path relative to
    the plan file's folder (the pair moves together in a repository, and verify or cost run from
    any directory find it), always written as a path (``./my_model`` beside it, ``./sub/m.json``
    below it: never the bare ``my_model`` a reader would take for a model_type, nor ``org/name``,
    a hub id's shape), any other spec as given."""
    if resolved.kind != "config":
        return resolved.spec
    import os

    relative = os.path.relpath(Path(resolved.spec).resolve(), Path(plan_path).resolve().parent)
    posix = Path(relative).as_posix()
    return posix if posix.startswith("../") else f"./{posix}"


def resolve_recorded_spec(spec: str, plan_path: Path | str) -> str:
    """The spec to resolve for a ``PLANGEN_MODEL`` read from the plan file at ``plan_path``.

    One rule, the reverse of :func:`record_model_spec`: a relative spec that names a file or folder
    beside the plan file (``./my_model``, ``../configs/m.json``, or a bare ``my_model`` written by
    older releases) is that path, whatever the working directory, and wins over a model_type of the
    same name; anything else is resolved as given (a model_type, a class, an absolute path, a hub
    id, or a path relative to where init ran, as the oldest files recorded)."""
    if not Path(spec).is_absolute():
        candidate = Path(plan_path).resolve().parent / spec
        if candidate.exists():
            return str(candidate)
    return spec


# --------------------------------------------------------------------------------------------
# Resolving a spec


def resolve_model(spec: str) -> ResolvedModel:
    """Resolve a user's model spec without downloading anything.

    Paths win over names so a local folder called ``llama`` is read, not mistaken for the type.
    """
    text = spec.strip()
    if not text:
        raise ModelSpecError(f"empty model spec; pass {ACCEPTED_SPECS}")
    path = Path(text).expanduser()
    if path.exists() or text.endswith(".json"):
        return _resolve_config_path(spec, path)
    if _HUB_ID.match(text):
        return _resolve_cached_hub_id(spec, text)
    if text in _config_mapping():
        return _resolve_model_type(spec, text)
    if text[:1].isupper() or _is_generation_class_name(text):  # xLSTMForCausalLM starts in lower case
        return _resolve_class_name(spec, text)
    raise ModelSpecError(_unknown_spec_message(text))


def resolve_model_class(config: "PretrainedConfig") -> type["PreTrainedModel"]:
    """The generation class for a config: its ``architectures`` entry, else its type's default."""
    import transformers

    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None) if _is_generation_class_name(name) else None
        if cls is not None:
            return cls
    return _class_for_model_type(config.model_type)


def config_for_class(config: "PretrainedConfig", model_class: type["PreTrainedModel"]) -> "PretrainedConfig":
    """The part of ``config`` that ``model_class`` is built from.

    Some types map to a text-only class (``llama4`` -> ``Llama4ForCausalLM``) whose config is a
    sub-config of the type's composite one; the Auto classes make the same swap.
    """
    wanted = getattr(model_class, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if isinstance(sub, wanted):
            return sub
    return config


def _resolve_model_type(spec: str, model_type: str) -> ResolvedModel:
    from transformers import AutoConfig

    model_class = _class_for_model_type(model_type)
    try:
        config = AutoConfig.for_model(model_type)
    except Exception as exc:  # a default config that fails transformers' own validation
        raise ModelSpecError(
            f"transformers cannot build the default {model_type} config: {one_line(exc, part='last')}; "
            f"pass a path to a real config.json instead"
        ) from exc
    config = complete_default_config(config_for_class(config, model_class))
    return ResolvedModel(spec, "model_type", config, model_class, model_type)


def _resolve_class_name(spec: str, name: str) -> ResolvedModel:
    import transformers

    try:
        model_class = getattr(transformers, name) if _is_generation_class_name(name) else None
    except AttributeError:
        model_class = None
    except (ImportError, RuntimeError) as exc:  # a class whose optional dependency is missing
        raise ModelSpecError(f"cannot import transformers.{name}: {one_line(exc, part='first')}") from exc
    if model_class is None:
        raise ModelSpecError(_unknown_spec_message(name))
    config = complete_default_config(model_class.config_class())
    return ResolvedModel(spec, "class", config, model_class, config.model_type)


def _resolve_config_path(spec: str, path: Path) -> ResolvedModel:
    if path.is_dir():
        config_file, name = path / "config.json", path.resolve().name
    else:
        config_file, name = path, path.stem
    if not config_file.is_file():
        raise ModelSpecError(f"no config file at {config_file}; pass {ACCEPTED_SPECS}")
    config = _load_config_file(config_file)
    model_class = resolve_model_class(config)
    return ResolvedModel(spec, "config", config_for_class(config, model_class), model_class, name)


def _resolve_cached_hub_id(spec: str, repo_id: str) -> ResolvedModel:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(cached, str):
        raise ModelSpecError(
            f"{repo_id} is neither a local path nor in the local Hugging Face cache, and plangen "
            f"never downloads; pass a model_type (e.g. llama), a model class (e.g. "
            f"LlamaForCausalLM), or a path to its config.json"
        )
    config = _load_config_file(Path(cached))
    model_class = resolve_model_class(config)
    name = repo_id.replace("/", "--")
    return ResolvedModel(spec, "hub", config_for_class(config, model_class), model_class, name)


def _load_config_file(config_file: Path) -> "PretrainedConfig":
    from transformers import AutoConfig

    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"cannot read {config_file} as JSON: {one_line(exc, part='first')}") from exc
    if not isinstance(raw, dict):
        raise ModelSpecError(f"{config_file} holds a JSON {type(raw).__name__}; a config.json is an object")
    model_type = raw.get("model_type")
    if model_type is None:
        raise ModelSpecError(
            f'{config_file} has no "model_type": a config.json names its model type, e.g. "model_type": "llama"'
        )
    if model_type not in _config_mapping():
        raise ModelSpecError(
            f"{config_file} has model_type {model_type!r}, which this transformers does not know"
            f" (remote-code models are not supported); {_suggestion(str(model_type))}"
        )
    _check_sizes(raw, config_file)
    try:
        return AutoConfig.from_pretrained(str(config_file), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad config
        # Validation errors name the field on the first line and say what is wrong on the next.
        raise ModelSpecError(f"cannot load {config_file}: {one_line(exc)}") from exc


# Sizes every plan divides by the TP size: a zero or a non-integer would surface as a division
# error (or worse, a model of the wrong shape) far from the config that caused it.
_SIZE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "vocab_size",
    "head_dim",
)


def _check_sizes(raw: dict[str, Any], config_file: Path) -> None:
    for where, section in (("", raw), ("text_config.", raw.get("text_config"))):
        if not isinstance(section, dict):
            continue
        for key in _SIZE_FIELDS:
            value = section.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelSpecError(f"{config_file}: {where}{key} must be a positive integer, got {value!r}")


def _class_for_model_type(model_type: str) -> type["PreTrainedModel"]:
    import transformers

    for mapping in _generation_mappings():
        name = mapping.get(model_type)
        if name is not None:
            return getattr(transformers, name)
    raise ModelSpecError(
        f"model_type {model_type!r} has no causal-LM or conditional-generation class in "
        f"transformers; pass a causal LM such as llama, qwen3 or gemma3_text"
    )


def _generation_mappings() -> tuple[dict[str, str], ...]:
    # Causal LM first: for types listed in both (llama4, mllama) it is the text model users train.
    from transformers.models.auto import modeling_auto as auto

    return (
        auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        auto.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES,
    )


def _config_mapping() -> dict[str, str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return CONFIG_MAPPING_NAMES


def _generation_class_names() -> set[str]:
    return {name for mapping in _generation_mappings() for name in mapping.values()}


def _is_generation_class_name(name: str) -> bool:
    return name in _generation_class_names() or name.endswith(_GENERATION_CLASS_SUFFIXES)


def _generation_model_types() -> set[str]:
    return {model_type for mapping in _generation_mappings() for model_type in mapping}


def _suggestion(text: str) -> str:
    candidates = sorted(_generation_model_types() | _generation_class_names())
    matches = difflib.get_close_matches(text, candidates, n=3, cutoff=0.6)
    if not matches:
        matches = difflib.get_close_matches(text.lower(), sorted(_generation_model_types()), n=3)
    return f"did you mean {', '.join(matches)}?" if matches else f"pass {ACCEPTED_SPECS}"


def _unknown_spec_message(text: str) -> str:
    hint = _suggestion(text)
    accepted = "" if hint.startswith("pass ") else f"; accepted: {ACCEPTED_SPECS}"
    return f"unknown model spec {text!r}: {hint}{accepted}"


# --------------------------------------------------------------------------------------------
# Building models


def build_meta_model(
    source: ModelSource,
    model_class: type["PreTrainedModel"] | None = None,
    *,
    dtype: "torch.dtype | None" = None,
) -> "PreTrainedModel":
    """Build the model on the meta device: the real module tree and shapes, no memory.

    Building on meta skips the expensive part (allocating and initialising weights) by itself;
    ``no_init_weights`` would save a few more milliseconds but also skips tying, so tied models
    would report an lm_head parameter they do not have.
    """
    import torch

    config, model_class = resolve_config_and_class(source, model_class)
    # _from_config writes dtype and attention settings back into the config it is given.
    config = copy.deepcopy(config)
    kwargs = {} if dtype is None else {"dtype": dtype}
    with torch.device("meta"):
        return model_class._from_config(config, **kwargs)


def build_full_size_meta_model(source: ModelSource) -> "PreTrainedModel":
    """:func:`build_meta_model` at the config's own (full) size, with torch's initializers skipped:
    on the meta device they fill nothing, yet their decompositions are most of a full-size build
    (some classes have tens of thousands of linear layers). Transformers' own initialisation (which
    also ties weights) is left alone."""
    with _torch_initializers_skipped():
        return build_meta_model(source)


@contextmanager
def _torch_initializers_skipped() -> Iterator[None]:
    from torch.nn import init

    originals = {name: getattr(init, name) for name in _TORCH_INITIALIZERS if hasattr(init, name)}

    def nothing(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    try:
        for name in originals:
            setattr(init, name, nothing)
        yield
    finally:
        for name, function in originals.items():
            setattr(init, name, function)


_TORCH_INITIALIZERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)


def resolve_config_and_class(
    source: ModelSource, model_class: type["PreTrainedModel"] | None = None
) -> tuple["PretrainedConfig", type["PreTrainedModel"]]:
    """The config and the class to build from ``source`` (``model_class`` overrides its class)."""
    if isinstance(source, ResolvedModel):
        config, model_class = source.config, model_class or source.model_class
    else:
        config, model_class = source, model_class or resolve_model_class(source)
    return config_for_class(config, model_class), model_class


def text_config(config: Any) -> Any:
    """The text decoder's config: the part a plan shards and whose vocabulary the logits span.

    ``config`` itself for text-only models and for objects without ``get_text_config``.
    ``get_text_config(decoder=True)`` rather than ``get_text_config()``: the plain call also looks
    for a text encoder, so it raises on a config holding both (MusicGen's ``text_encoder`` and
    ``decoder``), and on a flat encoder-decoder config (BART, Whisper) it answers with the
    encoder's layer and head counts. On composite multimodal configs (Gemma 3, Llava, Qwen2-VL)
    both give ``config.text_config``. A flat encoder-decoder config gets a renamed copy, so
    changes to the result only reach ``config`` for the other kinds.
    """
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config

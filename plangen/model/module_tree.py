"""Questions about a model's module tree, each answered here once.

* Which modules a plan key selects, under torch's own rule: ``parallelize_module`` splits a key on
  dots and matches each segment against child names with ``fnmatch``, so a key matches a module
  path with the same number of segments whose every segment matches. Torch only warns when a key
  matches nothing; plangen makes that an error (:func:`find_unmatched_keys`).
* The pattern of a module path: :func:`generalize` (``model.layers.3.mlp`` → ``model.layers.*.mlp``).
* The repeated blocks (:func:`find_transformer_layers`) and the tied embeddings
  (:func:`tied_embeddings`).
* The parts of a peft LoRA layer (:data:`LORA_PARTS`), which plan keys must not name.

Importing this module does not import torch: the level-1 checks use the string functions too.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn


# The children of a peft LoRA layer: plangen.runtime.lora places them from the key of the wrapped module,
# so a key naming one (``...q_proj.base_layer``) bypasses that (refused by the runtime, PG008).
LORA_PARTS = ("base_layer", "lora_A", "lora_B", "lora_dropout", "lora_embedding_A", "lora_embedding_B")


def key_matches(pattern: str, module_path: str) -> bool:
    """Whether plan key ``pattern`` selects ``module_path`` (torch's rule: fnmatch per dotted segment)."""
    return _segments_match(pattern.split("."), module_path.split("."))


def _segments_match(atoms: list[str], parts: list[str]) -> bool:
    return len(atoms) == len(parts) and all(fnmatchcase(p, a) for p, a in zip(parts, atoms))


class ModuleIndex:
    """A model's named modules, split once and grouped by depth, for matching many keys."""

    def __init__(self, model: "nn.Module") -> None:
        self._by_depth: dict[int, list[tuple[list[str], str, "nn.Module"]]] = {}
        for name, module in model.named_modules():
            if name:
                parts = name.split(".")
                self._by_depth.setdefault(len(parts), []).append((parts, name, module))

    def _matches(self, pattern: str) -> Iterator[tuple[list[str], str, "nn.Module"]]:
        atoms = pattern.split(".")
        return (item for item in self._by_depth.get(len(atoms), ()) if _segments_match(atoms, item[0]))

    def selects_any(self, pattern: str) -> bool:
        return next(self._matches(pattern), None) is not None

    def paths(self, pattern: str) -> list[str]:
        """Paths of the modules ``pattern`` selects, in module order."""
        return [name for _, name, _ in self._matches(pattern)]

    def matching(self, pattern: str) -> list["nn.Module"]:
        """The modules ``pattern`` selects, in module order."""
        return [module for _, _, module in self._matches(pattern)]


def find_matching_modules(model: "nn.Module", pattern: str) -> list[str]:
    """Paths of the modules that ``pattern`` selects, in module order."""
    return ModuleIndex(model).paths(pattern)


def find_unmatched_keys(model: "nn.Module", patterns: Iterable[str]) -> list[str]:
    """The keys of ``patterns`` that select no module of ``model``, in their order."""
    index = ModuleIndex(model)
    return [p for p in patterns if not index.selects_any(p)]


def generalize(path: str) -> str:
    """``model.layers.3.mlp`` → ``model.layers.*.mlp``: one pattern for every repeat of a module.

    Every dot-separated segment made only of digits (a ``ModuleList``/``Sequential`` index)
    becomes ``*``, wherever it is. transformers' ``replace_layer_number_by_wildcard`` differs on
    two paths no plan key distinguishes: a leading index (``0.weight``, which it keeps) and a
    second index right after another (``blocks.0.1``, which it leaves as ``blocks.*.1``).
    """
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def find_transformer_layers(model: "nn.Module") -> list["nn.Module"]:
    """The repeated blocks (decoder layers, vision blocks) wherever the class keeps them.

    Hugging Face lists them by class name in ``_no_split_modules`` (also what its own FSDP
    auto-wrapping uses); the outermost matches are the FSDP2 units.
    """
    from torch import nn

    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            layers.append(module)
            inside.update(id(m) for m in module.modules())
    if layers:
        return layers
    # No declaration: fall back to the children of every ModuleList.
    return [child for module in model.modules() if isinstance(module, nn.ModuleList) for child in module]


def find_separable_units(model: "nn.Module", layers: list["nn.Module"]) -> list["nn.Module"]:
    """The ``layers`` that can be FSDP2 units of their own: those holding no parameter that a module
    outside them holds too. FSDP2 manages a shared parameter in one group only, so a token embedding
    declared a block (BERT's ``_no_split_modules`` lists its embeddings) but tied to the output head
    stays with the root, where the head is."""
    owners: dict[int, list[int]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(id(module))
    units = []
    for layer in layers:
        inside = {id(m) for m in layer.modules()}
        if all(owner in inside for param in layer.parameters() for owner in owners.get(id(param), ())):
            units.append(layer)
    return units


def tied_embeddings(model: "nn.Module") -> tuple[str, str] | None:
    """Module paths of (input embedding, output head) when their weights are one parameter."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    emb, head = get_in(), get_out()
    # Musicgen's ends are ModuleLists of one embedding / head per codebook: no single weight.
    weight = getattr(emb, "weight", None)
    if weight is None or weight is not getattr(head, "weight", None):
        return None
    names = {id(m): n for n, m in model.named_modules()}
    return names[id(emb)], names[id(head)]


def shared_parameters_beyond_tie(model: "nn.Module") -> list[list[str]]:
    """Names (``module.param``) of each parameter that several modules hold, but the tied
    embedding and head's weight (Zamba2's shared transformer block, held by every hybrid layer)."""
    holders: dict[int, list[str]] = {}
    for path, module in model.named_modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append(f"{path}.{name}" if path else name)
    tied = tied_embeddings(model)
    tie = {f"{tied[0]}.weight", f"{tied[1]}.weight"} if tied is not None else set()
    return [names for names in holders.values() if len(names) > 1 and set(names) != tie]

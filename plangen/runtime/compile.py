"""torch.compile, block by block: each decoder layer compiled with ``fullgraph=True`` after TP and
activation checkpointing, before FSDP2 (torchtitan's order; ``docs/compile.md``).

What the compiled blocks must not be handed: an ``AsyncCollectiveTensor``. A style whose output
leaves through an asynchronous redistribution and ``to_local()`` (torch's ``RowwiseParallel`` on the
embedding without sequence parallel: the vocabulary-parallel lookup's all-reduce, ``async_op=True``)
returns the local tensor still wrapped, waiting for its collective. Eager, the first op waits; as a
compiled region's input, torch 2.13's AOTAutograd gives it no gradient (``None``, the graph's
backward never reaches it), and the embedding's ``Redistribute`` backward then fails on the zeros the
engine fills in: ``AttributeError: 'Tensor' object has no attribute '_local_tensor'``
(``NestedRedistribute.forward``). :func:`apply_async_waits` waits every such output where it leaves
its module, outside the compiled regions, with an identity gradient: the same collectives, no more.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from plangen.stack.torch_compat import AsyncCollectiveTensor, is_composable_checkpointed
from plangen.stack.transformers_compat import experts_compile_blocker

logger = logging.getLogger("plangen")

# transformers records these outputs with forward hooks on the layers' modules (installed at the first
# forward that asks for one), which read a ``contextvars.ContextVar`` that dynamo cannot trace
# (``Unsupported: ... method `get` of class `ContextVar```): a layer holding them cannot compile whole.
RECORDED_OUTPUTS = ("output_router_logits", "output_attentions", "output_hidden_states")


class _WaitAsync(torch.autograd.Function):
    """The collective's result as a plain tensor, its gradient passed through unchanged."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def wait_async(value: Any) -> Any:
    """``value`` with every ``AsyncCollectiveTensor`` in it (itself, or in a tuple, list or dict)
    waited for, differentiably; anything else as it is."""
    if isinstance(value, AsyncCollectiveTensor):
        return _WaitAsync.apply(value) if value.requires_grad else value.wait()
    if isinstance(value, (tuple, list)) and any(isinstance(v, AsyncCollectiveTensor) for v in value):
        waited = [wait_async(v) for v in value]
        return type(value)(waited) if type(value) in (tuple, list) else value  # named tuples left alone
    if type(value) is dict and any(isinstance(v, AsyncCollectiveTensor) for v in value.values()):
        return {k: wait_async(v) for k, v in value.items()}
    return value


def _wait_outputs(module: nn.Module, args: tuple, output: Any) -> Any:
    waited = wait_async(output)
    return None if waited is output else waited


def outside_modules(model: nn.Module, layers: list[nn.Module]) -> list[nn.Module]:
    """The modules of ``model`` that are neither one of ``layers`` nor inside one: they run eagerly."""
    inside = {id(m) for layer in layers for m in layer.modules()}
    return [m for m in model.modules() if id(m) not in inside]


def apply_async_waits(model: nn.Module, layers: list[nn.Module]) -> None:
    """Every module that runs eagerly hands on its outputs waited for (``AsyncCollectiveTensor``s
    become plain tensors): what enters a compiled block is never still in flight."""
    for module in outside_modules(model, layers):
        module.register_forward_hook(_wait_outputs)


def find_compile_blocker(model: nn.Module) -> str | None:
    """Why ``model``'s layers cannot compile whole, or None: its config asks transformers to record an
    output through hooks in the layers (MoE training's ``output_router_logits=True``)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        asked = [key for key in RECORDED_OUTPUTS if getattr(config, key, False) is True]
        if asked:
            return (
                f"{type(module).__name__}'s config sets {', '.join(asked)}: transformers records it with hooks "
                "that read a ContextVar, which torch.compile cannot trace (docs/compile.md)"
            )
    return None


def mixed_children(layers: list[nn.Module]) -> dict[type, list[str]]:
    """Layer classes whose instances hold submodules of different classes under one name, whose int
    attributes (theirs or their submodules', by path) differ from layer to layer, with those names:
    NemotronH's ``NemotronHBlock.mixer``, a Mamba2 mixer (``head_dim`` 16 in the tiny model) or
    attention (``head_dim`` 8), MoE or an MLP. Qwen3-MoE's ``mlp`` (MoE or dense) differs in class
    only: its layers compile whole.

    Dynamo keeps one code object's compiled graphs and automatic-dynamic state together: compiled
    whole, such a layer's code reads ``self.mixer.head_dim`` as 16 in a Mamba2 layer and 8 in an
    attention layer, so the recompile for the attention layer makes ``head_dim`` a symbolic int (the
    layer is an FSDP2 module, whose ints dynamo does not hold static as it does a plain module's).
    Under TP, DTensor's shape propagation then hands AOTAutograd a size ``32*s*(16//s)``, a
    three-factor sympy ``Mul`` that torch 2.13's ``_build_proxy_for_sym_expr`` rebuilds with the
    binary ``operator.mul``:
    ``BackendCompilerFailed: TypeError: mul expected 2 arguments, got 3`` (docs/compile.md)."""
    children: dict[type, dict[str, list[nn.Module]]] = {}
    for layer in layers:
        by_name = children.setdefault(type(layer), {})
        for name, child in layer.named_children():
            by_name.setdefault(name, []).append(child)
    mixed = {
        cls: [name for name, held in by_name.items() if len({type(c) for c in held}) > 1 and _ints_differ(held)]
        for cls, by_name in children.items()
    }
    return {cls: names for cls, names in mixed.items() if names}


def _ints_differ(modules: list[nn.Module]) -> bool:
    """Whether an int attribute at one path (``head_dim``, ``conv1d.groups``) differs among ``modules``."""
    seen: dict[str, set[int]] = {}
    for module in modules:
        for path, sub in module.named_modules():
            for key, value in vars(sub).items():
                if type(value) is int:
                    seen.setdefault(f"{path}.{key}", set()).add(value)
    return any(len(values) > 1 for values in seen.values())


def eager_modules(layers: list[nn.Module]) -> dict[nn.Module, str]:
    """The modules inside ``layers`` that cannot be compiled, each with why: packed experts whose
    transformers release traces its grouped_mm fallback's backward
    (:func:`plangen.stack.transformers_compat.experts_compile_blocker`; 5.5.x, 5.8.x)."""
    found = {}
    for layer in layers:
        for module in layer.modules():
            why = experts_compile_blocker(module)
            if why is not None:
                found[module] = why
    return found


def _around(module: nn.Module, eager: dict[nn.Module, str]) -> list[nn.Module]:
    """The largest submodules of ``module`` that hold none of ``eager``: ``module`` itself where it holds
    none, else its children's (an eager module itself: nothing)."""
    if module in eager:
        return []
    if not any(m in eager for m in module.modules()):
        return [module]
    return [unit for child in module.children() for unit in _around(child, eager)]


def compile_units(layers: list[nn.Module]) -> list[nn.Module]:
    """What :func:`apply_compile` compiles: each layer whole, except
    - a layer of a class in :func:`mixed_children`, whose direct children compile one by one (each
      child class's code sees one value of each int, so none turns symbolic); the layer's own code
      between them (NemotronH's residual add) runs eagerly;
    - a layer holding one of :func:`eager_modules`: the largest submodules around it compile (Qwen3-MoE
      on 5.8: attention, norms, the router), it and the code between them run eagerly."""
    eager = eager_modules(layers)
    return [piece for unit in _whole_units(layers) for piece in _around(unit, eager)]


def _whole_units(layers: list[nn.Module]) -> list[nn.Module]:
    mixed = mixed_children(layers)
    return [unit for layer in layers for unit in (list(layer.children()) if type(layer) in mixed else [layer])]


def _waiting_inputs(compiled):
    """``compiled`` called with its inputs waited for (no ``AsyncCollectiveTensor`` enters it)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return compiled(*wait_async(args), **wait_async(kwargs))

    return forward


def apply_compile(model: nn.Module, layers: list[nn.Module]) -> list[nn.Module]:
    """Compile each of ``layers`` in place (``fullgraph=True``: a graph break fails the first step
    instead of costing silently), or their children where :func:`compile_units` says so (logged), or a
    checkpointed layer's forward (logged); returns the modules compiled: none, logged, where
    :func:`find_compile_blocker` names a reason."""
    blocker = find_compile_blocker(model)
    if blocker is not None:
        logger.warning("plangen: the decoder layers stay eager: %s", blocker)
        return []
    for cls, names in mixed_children(layers).items():
        logger.warning(
            "plangen: %s holds different classes under %s: its children compile one by one, its own code "
            "between them (NemotronH's residual add) stays eager (docs/compile.md)",
            cls.__name__,
            ", ".join(names),
        )
    for why in sorted(set(eager_modules(layers).values())):
        logger.warning(
            "plangen: experts stay eager, the rest of each layer compiles around them: %s (docs/compile.md)", why
        )
    units = compile_units(layers)
    if any(is_composable_checkpointed(unit) for unit in units):
        logger.warning(
            "plangen: the checkpointed layers compile their forward, the checkpoint's hooks eager around it; "
            "backward recomputes each compiled forward whole: one collective per layer more than eager's "
            "early stop (docs/compile.md)"
        )
    apply_async_waits(model, units)
    whole = {id(unit) for unit in _whole_units(layers)}
    for unit in units:
        if id(unit) not in whole:
            # A piece of a layer around eager experts (a shared expert, the router, attention): its forward
            # compiles, its hooks (TP's input and output layouts) stay eager around it, as the layer's
            # code around it does. torch 2.11's dynamo cannot start a compiled region in such a hook
            # (PrepareModuleInput: "SourcelessBuilder.create does not know how to wrap DTensorSpec"),
            # and a hook's asynchronous all-gather must be waited before the region (module docstring).
            unit.forward = _waiting_inputs(torch.compile(unit.forward, fullgraph=True))
        elif is_composable_checkpointed(unit):
            # Composable checkpointing enters a context in its pre-hook and leaves it in its post-hook,
            # which dynamo cannot compile (a hook is a frame of its own): the hooks stay eager around
            # the compiled forward, and backward's recomputation, which calls the module again, reruns
            # the compiled forward.
            unit.forward = torch.compile(unit.forward, fullgraph=True)
        else:
            unit.compile(fullgraph=True)
    return units

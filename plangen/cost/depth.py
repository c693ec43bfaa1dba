"""A traced step at three shallow depths, extrapolated to the model's own, where every layer is alike.

Tracing every layer of a 126-layer model with fake tensors takes minutes; its memory does not need
them all. Where every decoder layer has the same modules and parameter shapes (and the config no
per-layer kinds), what a rank holds at any moment of the step is linear in the depth ``n``, and
inside the step's pass over layer ``K`` linear in ``K`` too: the parameters, gradients and
optimizer states of ``n`` layers, the activations saved by the layers before ``K`` in forward (by
layers ``0..K`` in backward), the gradients of the layers after ``K`` in backward. The first and
the last layer differ from the others (FSDP2 prefetches the next layer's parameters, and the last
layer has none to prefetch; backward starts at the last), and what runs outside the layers
depends on ``n`` alone, before the phase's layers (forward: the embedding; backward: the loss and
the head) and after them (forward: the head; backward: the embedding, every gradient made) apart. So each phase's peak in each of those places is fitted from
depths 3, 4 and 5, exactly (in bytes), and checked on the points the fit does not use. Inside one
layer every moment grows alike (what differs between them is the layer's own work); the places
apart from the layers hold moments that grow alike too once FSDP2's post-backward callbacks are
filed under backward (they hold every gradient, as the embedding's backward does), not forward
(which, after the head, holds every activation: the two would cross as the model deepens). Every
place is evaluated at the model's depth, each interior layer too (a timeline draws them); the peak
is the highest of the first layer, the last, the interior at both ends (linear in ``K``: its maximum
is at an end) and the outside.

A single peak per phase cannot be extrapolated: which moment is highest changes with the depth
(Llama-3.2-1B: with few layers backward peaks in the head, with many in layer 0, gradients
accumulated). Where a fit is not exact the caller traces every layer.
Pure arithmetic on byte counts: no torch here.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

DEPTHS = (3, 4, 5)
# Where in a step a peak is: before the phase's first layer, after its layers, in the first layer,
# the last, or another (by index). A layer index of -1 stands for "after the layers".
BEFORE, AFTER, FIRST, LAST = "before", "after", "first", "last"
AFTER_LAYERS = -1


def layers_alike(layers: list[Any], config: Any) -> str | None:
    """None where every decoder layer has the same modules and parameter shapes and the config states
    no per-layer kinds; else why not (the caller then traces every layer)."""
    from plangen.model.resolve import text_config
    from plangen.model.config_keys import sets_layer_kinds

    def signature(layer: Any) -> tuple:
        modules = tuple((name, type(m).__name__) for name, m in layer.named_modules())
        params = tuple((name, tuple(p.shape), str(p.dtype)) for name, p in layer.named_parameters())
        return modules, params

    if len({signature(layer) for layer in layers}) > 1:
        return "its decoder layers differ in modules or parameter shapes"
    text = text_config(config)
    for key, value in vars(text).items():
        if isinstance(value, (list, tuple)) and len(value) == len(layers) and len({repr(v) for v in value}) > 1:
            return f"its config sets {key} per layer"
        if sets_layer_kinds(key, value):
            return f"its config sets {key}"
    return None


def config_at_depth(config: Any, depth: int) -> Any:
    """A copy of ``config`` with ``depth`` layers (per-layer lists, all alike, cut to it)."""
    import copy

    from plangen.model.resolve import text_config

    from plangen.cost.widths import apply_width_relations

    config = copy.deepcopy(config)
    text = text_config(config)
    layers = text.num_hidden_layers
    for key, value in list(vars(text).items()):
        if isinstance(value, list) and len(value) == layers:
            setattr(text, key, value[:depth])
    text.num_hidden_layers = depth
    return apply_width_relations(config)


def place(layer: int | None, depth: int) -> str | int:
    """Where ``layer`` of a model of ``depth`` layers is, as the fit tells places apart."""
    if layer is None:
        return BEFORE
    if layer == AFTER_LAYERS:
        return AFTER
    return FIRST if layer == 0 else LAST if layer == depth - 1 else layer


def extrapolate(
    samples: Mapping[int, Mapping[tuple[str, int | None], Mapping[str, int]]], depth: int
) -> dict[tuple[str, int | None], dict[str, int]] | None:
    """Each phase's values at every place of a model of ``depth`` layers (each of its layers), from ``samples``
    (traced depth -> (phase, layer index, None before the layers, -1 after them) -> named byte
    counts); None where the samples are not exactly linear as the module docstring says, or a
    place is missing at some depth."""
    if set(samples) != set(DEPTHS):
        return None
    keyed = {n: {(phase, place(layer, n)): v for (phase, layer), v in by_key.items()} for n, by_key in samples.items()}
    phases = {phase for by_key in keyed.values() for phase, _ in by_key}
    result: dict[tuple[str, int | None], dict[str, int]] = {}
    for phase in sorted(phases):
        for where, layer in ((BEFORE, None), (AFTER, AFTER_LAYERS), (FIRST, 0), (LAST, depth - 1)):
            points = [keyed[n].get((phase, where)) for n in DEPTHS]
            if all(p is None for p in points):
                continue
            fitted = None if any(p is None for p in points) else _fit_depth(points, depth)
            if fitted is None:
                return None
            result[(phase, layer)] = fitted
        interior = {(n, k): keyed[n].get((phase, k)) for n in DEPTHS for k in range(1, n - 1)}
        if all(v is None for v in interior.values()):
            continue
        if any(v is None for v in interior.values()):
            return None
        at = _fit_depth_and_layer(interior)
        if at is None:
            return None
        # Every interior layer, not only the ends where the peak must be: a timeline of the step
        # draws each one (plangen.cost.plot).
        for k in range(1, depth - 1):
            result[(phase, k)] = at(depth, k)
    return result


def traced_layer(layer: int | None, layers: int, traced: int) -> int | None:
    """The layer of a ``traced``-layer model that stands where ``layer`` of a ``layers``-layer one
    does: the first and the last two apart, any other interior layer as one of the traced interior."""
    if layer is None or layer in (0, AFTER_LAYERS):
        return layer
    if layer >= layers - 2:
        return traced - (layers - layer)
    return min(layer, traced - 3)


def renumber_module(module: str, traced: int, layer: int) -> str:
    """``model.layers.2.mlp``, traced in layer ``traced``, as layer ``layer`` of the real model names
    it. Only a label: under checkpointing torch's module tracker may name another layer than the one
    whose backward runs."""
    import re

    return re.sub(rf"\.{traced}(?=\.|$)", f".{layer}", module, count=1)


def _fit_depth(points: list[Mapping[str, int]], depth: int) -> dict[str, int] | None:
    # v(n) = a + b n from the first two depths, checked on the third.
    (n1, n2, n3), (v1, v2, v3) = DEPTHS, points
    if set(v1) != set(v2) or set(v2) != set(v3):
        return None
    out = {}
    for name in v1:
        step = v2[name] - v1[name]
        if v3[name] != v2[name] + step * (n3 - n2):
            return None
        out[name] = v1[name] + step * (depth - n1)
    return out


def _fit_depth_and_layer(points: Mapping[tuple[int, int], Mapping[str, int]]):
    """``at(n, K)``: the values in layer ``K`` of a model of ``n`` layers, ``a + b n + c K`` fitted
    from (n1, 1), (n2, 1), (n2, 2) and checked on every other point; None where one is off."""
    n1, n2 = DEPTHS[:2]
    base, deeper, later = points[(n1, 1)], points[(n2, 1)], points[(n2, 2)]
    names = set(base)
    if any(set(v) != names for v in points.values()):
        return None
    slopes = {name: (deeper[name] - base[name], later[name] - deeper[name]) for name in names}

    def at(n: int, k: int) -> dict[str, int]:
        return {
            name: base[name] + per_depth * (n - n1) + per_layer * (k - 1)
            for name, (per_depth, per_layer) in slopes.items()
        }

    if any(v != at(n, k) for (n, k), v in points.items()):
        return None
    return at


def running_layer(parents: Iterable[str], layer_names: dict[str, int], in_backward: bool) -> int | None:
    """The index of the decoder layer running among the tracker's ``parents`` (module names, the
    root's class first), None outside every layer.

    ModTracker's parents is a set, and in backward it can hold two layers at once (the next layer's
    backward has begun before the last one's post-backward hook ran): the one running is the one
    backward reached last, the lowest index (forward's: the highest). Taking the set's first, as
    this once did, made the choice follow string hashing: one moment fell in either layer from one
    process to the next, and the depth fit saw a peak that was not linear (Llama-3.1-405B)."""
    inside = [layer_names[n] for p in parents if (n := without_root(p)) in layer_names]
    if not inside:
        return None
    return min(inside) if in_backward else max(inside)


def without_root(name: str) -> str:
    # The tracker names modules after the root's class: ``LlamaForCausalLM.model.layers.3``.
    return name.split(".", 1)[1] if "." in name else name

"""Per-layer inputs (Gemma 4's per-layer embeddings): a second input to every decoder layer.

Gemma 4's text model computes, per token, one small vector per layer (width P) and hands layer i
its slice: a token table ``embed_tokens_per_layer`` ([vocab, L·P], vocabulary-parallel like the
token embedding), plus ``per_layer_model_projection`` (a Linear from the token embedding, H to
L·P) normed by ``per_layer_projection_norm`` (width P). Each layer gates its residual with it:
``per_layer_input_gate`` (H to P), times the per-layer input, ``per_layer_projection`` (P to H).
These are small (P is 256 where H is 1536-2560) and per token, so they stay whole on every rank.

Under sequence parallelism everything here runs on this rank's sequence shard, with no
communication: the table's partial lookups are reduce-scattered into sequence shards (where
without SP they are all-reduced), the projection and the norms take the token embedding's shard
(``SequenceParallel``: replicated weights, their gradient summed over TP), and so do the layers'
gate and projection, so each layer's per-layer input is on the same shard as its residual.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

from plangen.plan import PlanEntry, Replicated
from plangen.plans.families.dims import ModelDims

_KEYWORD = "per_layer_input"  # the layer's forward takes its slice under this name


@dataclass(frozen=True)
class PerLayerInputs:
    table: str  # the token table [vocab, layers x width]
    projection: str  # the Linear from the token embedding to layers x width
    norm: str  # the norm over each layer's slice of the projection
    layer_linears: tuple[str, ...]  # in every layer: the Linear into the width and the one back


def find_per_layer_inputs(
    model: nn.Module, layers_path: str, layers: nn.ModuleList, dims: ModelDims
) -> PerLayerInputs | None:
    """The per-layer input modules beside ``layers`` (in the module that holds them), or None."""
    owner_path = layers_path.rpartition(".")[0]
    owner = model.get_submodule(owner_path) if owner_path else model
    prefix = f"{owner_path}." if owner_path else ""
    count = len(layers)
    get_in = getattr(model, "get_input_embeddings", None)
    token_embedding = get_in() if callable(get_in) else None
    tables = [
        (n, c)
        for n, c in owner.named_children()
        if isinstance(c, nn.Embedding) and c is not token_embedding and c.embedding_dim % count == 0
    ]
    if len(tables) != 1 or not all(_KEYWORD in inspect.signature(type(layer).forward).parameters for layer in layers):
        return None
    table, width = tables[0][0], tables[0][1].embedding_dim
    per_layer = width // count
    projections = [
        n
        for n, c in owner.named_children()
        if isinstance(c, nn.Linear) and (c.in_features, c.out_features) == (dims.hidden, width)
    ]
    norms = [
        n
        for n, c in owner.named_children()
        if not isinstance(c, (nn.Linear, nn.Embedding))
        and (shapes := [tuple(p.shape) for p in c.parameters()])
        and set(shapes) == {(per_layer,)}
    ]
    linears = []
    for index, layer in enumerate(layers):
        pair = [
            n
            for n, c in layer.named_children()
            if isinstance(c, nn.Linear) and {c.in_features, c.out_features} == {dims.hidden, per_layer}
        ]
        if len(pair) != 2:
            return None
        linears += [f"{layers_path}.{index}.{n}" for n in pair]
    if len(projections) != 1 or len(norms) != 1:
        return None
    return PerLayerInputs(prefix + table, prefix + projections[0], prefix + norms[0], tuple(linears))


def per_layer_input_entries(found: PerLayerInputs, sequence_parallel: bool) -> tuple[list[PlanEntry], list[Replicated]]:
    """The projection, its norm and the layers' gate and projection: whole on every rank (TP), or on
    this rank's sequence shard (SP). The table's entry is the token tables' (synthesize.py)."""
    outside = (
        (found.projection, "projects the token embedding into every layer's per-layer input"),
        (found.norm, "norms each layer's slice of that projection"),
    )
    if not sequence_parallel:
        return [], [
            Replicated(path, f"{what}: per token and small, whole on every rank", "embeddings")
            for path, what in outside
        ]
    on_shard = dict(sequence_dim=1, use_local_output=False)
    entries = [
        PlanEntry(
            path,
            "SequenceParallel",
            on_shard,
            "embeddings",
            f"{what}: per token, on this rank's sequence shard (no communication; its weight gradient summed over TP)",
        )
        for path, what in outside
    ]
    entries += [
        PlanEntry(
            path,
            "SequenceParallel",
            on_shard,
            "other",
            "per-layer input gate or projection: per token, on this rank's sequence shard with the "
            "layer's per-layer input (no communication; its weight gradient summed over TP)",
        )
        for path in found.layer_linears
    ]
    return entries, []


__all__ = ["PerLayerInputs", "find_per_layer_inputs", "per_layer_input_entries"]

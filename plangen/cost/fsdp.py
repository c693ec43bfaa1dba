"""FSDP2's collectives per step, from the parameters of each FSDP unit (no measurement needed).

plangen's ``apply_fsdp`` makes each decoder layer a unit and the root (embeddings, final norm,
head) one more, with the root kept unsharded after forward. Per step of one micro-batch:

* forward: one all-gather per unit of its parameters in ``param_dtype`` (the compute dtype);
* backward: one all-gather per layer again (layers are resharded after forward; the root is not),
  then one reduce-scatter per unit of its gradients in ``reduce_dtype`` (float32).

Each all-gather produces the unit's TP-local parameters with each one's shard dim (dim 0, or the
runtime's other choice where dim 0 would pad more than 1 %: :mod:`plangen.runtime.fsdp_shard`) padded to a
multiple of the DP size; each reduce-scatter reduces a tensor of that size. With DP size 1 there is nothing to
gather or reduce.
"""

from __future__ import annotations

from torch import nn

from plangen.cost.data import CollectiveCost
from plangen.cost.memory import ParameterShard, read_parameter_shards
from plangen.cost.scaling import payload_and_sent
from plangen.cost.settings import CostSettings


def read_unit_numels(model: nn.Module, dp_size: int) -> tuple[list[int], int]:
    """Padded TP-local elements of each layer unit, and of the root unit (everything else)."""
    from plangen.model.module_tree import find_transformer_layers

    layers = find_transformer_layers(model)
    in_layers: set[str] = set()
    layer_numels = []
    names = {id(m): n for n, m in model.named_modules()}
    for layer in layers:
        prefix = names[id(layer)]
        shards = read_parameter_shards(layer)
        layer_numels.append(sum(s.padded_numel(dp_size) for s in shards))
        in_layers.update(f"{prefix}.{s.name}" for s in shards)
    root: list[ParameterShard] = [s for s in read_parameter_shards(model) if s.name not in in_layers]
    return layer_numels, sum(s.padded_numel(dp_size) for s in root)


def build_fsdp_collectives(layer_numels: list[int], root_numel: int, settings: CostSettings) -> list[CollectiveCost]:
    dp = settings.dp_size
    if dp <= 1:
        return []
    layers = len(layer_numels)
    layer_total = sum(layer_numels)
    gather, reduce = settings.dtype_bytes, settings.reduce_bytes

    def row(phase: str, kind: str, tensor: str, scope: str, count: int, payload: int) -> CollectiveCost:
        _, sent = payload_and_sent(kind, payload / dp if kind == "reduce-scatter" else payload, dp)
        return CollectiveCost("FSDP2", phase, kind, tensor, scope, count, payload, round(sent))

    rows = []
    if layers:
        rows.append(row("forward", "all-gather", "layer params", "per layer", layers, layer_total * gather))
        rows.append(row("backward", "all-gather", "layer params", "per layer", layers, layer_total * gather))
        rows.append(row("backward", "reduce-scatter", "layer grads", "per layer", layers, layer_total * reduce))
    if root_numel:
        rows.append(row("forward", "all-gather", "root params", "once", 1, root_numel * gather))
        rows.append(row("backward", "reduce-scatter", "root grads", "once", 1, root_numel * reduce))
    return rows

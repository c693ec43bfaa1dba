"""Which dim FSDP2 shards a parameter on over DP: one rule, for the runtime and for ``plangen cost``.

FSDP2 shards dim 0 unless told otherwise, padding it to a multiple of the DP size: a rank whose
rows run out holds padding of the same size. That costs nothing worth a rule while dim 0 is large,
but experts split over TP can leave a rank one expert (Mixtral-8x7B at TP 8: ``gate_up_proj``
``[1, 2I, H]``): over DP 2, rank 0 holds the expert and rank 1 an expert-sized pad, so DP saves
nothing on 96 % of the weights (``plangen cost``: 1.97x the ideal memory per rank). A few experts
the DP size does not divide pad a share of them: FlexOlmo's 7 (each split on its intermediate at
TP 2) over DP 2 are 4 + 4 rows, 1.13x the ideal.

The rule: where padding dim 0 to a multiple of the DP shard size would add more than
:data:`MAX_PAD_SHARE` of the parameter (some DP rank would hold padding only, or a sizeable share of
it), shard the first other dim the DP size divides (FSDP2 requires even shards off dim 0); everywhere
else dim 0, FSDP2's own default, so every other parameter is laid out as before.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard


# Padding of dim 0 above this share of a parameter moves FSDP2 to another dim: a vocabulary of 151,937
# rows over DP 8 pads 7 (0.005 %) and stays; 7 experts over DP 2 pad one (14 %) and move.
MAX_PAD_SHARE = 0.01


def fsdp_shard_dim(local_shape: Sequence[int], dp_shard_size: int) -> int:
    """The dim FSDP2 shards a parameter of TP-local shape ``local_shape`` on over ``dp_shard_size`` ranks."""
    if dp_shard_size <= 1 or len(local_shape) < 2 or -local_shape[0] % dp_shard_size <= MAX_PAD_SHARE * local_shape[0]:
        return 0
    for dim in range(1, len(local_shape)):
        if local_shape[dim] % dp_shard_size == 0:
            return dim
    return 0  # nothing divides: FSDP2 pads dim 0 as it would anyway


def dp_shard_size(dp_mesh: DeviceMesh) -> int:
    """The ranks FSDP2 shards over: the whole DP mesh, or its last dim for HSDP's (replicate, shard) mesh."""
    return dp_mesh.size(dp_mesh.ndim - 1)


def build_shard_placement_fn(shard_size: int) -> Callable[[nn.Parameter], Shard | None]:
    """``fully_shard``'s ``shard_placement_fn`` for :func:`fsdp_shard_dim`: ``None`` (its default,
    ``Shard(0)``) where dim 0 stays, else ``Shard(dim)``."""

    def placement(param: nn.Parameter) -> Shard | None:
        local: torch.Tensor = param.to_local() if isinstance(param, DTensor) else param
        dim = fsdp_shard_dim(tuple(local.shape), shard_size)
        return Shard(dim) if dim else None

    return placement

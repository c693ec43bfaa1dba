"""Attention whose projections are plain parameters applied by ``torch.einsum`` (XLNet's): why it stays whole.

``XLNetRelativeAttention`` holds q, k, v, o and the relative-position projection r as
``nn.Parameter`` of shape ``[d_model, n_head, d_head]`` (``torch.einsum("ibh,hnd->ibnd", h, self.q)``),
beside per-head biases ``[n_head, d_head]`` and a segment embedding ``[2, n_head, d_head]``. torch's
styles shard ``nn.Linear`` modules; sharding these on the head dimension needs a style of the block's
own (each rank its heads of every parameter, o's output a partial sum all-reduced before the
residual add and the layer norm the block applies itself), which plangen does not have yet.
"""

from __future__ import annotations

from torch import nn

from plangen.plans.families.dims import ModelDims, own_parameters


def einsum_heads_reason(block: nn.Module, dims: ModelDims) -> str | None:
    """Why ``block`` stays whole when two or more of its own parameters are ``[hidden, heads, head_dim]``
    projections (applied by einsum, not nn.Linear); None otherwise."""
    if not dims.heads or not dims.head_dim:
        return None
    shape = (dims.hidden, dims.heads, dims.head_dim)
    own = own_parameters(block)
    projections = [name for name, s in own.items() if tuple(s) == shape]
    if len(projections) < 2:
        return None
    per_head = [
        name for name, s in own.items() if len(s) >= 2 and tuple(s[-2:]) == shape[1:] and name not in projections
    ]
    return (
        f"attention projections held as parameters [hidden, heads, head_dim] ({', '.join(projections)}) with per-head"
        f" {', '.join(per_head) or 'parameters'}, applied by einsum, not nn.Linear: no style shards them on the head"
        " dimension (o's output would be a partial sum, to reduce before the block's own residual add and norm)"
    )

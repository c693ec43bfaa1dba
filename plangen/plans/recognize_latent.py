"""Multi-head latent attention (DeepSeek-V2/V3's layout and its copies), recognised by its modules.

Sharded by heads as :func:`plangen.plans.latent.latent_attention_entries` says: the small
down-projections and their norms whole on every rank (the query latent split too where the class's
is a large share of it: :func:`plangen.plans.latent.shards_query_latent`), the per-head
up-projections column-parallel, ``o_proj`` row-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from plangen.plans.dims import ModelDims, has_parameters, is_linear, own_parameters


@dataclass(frozen=True)
class LatentBlock:
    """Multi-head latent attention (DeepSeek-V2/V3's layout, copied by MiniCPM3, GLM-4-MoE-Lite...):
    sharded by heads as :func:`plangen.plans.latent.latent_attention_entries` says."""

    query_latent: bool  # q_a_proj -> q_a_layernorm -> q_b_proj, else q_proj
    shard_query_latent: bool = False  # plangen.plans.latent.shards_query_latent: the query latent split over TP
    kind: str = "attention"


# transformers' names of the latent attention's modules: MlaAttentionParallel hooks them by name.
_LATENT_PARTS = {"kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"}
_QUERY_PARTS = ({"q_a_proj", "q_a_layernorm", "q_b_proj"}, {"q_proj"})


def recognize_latent_attention(block: nn.Module, dims: ModelDims) -> LatentBlock | None:
    """transformers' multi-head latent attention, with nothing else in it (no sparse-attention indexer):
    its rope width readable from its shapes, its up-projections a whole number of heads."""
    from plangen.styles.latent_attention import rope_width
    from plangen.plans.latent import shards_query_latent

    names = {name for name, child in block.named_children() if has_parameters(child)}
    query = next((q for q in _QUERY_PARTS if names == _LATENT_PARTS | q), None)
    if query is None or own_parameters(block) or not dims.heads:
        return None
    ups = [getattr(block, n) for n in ("kv_b_proj", "q_b_proj" if "q_b_proj" in query else "q_proj")]
    out = getattr(block, "o_proj")
    if not all(is_linear(m) for m in (*ups, out)) or out.out_features != dims.hidden:
        return None
    if any(m.out_features % dims.heads for m in ups) or out.in_features % dims.heads:
        return None
    try:
        rope_width(block)
    except ValueError:
        return None
    query_latent = "q_b_proj" in query
    return LatentBlock(query_latent, query_latent and shards_query_latent(getattr(block, "config", None)))

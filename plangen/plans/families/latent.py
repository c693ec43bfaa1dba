"""Multi-head latent attention (DeepSeek-V2/V3's layout and its copies), recognised by its modules.

Sharded by heads as :func:`plangen.plans.families.latent.latent_attention_entries` says: the small
down-projections and their norms whole on every rank (the query latent split too where the class's
is a large share of it: :func:`plangen.plans.families.latent.shards_query_latent`), the per-head
up-projections column-parallel, ``o_proj`` row-parallel.

Multi-head latent attention (MLA) sharded by heads, as plan entries (see :mod:`plangen.styles.latent_attention`).

The down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms stay whole on every
rank: they are small and every head reads them. The per-head up-projections (``q_b_proj``, or
``q_proj`` where there is no query latent, as in DeepSeek-V2-Lite, and ``kv_b_proj``) are
column-parallel, ``o_proj`` row-parallel. The attention module itself gets
:class:`~plangen.styles.latent_attention.MlaAttentionParallel`: it hands the replicated down-projections the whole
block input as a local tensor (all-gathered once under sequence parallel) and sums the shared rope
key's gradient over TP, reading the rope width from the module when applied.

Per MLA layer: forward one all-reduce (``o_proj``), or one all-gather and one reduce-scatter under
SP, as a dense attention block; backward three all-reduces of activation gradients, each the size of
what it reduces: the query up-projection's input (the query latent, or the hidden state for
``q_proj``), the KV latent (``kv_b_proj``'s input) and the rope key. Summing them into one would
leave the replicated down-projections' weight gradients partial, a reduction per weight instead.

Where the query latent is a large share of the model (:func:`shards_query_latent`: Youtu), it is
sharded too: ``q_a_proj`` column-parallel, ``q_a_layernorm`` with its statistics summed over TP,
the latent all-gathered into ``q_b_proj``. Per layer that trades the query latent's backward
all-reduce (B·S·Lq) for an all-gather of it forward and a reduce-scatter backward (each half its
bytes at TP 2), two all-reduces of B·S values (the norm's statistics) and one reduction of the block
input's gradient (B·S·H: an all-reduce, or under SP a reduce-scatter). The KV latent stays whole:
``kv_a_proj_with_mqa`` also computes the rope key every head shares, so a split of it would need its
rope columns kept whole beside a sharded latent, and the latent gathered again for ``kv_b_proj``,
for 1.9 % of Youtu.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry, Replicated, WELL_SHARDED
from plangen.plans.families.dims import has_parameters, is_linear, ModelDims, own_parameters
from plangen.plans.layouts import row_parallel_output, SEQ
from plangen.styles.latent_attention import KV_UP_PROJ, LATENT_KV_PROJ, QUERY_DOWN_PROJ
from plangen.plans.layouts import hidden_state_layouts
from plangen.plans.families.block import FamilyBlock, UNREAD_CALL, Unplaced

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart


@dataclass(frozen=True)
class LatentBlock(FamilyBlock):
    """Multi-head latent attention (DeepSeek-V2/V3's layout, copied by MiniCPM3, GLM-4-MoE-Lite...):
    sharded by heads as :func:`plangen.plans.families.latent.latent_attention_entries` says."""

    query_latent: bool  # q_a_proj -> q_a_layernorm -> q_b_proj, else q_proj
    shard_query_latent: bool = (
        False  # plangen.plans.families.latent.shards_query_latent: the query latent split over TP
    )
    kind: str = "attention"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return latent_block_entries(part, sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        # Its style hands the replicated down-projections a local input: it must be where the layer calls it.
        return Unplaced(f"latent attention {UNREAD_CALL}", "attention") if call is None else None

    def kept_beside(self, path: str) -> list[Replicated]:
        _, kept = latent_attention_entries(
            path,
            sequence_parallel=False,
            query_latent=self.query_latent,
            shard_query_latent=self.shard_query_latent,
        )
        return list(kept)


# transformers' names of the latent attention's modules: MlaAttentionParallel hooks them by name.
_LATENT_PARTS = {"kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"}
_QUERY_PARTS = ({"q_a_proj", "q_a_layernorm", "q_b_proj"}, {"q_proj"})


def recognize_latent_attention(block: nn.Module, dims: ModelDims) -> LatentBlock | None:
    """transformers' multi-head latent attention, with nothing else in it (no sparse-attention indexer):
    its rope width readable from its shapes, its up-projections a whole number of heads."""
    from plangen.styles.latent_attention import rope_width
    from plangen.plans.families.latent import shards_query_latent

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


QUERY_DOWN = (QUERY_DOWN_PROJ, "q_a_layernorm")
KV_DOWN = (LATENT_KV_PROJ, "kv_a_layernorm")
# What a plan may leave whole (plangen.plan.WELL_SHARDED, issue 11's goal of 95 % sharded).
LEFT_WHOLE_ALLOWANCE = round(1 - WELL_SHARDED, 6)


def has_query_latent(model: nn.Module) -> bool:
    """Whether the attention compresses the query too (``q_lora_rank``), from the module tree."""
    return any(name.endswith(".q_b_proj") for name, _ in model.named_modules())


def shards_query_latent(config: Any) -> bool:
    """Whether MLA's query latent is sharded over TP, for the class of ``config`` (its ``model_type``).

    The rule: where the latent down-projections and their norms (``q_a_proj``, ``q_a_layernorm``,
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``) hold more than :data:`LEFT_WHOLE_ALLOWANCE` of the
    class's parameters at its default size, keeping them whole alone misses issue 11's goal, and the
    query latent (the larger, whose split is exact) is sharded. At transformers 5.x's defaults
    (``docs/plans.md`` lists the parts left whole; ``tests/test_synthesize.py`` every MLA class's):
    Youtu 7.1 % (q 5.1 %, KV 1.9 %): sharded; MiniCPM3 4.1 %, DeepSeek-V2 0.7 %, GLM-4-MoE-Lite
    0.4 %, HY-V4 0.35 %, DeepSeek-V3 (Kimi-K2's class) 0.14 %, every other below 0.3 %: whole, as the
    MLA layout keeps them. Sharding it costs per layer an all-gather of B·S·Lq and a reduction of the
    block input's gradient (B·S·H), for 5.1 % of Youtu off every TP rank (``docs/moe.md``: +5 % of
    the step's traffic, 1.07x -> 1.02x of the ideal memory per rank at TP 2 x DP 2).

    Decided at the class's default size, not the model's own: the sweep proves a class's plan on a
    shrunk model (latent ranks of 32), and the runtime uses the proven plan for every model of the
    class, so the choice must be the class's.
    """
    model_type = getattr(config, "model_type", None)
    return isinstance(model_type, str) and latent_down_share(model_type) > LEFT_WHOLE_ALLOWANCE


@lru_cache(maxsize=None)
def latent_down_share(model_type: str) -> float:
    """The share of the parameters of ``model_type``'s class at its default size (meta device) held by
    MLA's down-projections and their norms; 0.0 where its default config does not build."""
    from plangen.model.resolve import build_full_size_meta_model, resolve_model

    try:
        model = build_full_size_meta_model(resolve_model(model_type))
    except Exception:  # noqa: BLE001 - transformers' default configs fail in many ways: kept whole
        return 0.0
    total = down = 0
    for name, param in model.named_parameters():  # a tied weight once
        total += param.numel()
        owner = name.rsplit(".", 2)[-2] if name.count(".") else ""
        if owner in (*QUERY_DOWN, *KV_DOWN):
            down += param.numel()
    return down / total if total else 0.0


def latent_attention_entries(
    attention: str, *, sequence_parallel: bool, query_latent: bool, shard_query_latent: bool = False
) -> tuple[list[PlanEntry], list[Replicated]]:
    """The entries for the MLA modules matching ``attention`` (``model.layers.*.self_attn``), and
    the modules they leave whole on purpose. ``shard_query_latent`` (:func:`shards_query_latent`):
    the query latent split over TP, not kept whole."""
    sp = sequence_parallel
    sharded = query_latent and shard_query_latent
    colwise = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    prepared = dict(
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts={"hidden_states": SEQ if sp else Replicate()},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=True,
    )
    why = (
        ("one all-gather of the sequence per attention block" if sp else "no communication")
        + "; a local input for the replicated down-projections; the shared rope key's gradient summed"
        " over TP (its width read from the module)"
    )
    if sharded:
        prepared["sharded_query_latent"] = True
        why += (
            "; q_a_proj's input gradient left partial and the block input's reduced once ("
            + ("a reduce-scatter, the gather's backward" if sp else "one all-reduce")
            + ")"
        )
    entries = [PlanEntry(attention, "MlaAttentionParallel", prepared, "attention", why)]
    if sharded:
        entries += [
            PlanEntry(
                f"{attention}.{QUERY_DOWN_PROJ}",
                "ColwiseParallel",
                colwise,
                "attention",
                "column-parallel: each rank computes its slice of the query latent (its input gradient reduced "
                "with the block's)",
            ),
            PlanEntry(
                f"{attention}.q_a_layernorm",
                "ShardedNormParallel",
                {},
                "attention",
                "the norm over the whole query latent: weight with its slice, statistics summed over TP "
                "(one all-reduce of B·S values each way)",
            ),
            PlanEntry(
                f"{attention}.q_b_proj",
                "ColwiseParallel",
                dict(colwise, input_layouts=Shard(-1)),
                "attention",
                "column-parallel on the query latent, all-gathered (its gradient reduce-scattered back): each "
                "rank computes its own heads' queries",
            ),
        ]
    else:
        entries.append(
            PlanEntry(
                f"{attention}.{'q_b_proj' if query_latent else 'q_proj'}",
                "ColwiseParallel",
                colwise,
                "attention",
                "column-parallel: each rank computes its own heads' queries",
            )
        )
    entries += [
        PlanEntry(
            f"{attention}.{KV_UP_PROJ}",
            "ColwiseParallel",
            colwise,
            "attention",
            "column-parallel: each rank computes its own heads' keys and values",
        ),
        PlanEntry(
            f"{attention}.o_proj",
            "RowwiseParallel",
            row_parallel_output(sp)[0],
            "attention",
            "row-parallel: " + row_parallel_output(sp)[1],
        ),
    ]
    why = "low-rank down-projection (or its norm), shared by every head: computed whole on every rank"
    kept = [Replicated(f"{attention}.{name}", why, "attention") for name in QUERY_DOWN if query_latent and not sharded]
    kept += [
        Replicated(
            f"{attention}.{LATENT_KV_PROJ}",
            "the KV latent and the shared rope key, computed whole on every "
            "rank; the rope key's gradient is summed over TP by the attention's MlaAttentionParallel",
            "attention",
        ),
        Replicated(f"{attention}.kv_a_layernorm", why, "attention"),
    ]
    return entries, kept


def latent_block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """Multi-head latent attention as the hand-written DeepSeek plans shard it, its input where the layer passes it."""
    assert isinstance(part.block, LatentBlock) and part.call is not None
    entries, _ = latent_attention_entries(
        part.path,
        sequence_parallel=sp,
        query_latent=part.block.query_latent,
        shard_query_latent=part.block.shard_query_latent,
    )
    first = entries[0]
    prepared = {**first.kwargs, **hidden_state_layouts(part.call, sp)}  # where the layer passes the hidden state
    return [PlanEntry(first.pattern, first.style, prepared, first.group, first.why), *entries[1:]]

"""Multi-head latent attention (MLA) sharded by heads, as plan entries (see :mod:`plangen.mla_styles`).

The down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) and their norms stay whole on every
rank: they are small and every head reads them. The per-head up-projections (``q_b_proj``, or
``q_proj`` where there is no query latent, as in DeepSeek-V2-Lite, and ``kv_b_proj``) are
column-parallel, ``o_proj`` row-parallel. The attention module itself gets
:class:`~plangen.mla_styles.MlaAttentionParallel`: it hands the replicated down-projections the whole
block input as a local tensor (all-gathered once under sequence parallel) and sums the shared rope
key's gradient over TP, reading the rope width from the module when applied.

Per MLA layer: forward one all-reduce (``o_proj``), or one all-gather and one reduce-scatter under
SP, as a dense attention block; backward three all-reduces of activation gradients, each the size of
what it reduces: the query up-projection's input (the query latent, or the hidden state for
``q_proj``), the KV latent (``kv_b_proj``'s input) and the rope key. Summing them into one would
leave the replicated down-projections' weight gradients partial, a reduction per weight instead.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.mla_styles import KV_UP_PROJ, LATENT_KV_PROJ
from plangen.plan import PlanEntry, Replicated
from plangen.plans.layouts import SEQ, row_parallel_output

QUERY_DOWN = ("q_a_proj", "q_a_layernorm")


def has_query_latent(model: nn.Module) -> bool:
    """Whether the attention compresses the query too (``q_lora_rank``), from the module tree."""
    return any(name.endswith(".q_b_proj") for name, _ in model.named_modules())


def latent_attention_entries(
    attention: str, *, sequence_parallel: bool, query_latent: bool
) -> tuple[list[PlanEntry], list[Replicated]]:
    """The entries for the MLA modules matching ``attention`` (``model.layers.*.self_attn``), and
    the modules they leave whole on purpose."""
    sp = sequence_parallel
    colwise = dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    entries = [
        PlanEntry(
            attention, "MlaAttentionParallel",
            dict(input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts={"hidden_states": SEQ if sp else Replicate()},
                 desired_input_kwarg_layouts={"hidden_states": Replicate()}, use_local_output=True),
            "attention",
            ("one all-gather of the sequence per attention block" if sp else "no communication")
            + "; a local input for the replicated down-projections; the shared rope key's gradient summed"
            " over TP (its width read from the module)",
        ),
        PlanEntry(f"{attention}.{'q_b_proj' if query_latent else 'q_proj'}", "ColwiseParallel", colwise, "attention",
                  "column-parallel: each rank computes its own heads' queries"),
        PlanEntry(f"{attention}.{KV_UP_PROJ}", "ColwiseParallel", colwise, "attention",
                  "column-parallel: each rank computes its own heads' keys and values"),
        PlanEntry(
            f"{attention}.o_proj", "RowwiseParallel",
            row_parallel_output(sp)[0],
            "attention",
            "row-parallel: " + row_parallel_output(sp)[1],
        ),
    ]
    why = "low-rank down-projection (or its norm), shared by every head: computed whole on every rank"
    kept = [Replicated(f"{attention}.{name}", why, "attention") for name in QUERY_DOWN if query_latent]
    kept += [
        Replicated(f"{attention}.{LATENT_KV_PROJ}", "the KV latent and the shared rope key, computed whole on every "
                   "rank; the rope key's gradient is summed over TP by the attention's MlaAttentionParallel",
                   "attention"),
        Replicated(f"{attention}.kv_a_layernorm", why, "attention"),
    ]
    return entries, kept

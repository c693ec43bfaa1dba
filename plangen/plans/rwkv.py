"""Hand-written plan for RWKV-4 (``RwkvForCausalLM``): both mixers of every block split by channels.

The time mixing's WKV recurrence and the channel mixing's gate act per channel, so each rank holds
its slice of the channels (:mod:`plangen.styles.rwkv`): the time mixing's key, value, receptance,
``time_decay`` and ``time_first`` (``output`` row-parallel: one all-reduce), the channel mixing's
key, receptance (by rows) and value (by columns: its partial sum reduce-scattered onto the
receptance's channels, the gated product all-gathered). The ``time_mix_*`` act on the whole input
and stay whole, their gradients summed over TP. The embedding and the head are vocabulary-parallel.

No sequence parallel: the channel mixing's gate meets its value on channel shards, which a
sequence-sharded residual stream would need re-laid out (an all-to-all) around every block.

Why hand-written, not synthesized: the synthesizer's recognisers read attention by heads and MLPs
whose gate is column-parallel; RWKV has no heads, its mixers read their own parameters, and its
channel mixing's gate (hidden -> hidden) multiplies the down projection's output.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import Plan, PlanEntry, Replicated
from plangen.plans.registry import register_plan

BLOCK = "rwkv.blocks.*"


@register_plan("RwkvForCausalLM")
def plan_rwkv(model: nn.Module, sequence_parallel: bool) -> Plan:
    if sequence_parallel:
        raise ValueError(
            f"{type(model).__name__}: no sequence-parallel plan: the channel mixing's gate meets its value on channel "
            "shards, which a sequence-sharded residual stream would need re-laid out around every block; "
            "use sequence_parallel=False"
        )
    entries = (
        PlanEntry(
            "rwkv.embeddings",
            "RowwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),
            "embeddings",
            "vocab-parallel embedding; all-reduce",
        ),
        PlanEntry(
            f"{BLOCK}.attention",
            "RwkvTimeMixParallel",
            {},
            "attention",
            "time mixing split by channels: key/value/receptance rows, time_decay/time_first with them; "
            "its input's gradient summed once, the time_mix_* gradients by one small all-reduce",
        ),
        PlanEntry(
            f"{BLOCK}.attention.output",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=Replicate(), use_local_output=True),
            "attention",
            "row-parallel: one all-reduce",
        ),
        PlanEntry(
            f"{BLOCK}.feed_forward",
            "RwkvChannelMixParallel",
            {},
            "mlp",
            "channel mixing split by channels: key and receptance rows, value columns (its partial sum "
            "reduce-scattered onto the receptance's channels), the gated product all-gathered",
        ),
        PlanEntry(
            "head",
            "ColwiseParallel",
            dict(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
            "output",
            "vocab-parallel logits (Shard(-1)); use plangen.loss.vocab_parallel_cross_entropy",
        ),
    )
    norms = (f"{BLOCK}.pre_ln", f"{BLOCK}.ln1", f"{BLOCK}.ln2", "rwkv.ln_out")
    replicated = tuple(
        Replicated(n, "sees the full hidden state on every rank: nothing to shard", "norms") for n in norms
    )
    return Plan(entries, "hand-written", replicated, False)

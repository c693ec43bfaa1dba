"""The families most decoder layers are made of: attention, MLPs and mixtures of experts, recognized
by structure and shapes, with their plan entries; and what a recognized block is (``ShardedBlock``,
``KeptBlock``).

Each recognizer looks at one module and the model's dimensions (from its config) and answers what
the module is and how it may be sharded, or why it may not (the order families are asked in is
:mod:`plangen.plans.families.registry`'s). Names are never the evidence: a
projection is column-parallel because it reads the block's input (its forward source says so, see
:mod:`plangen.plans.source.forward`) and its output is a whole number of heads; row-parallel
because it maps heads (or the intermediate width) back to the hidden size. Names only label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dataclasses import dataclass

from torch import nn

from plangen.plans.source.forward import (
    BlockCall,
    read_applied_to,
    read_argument_chains,
    read_block_call,
    read_fed_by,
    read_input_readers,
    read_returned_child,
)
from plangen.plans.families.dims import (
    ModelDims,
    describe,
    has_parameters,
    is_linear,
    is_per_feature,
    own_parameters,
    sequential_readers,
    wrapped_linear,
)
from plangen.plans.families.einsum import einsum_heads_reason
from plangen.plans.families.gated import read_output_gates
from plangen.plans.source.shape import ShapeSizes, read_shape_sizes
from plangen.plans.source.paired import read_paired_heads
from plangen.stack.transformers_compat import experts_split_over_ranks
from plangen.styles.attention import short_conv_only
from plangen.plans.families.moe_parts import is_router, packed_shared_children, router_rows, takes_routing
from plangen.plans.source.split import read_fed_from
from plangen.plans.source.width import read_input_only_sized_and_projected
from torch.distributed.tensor import Partial, Replicate, Shard
from plangen.plan import PlanEntry, Replicated
from plangen.plans.families.layer_experts import layer_experts_entries
from plangen.plans.families.per_head_inputs import batch_head_rows_why
from plangen.plans.layouts import SEQ, hidden_state_layouts, row_parallel_output
from plangen.styles.experts import EXPERTS_PARALLEL_WHY, INPUT_GRAD_LEFT_WHY
from plangen.plans.families.block import FamilyBlock, UNREAD_CALL, Unplaced

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.source.forward import BlockCall
    from plangen.plans.synthesis.findings import BlockPart


# ---------------------------------------------------------------------------------------------
# Blocks


@dataclass(frozen=True)
class ShardedBlock(FamilyBlock):
    """A block sharded Megatron-style: column-parallel projections in, one row-parallel out.

    ``per_head_norms`` are norms of one head's width applied after the column-parallel projections:
    each rank sees only its heads, so their weight gradient must be summed over TP.
    ``projection_norms`` are norms over a whole column-parallel projection's output (OLMo-2): sharded
    with its heads, their statistics summed over TP.
    """

    kind: str  # "attention" | "mlp"
    colwise: tuple[str, ...]
    rowwise: str
    per_head_norms: tuple[str, ...] = ()
    # Attention with fewer KV heads than query heads: the k/v projections, whose heads a TP size
    # above the KV head count replicates (plangen.styles.kv_heads).
    kv_projections: tuple[str, ...] = ()
    projection_norms: tuple[str, ...] = ()
    # Column-parallel projections that pack parts ([gate; up]), with the parts' proportions:
    # re-laid out so each rank holds its slice of every part (plangen.styles.fused).
    fused: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # Multi-query attention: the parts of the fused projection (by index) that are its one key and one
    # value head, computed whole on every rank (plangen.styles.fused.MultiQueryColwiseParallel).
    shared_parts: tuple[int, ...] = ()
    # Children whose parameters are single values applied alike to every feature (an activation's
    # learnable scalars): replicated, their gradient summed over TP (AllReduceParamGrads).
    scalar_children: tuple[str, ...] = ()
    # An MLP whose forward keeps its gate's Gaussian top-k, by statistics over the whole intermediate
    # (Gemma 3n's activation sparsity): taken over TP (plangen.styles.sparsity).
    gate_statistics: bool = False
    # Attention that reuses an earlier layer's keys and values (no k/v projections of its own): its
    # KV grouping is made this rank's as where the KV heads are replicated (plangen.styles.kv_heads).
    reads_shared_kv: bool = False
    # Attributes the attention's forward shapes its tensors by that count all heads (OPT's
    # ``view(bsz, -1, self.num_heads, self.head_dim)``; a packed q|k|v viewed by ``self.num_heads``):
    # made this rank's when the plan is applied.
    head_attributes: tuple[str, ...] = ()
    # The attention block's own parameters of one value per query head (attention sinks): split
    # with the heads by the block's own style (plangen.styles.attention.AttentionSinksParallel).
    head_parameters: tuple[str, ...] = ()
    # Differential attention (DiffLlama): heads paired i, i + H/2, so q/k/v are laid out in two halves
    # (each rank its slice of both: whole pairs), and the block's own parameters, reduced to one scalar
    # every head shares, replicated with their gradient summed (plangen.styles.attention.PairedHeadsAttentionInput).
    shared_parameters: tuple[str, ...] = ()
    # The forward shapes by its input's own width (TrOCR): it is handed this rank's slice of the
    # hidden dimension, which each column-parallel projection all-gathers (plangen.plans.source.width).
    input_sharded: bool = False
    # Linears from all KV heads' values to one value per KV head (Doge's dynamic-mask dt_proj):
    # row-parallel, the partial sums reduce-scattered to this rank's heads.
    head_gates: tuple[str, ...] = ()
    # Short convs on a projection's heads (Inkling's k/v, plangen.plans.families.conv_attention):
    # their channels split with the heads (ConvChannelsParallel); children every local head reads
    # (its relative-logits bank): replicated, their gradient summed over TP (AllReduceParamGrads).
    conv_children: tuple[str, ...] = ()
    shared_children: tuple[str, ...] = ()
    # Own tables with no heads axis, one row per head feature, read alike by every local head (GOT-OCR2's
    # relative positions): replicated, their gradient summed over TP by the block's input style.
    shared_tables: tuple[str, ...] = ()
    # Multi-query attention whose query head count no even TP size divides (Falcon-7B's 71): padded
    # with zero heads to a multiple of the TP size when the plan is applied (plangen.styles.padded_heads).
    padded_heads: bool = False

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return sharded_block_entries(part, sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        if call is None and (self.head_parameters or self.shared_parameters or self.input_sharded):
            # Its per-head parameters or its input's slice come from the block's own input style.
            own = self.head_parameters or self.shared_parameters
            what = "per-head parameters" if own else "a forward shaped by its input's width"
            return Unplaced(f"attention with {what} {UNREAD_CALL}", "attention")
        return None


@dataclass(frozen=True)
class KeptBlock:
    """A block left replicated, and why (shown in the plan file)."""

    kind: str  # "attention" | "mlp" | "moe" | "mixer" | "other"
    why: str


def child_linears(block: nn.Module, unwrap: bool = False) -> dict[str, nn.Linear]:
    """The block's ``nn.Linear`` children by name; with ``unwrap``, also the one linear inside a child
    that only wraps it, by its path (``q_proj.linear``), the linear sharded."""
    found = {}
    for name, child in block.named_children():
        inner = wrapped_linear(child) if unwrap else None
        if is_linear(child):
            found[name] = child
        elif inner is not None:
            found[f"{name}.{inner[0]}"] = inner[1]
    return found


def _child(name: str) -> str:
    return name.split(".")[0]  # a wrapped linear's wrapper, the block's own child


def split_by_reading(
    block: nn.Module, readers: frozenset[str] | None = None, unwrap: bool = False
) -> tuple[dict[str, nn.Linear], dict[str, nn.Linear]] | None:
    """The block's linears that read its input (``readers``: as its caller shows them), and the
    others; None when its source cannot be read."""
    readers = read_input_readers(type(block)) if readers is None else readers
    if readers is None:
        return None
    linears = child_linears(block, unwrap)
    reading = {n: m for n, m in linears.items() if _child(n) in readers}
    return reading, {n: m for n, m in linears.items() if _child(n) not in readers}


def unexpected_children(block: nn.Module, known: set[str]) -> list[str]:
    children = {_child(n) for n in known}
    return [describe(n, c) for n, c in block.named_children() if n not in children and has_parameters(c)]


def packed_qkv(reading: dict[str, nn.Linear], dims: ModelDims) -> KeptBlock | None:
    """One input projection as wide as q, k and v together: the parts would need strided shards."""
    d, n, k = dims.head_dim, dims.heads, dims.kv_heads or dims.heads
    if len(reading) != 1:
        return None
    ((name, linear),) = reading.items()
    if linear.in_features != dims.hidden or linear.out_features != (n + 2 * k) * d:
        return None
    return KeptBlock(
        "attention",
        f"packed q|k|v projection {name} (out {linear.out_features} = ({n}+2x{k}) heads x {d}): its parts "
        "would need strided shards, which FSDP2 cannot lay out",
    )


def attention_norms(block: nn.Module, skip: set[str], dims: ModelDims) -> tuple[list[str], list[str]]:
    """Norms inside attention: one head wide (shardable with the heads), or as wide as a projection (not)."""
    d, n, k = dims.head_dim, dims.heads, dims.kv_heads or dims.heads
    per_head, whole = [], []
    skip = {_child(n) for n in skip}
    for name, child in block.named_children():
        if name in skip or not has_parameters(child):
            continue
        if is_per_feature(child, d):
            per_head.append(name)
        elif is_per_feature(child, n * d) or is_per_feature(child, k * d):
            whole.append(name)
    return per_head, whole


def recognize_attention(
    block: nn.Module, dims: ModelDims, readers: frozenset[str] | None = None
) -> ShardedBlock | KeptBlock | None:
    """Self-attention with separate head projections: shard by heads, or say why not.

    Column-parallel: the projections that read the block input (``readers``: as its caller shows
    them, see :func:`~plangen.plans.source.split.read_alike_readers`) and give a whole number of
    heads (q, k, v, an output gate: :mod:`plangen.plans.families.gated`). Row-parallel: the one projection from all heads back to the
    hidden size. None when the block does not look like attention at all.
    """
    split = split_by_reading(block, readers, unwrap=True) if dims.heads and dims.head_dim else None
    if split is None:
        return None
    reading, others = split
    h, d, n, k = dims.hidden, dims.head_dim, dims.heads, dims.kv_heads or dims.heads
    outputs = [name for name, m in others.items() if m.in_features == n * d and m.out_features == h]
    if len(outputs) != 1:
        return None
    packed = packed_qkv(reading, dims)
    if packed is not None:
        return packed  # plangen.plans.families.packed reads how its forward splits it
    # A layer that reuses an earlier layer's keys and values (Gemma 3n's and Gemma 4's KV-shared
    # layers, transformers' is_kv_shared_layer) has only its query projection: sharded by heads, it
    # reads this rank's KV heads as the storing layer's sharded k/v computed them.
    kv_shared = getattr(block, "is_kv_shared_layer", False) is True
    # Heads of q, k or v, or an output gate (query and gate per head, one value per head).
    widths = (n * d, k * d, 2 * n * d, n)
    if len(reading) < (1 if kv_shared else 3) or any(
        m.in_features != h or m.out_features not in widths for m in reading.values()
    ):
        return None
    gates = read_output_gates(block, reading, dims)
    if gates is None:
        return None
    own = own_parameters(block)
    # One value per feature of a head, read only inside sums, beside halves of the heads: DiffLlama.
    paired = (
        bool(own)
        and n % 2 == 0
        and k % 2 == 0
        and all(shape == (d,) for shape in own.values())
        and (read_paired_heads(type(block), frozenset(own)))
    )
    # One value per query head (sinks) splits with the heads; where heads == head_dim the shape
    # cannot tell it from one value per feature of a head (DiffLlama's lambdas).
    if own and not paired and (n == d or any(shape != (n,) for shape in own.values())):
        names = ", ".join(f"{p} {s}" for p, s in own.items())
        return KeptBlock("attention", f"own parameters ({names}) cannot follow the split by heads")
    per_head, whole = attention_norms(block, {*reading, *outputs}, dims)
    # A norm over all heads' output, read straight by the row-parallel projection (BitNet's attn_sub_norm).
    sub = read_fed_by(type(block), outputs[0]) if n * d == others[outputs[0]].in_features else None
    for norm in whole:
        # Sharded with its projection only when it is applied straight to that projection's output.
        projection = read_applied_to(type(block)).get(norm)
        if norm != sub and not (
            projection in reading and is_per_feature(getattr(block, norm), reading[projection].out_features)
        ):
            return KeptBlock(
                "attention",
                f"norm {norm} spans the whole projection output (all heads) but is not applied straight to a "
                "column-parallel projection's output, so it cannot be sharded with its heads",
            )
    # Doge's dt_proj: all KV heads' values to one value per KV head, row-parallel to this rank's heads.
    head_gates = tuple(
        name
        for name, m in block.named_children()
        if is_linear(m)
        and name not in {*reading, *outputs}
        and (m.in_features, m.out_features) == (k * d, k)
        and read_fed_from(type(block), name, frozenset(reading))
    )
    unknown = unexpected_children(block, {*reading, *outputs, *per_head, *whole, *head_gates})
    if unknown:
        return KeptBlock("attention", f"unrecognised submodule {unknown[0]} would see only this rank's heads")
    shapes = read_shape_sizes(type(block))
    # A norm over the whole k projection is sharded with its heads, so KV heads cannot be replicated.
    # Wrapped projections: the KV replication styles find k/v among the block's own nn.Linear children only.
    wrapped = any("." in name for name in (*reading, *outputs))
    kv = (
        tuple(name for name, m in reading.items() if m.out_features == k * d and name not in gates.names)
        if k < n and not set(whole) - {sub} and not wrapped
        else ()
    )
    # TrOCR: handed this rank's slice of its input, the width it unpacks is its heads' width.
    input_sharded = shapes is not None and shapes.input_width
    if input_sharded and (kv or not read_input_only_sized_and_projected(type(block), frozenset(reading))):
        return KeptBlock(
            "attention",
            "its forward shapes the heads' output by the input's own width (unpacked from the input's size), "
            "which is all heads' width, and reads its input otherwise too: a rank holding some heads cannot follow it",
        )
    heads = head_count_attributes(block, shapes, dims) if shapes is not None else ()
    if heads and own:
        return KeptBlock(
            "attention",
            f"its own per-head parameters ({', '.join(own)}) and its head-count attributes ({', '.join(heads)})"
            " are made this rank's by two different styles, and a block takes one",
        )
    if paired:  # no KV replication: a replicated KV head would be half a pair
        return ShardedBlock(
            "attention",
            tuple(reading),
            outputs[0],
            tuple(per_head),
            (),
            tuple(whole),
            fused=tuple((name, (1, 1)) for name in reading),
            shared_parameters=tuple(own),
        )
    return ShardedBlock(
        "attention",
        tuple(reading),
        outputs[0],
        tuple(per_head),
        kv,
        tuple(whole),
        gates.fused,
        head_attributes=heads,
        head_parameters=tuple(own),
        reads_shared_kv=kv_shared,
        input_sharded=input_sharded,
        head_gates=head_gates,
    )


def head_count_attributes(block: nn.Module, shapes: ShapeSizes, dims: ModelDims) -> tuple[str, ...]:
    """The integer attributes the forward shapes by that count all heads, or all heads' width.

    Without making them local, ``view(bsz, -1, self.num_heads, self.head_dim)`` of one rank's heads
    folds the missing heads into the sequence dimension: no error, wrong numbers (OPT, XGLM). A
    value equal to the head width is a head width where it is ever the last size.
    """
    n, d, k = dims.heads, dims.head_dim, dims.kv_heads or dims.heads
    found = []
    for name in sorted(shapes.attributes):
        value = getattr(block, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or n is None or d is None:
            continue
        if value == d and name in shapes.last:
            continue  # a per-head width (also what k x d is at one KV head)
        # KV head counts too: divided with the heads (a TP size above them is refused when applied).
        if value in (n * d, k * d, n, k):
            found.append(name)
    return tuple(found)


def recognize_mlp(block: nn.Module, dims: ModelDims) -> ShardedBlock | KeptBlock | None:
    """A dense MLP (up [and gate] → elementwise → down): shard the intermediate width, or say why not."""
    split = split_by_reading(block, sequential_readers(block))
    if split is None:
        return None
    reading, others = split
    h = dims.hidden
    downs = {name: m for name, m in others.items() if m.out_features == h}
    if len(downs) != 1 or not reading or any(m.in_features != h for m in reading.values()):
        return None
    ((down, down_m),) = downs.items()
    width = down_m.in_features
    packed = [name for name, m in reading.items() if m.out_features == 2 * width]
    # A packed [gate; up] (chunked in two by the forward, which the sweep's numerical check proves per class).
    fused = ((packed[0], (1, 1)),) if packed and len(reading) == 1 else ()
    if (not fused and any(m.out_features != width for m in reading.values())) or len(others) != 1:
        return None
    if own := own_parameters(block):  # one value's gradient is summed over TP on a slice, not on the output
        where = (
            "the reader does not follow whether they scale the intermediate's slice or the reduced output"
            if all(s in ((), (1,)) for s in own.values())
            else "they see only a slice of the intermediate width"
        )
        return KeptBlock("mlp", f"own parameters ({', '.join(own)}): {where}")
    # BitNet's ffn_sub_norm, read straight by down: sharded with the slice, its statistics summed over TP.
    norms = tuple(
        n for n, c in block.named_children() if n == read_fed_by(type(block), down) and is_per_feature(c, width)
    )
    for name, child in block.named_children():
        if name not in (*reading, down, *norms) and is_per_feature(child, width):
            return KeptBlock(
                "mlp", f"norm {name} spans the whole intermediate activation: each rank holds only a slice of it"
            )
    # An activation whose parameters are single values (Apertus' xIELU alpha_p, alpha_n): the same on
    # every slice of the intermediate, so it runs on this rank's slice, its gradient summed over TP.
    scalars = tuple(
        name
        for name, child in block.named_children()
        if name not in reading
        and name != down
        and has_parameters(child)
        and all(p.numel() == 1 for p in child.parameters())
    )
    unknown = unexpected_children(block, set(reading) | {down, *scalars, *norms})
    if unknown:
        return KeptBlock("mlp", f"unrecognised submodule {unknown[0]} would see only a slice of the intermediate width")
    return ShardedBlock(
        "mlp",
        tuple(reading),
        down,
        projection_norms=norms,
        fused=fused,
        scalar_children=scalars,
        gate_statistics=callable(getattr(type(block), "_gaussian_topk", None)),
    )


def recognize_layer_mlp(layer: nn.Module, dims: ModelDims) -> tuple[tuple[str, str], ...]:
    """Dense MLPs whose two linears sit in the decoder layer itself (BART's, OPT's ``fc1``/``fc2``).

    ``(up, down)`` pairs: ``down`` maps the intermediate back to the hidden size and reads ``up``'s
    output through parameter-free calls only (the activation, dropout), as the layer's forward
    source says; ``up`` reads the hidden size, and no other child reads its output.
    """
    chains = read_argument_chains(type(layer))
    linears = child_linears(layer)

    def producer(name: str) -> str | None:
        # The first child with parameters (or the lost track) that the argument came through.
        for step in chains.get(name, ("?",)):
            child = getattr(layer, step, None) if step != "?" else None
            if child is None or has_parameters(child):
                return step if child is not None else None
        return None

    pairs = []
    for down, down_m in linears.items():
        up = producer(down)
        up_m = linears.get(up) if up is not None else None
        if up_m is None or down_m.out_features != dims.hidden or up_m.in_features != dims.hidden:
            continue
        if up_m.out_features != down_m.in_features:
            continue
        readers = [
            o for o in chains if o != down and has_parameters(getattr(layer, o, nn.Module())) and producer(o) == up
        ]
        if readers:
            continue  # another block reads the intermediate too: it would see only a slice
        pairs.append((up, down))
    return tuple(pairs)


def _is_mixture_of_experts(block: nn.Module, dims: ModelDims) -> bool:
    if not dims.experts:
        return False
    for _, param in block.named_parameters():
        # A router's [experts, hidden] or packed experts' [experts, ...]; not any matrix of that many rows.
        if param.shape[:1] == (dims.experts,) and (param.dim() >= 3 or param.shape == (dims.experts, dims.hidden)):
            return True
    return any(isinstance(m, nn.ModuleList) and len(m) == dims.experts for m in block.modules())


@dataclass(frozen=True)
class MoeBlock(FamilyBlock):
    """A mixture-of-experts block: the packed experts split over TP on the expert dimension, the
    routers replicated, shared-expert MLPs column/row-parallel, and replicated gates that scale a
    shared expert's output; every branch leaves a partial sum, reduced once by the block."""

    experts: str
    # Shared-expert MLPs and how the block calls each (None: unknown, then each projection takes
    # its own input and reduces its own input gradient).
    shared: tuple[tuple[str, ShardedBlock, BlockCall | None], ...]
    routers: tuple[str, ...]
    gates: tuple[str, ...]
    kind: str = "moe"
    # A norm the block applies to the summed branches and returns (A.X-K1's post_mlp_layernorm):
    # the partial sums are reduced into it rather than at the block's output.
    output_norm: str | None = None
    # Shared experts packed as 3-D weights (Inkling's): each expert's intermediate split, partial sum out.
    packed_shared: tuple[str, ...] = ()

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return moe_block_entries(part, sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        if call is None or call.outputs is None:
            # The block reduces its branches' partial sums itself: it must be wrapped where the layer calls it.
            return Unplaced(f"mixture of experts {UNREAD_CALL}", "mlp")
        return None

    def kept_beside(self, path: str) -> list[Replicated]:
        why = "the router sees every token on every rank: routing stays exact"
        return [Replicated(f"{path}.{router}", why, "mlp") for router in self.routers]


@dataclass(frozen=True)
class LayerExpertsBlock(FamilyBlock):
    """Packed experts that the decoder layer calls itself, their router a sibling in the layer and no
    MoE block around them (Gemma 4's 26B-A4B: ``self.experts(x, top_k_index, top_k_weights)`` beside
    a dense MLP, then a norm on their output): split over TP by ``ExpertsParallel``, which sums their
    partial output itself (one all-reduce of B·S·H, before the layer's norm) and their input and
    routing weights' gradients; the routers stay whole."""

    routers: tuple[str, ...]
    kind: str = "moe"
    input_norm: str | None = None  # the norm the layer applies before them (under SP it takes the whole sequence)

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        return layer_experts_entries(part.path, self.routers, self.input_norm, sp)


def recognize_layer_experts(layer: nn.Module, name: str, dims: ModelDims) -> LayerExpertsBlock | KeptBlock | None:
    """The layer's child ``name`` as packed experts the layer routes to itself, or None when it is none."""
    from plangen.styles.experts import expert_count

    experts = getattr(layer, name)
    count = expert_count(experts)
    if not count:
        return None
    if not experts_split_over_ranks(experts) or not takes_routing(experts):
        return KeptBlock(
            "moe",
            f"experts {type(experts).__name__} do not take (hidden, top-k ids, top-k weights) with transformers' "
            "expert-parallel routing, so their experts cannot be split over ranks",
        )
    widths = {dims.hidden, *(p.shape[-1] for p in experts.parameters(recurse=False) if p.dim() == 3)}
    routers = tuple(
        child_name
        for child_name, child in layer.named_children()
        if child_name != name
        and any(p.dim() == 2 and p.shape[0] == count and p.shape[1] in widths for p in child.parameters())
    )
    if not routers:
        return KeptBlock("moe", "no router (an [experts, hidden] weight) found beside the experts in the layer")
    return LayerExpertsBlock(routers)


def recognize_moe(block: nn.Module, dims: ModelDims) -> MoeBlock | KeptBlock | None:
    """A block holding one packed experts module (transformers 5.x), or None when it holds none."""
    from plangen.styles.experts import expert_count

    packed = [(n, c) for n, c in block.named_children() if expert_count(c)]
    if not packed:
        return None
    if len(packed) > 1:
        return KeptBlock("moe", f"several experts modules ({', '.join(n for n, _ in packed)}) in one block")
    name, experts = packed[0]
    if not experts_split_over_ranks(experts) or not takes_routing(experts):
        return KeptBlock(
            "moe",
            f"experts {type(experts).__name__} do not take (hidden, top-k ids, top-k weights) with transformers' "
            "expert-parallel routing, so their experts cannot be split over ranks",
        )
    # One expert, or any count the TP size does not divide, is split on each expert's intermediate
    # dimension instead (ExpertsParallel chooses when applied: plangen.styles.experts.choose_expert_layout).
    count = expert_count(experts)
    # One value per expert (a routing bias, AFMoE's expert_bias) is the router's: it stays whole.
    others = [n for n, shape in own_parameters(block).items() if shape != (count,)]
    if others:
        return KeptBlock("moe", f"own parameters ({', '.join(others)}) beside the experts")
    # What a router may read: the hidden size, or the experts' own input width where the config differs.
    widths = {dims.hidden, *(p.shape[-1] for p in experts.parameters(recurse=False) if p.dim() == 3)}
    shared: list[tuple[str, ShardedBlock, BlockCall | None]] = []
    routers: list[str] = []
    gates: list[str] = []
    output_norm: str | None = None
    packed_shared = packed_shared_children(block, dims.hidden)
    rows = router_rows(block, count, packed_shared)
    for child_name, child in block.named_children():
        if child_name in (name, *packed_shared) or not has_parameters(child):
            continue
        # An MLP back to the hidden size is a shared expert, even one as wide as the expert count (Qwen3-Next's).
        if isinstance(mlp := recognize_mlp(child, dims), ShardedBlock):
            shared.append((child_name, mlp, read_block_call(type(block), child_name, type(child))))
            continue
        # A router scores every expert for every token: it stays whole on every rank.
        if is_router(child, rows, widths):
            routers.append(child_name)
            continue
        if is_linear(child) and child.in_features == dims.hidden and child.out_features == 1:
            gates.append(child_name)  # one value per token, scaling a shared expert's output
            continue
        if is_per_feature(child, dims.hidden) and read_returned_child(type(block)) == child_name:
            output_norm = child_name
            continue
        why = mlp.why if isinstance(mlp, KeptBlock) else f"unrecognised submodule {describe(child_name, child)}"
        return KeptBlock("moe", f"beside the experts: {why}")
    if not routers:
        return KeptBlock("moe", "no router (an [experts, hidden] weight) found beside the experts")
    return MoeBlock(
        name, tuple(shared), tuple(routers), tuple(gates), output_norm=output_norm, packed_shared=packed_shared
    )


_STATE_SPACE_PARAMETERS = {"A_log", "D", "dt_bias"}


def _is_recurrent_mixer(block: nn.Module) -> bool:
    if any(isinstance(m, nn.Conv1d) for m in block.modules()):
        return True
    return any(name.split(".")[-1] in _STATE_SPACE_PARAMETERS for name, _ in block.named_parameters())


def keep_mixture_of_experts(block: nn.Module, dims: ModelDims) -> KeptBlock | None:
    """Experts no MoE family took: the router and experts would need expert parallelism."""
    if not _is_mixture_of_experts(block, dims):
        return None
    return KeptBlock(
        "moe",
        "mixture of experts: the router and experts need expert parallelism, which torch's module "
        "styles cannot express",
    )


def keep_short_convolution(block: nn.Module, dims: ModelDims) -> KeptBlock | None:
    """A short convolution over every feature of the hidden state: no heads to split."""
    conv = short_conv_only(block)
    if conv is None or conv.in_channels != dims.hidden:
        return None
    return KeptBlock(
        "other",
        "short convolution along the sequence, per feature of the whole hidden state: nothing to split over TP",
    )


def keep_recurrent_mixer(block: nn.Module, dims: ModelDims) -> KeptBlock | None:
    """A state-space or linear-attention mixer no mixer family took."""
    if not _is_recurrent_mixer(block):
        return None
    return KeptBlock(
        "mixer",
        "state-space / linear-attention mixer: its fused input projection and recurrent state do not "
        "split over heads with torch's styles",
    )


def unrecognized(name: str, block: nn.Module, dims: ModelDims) -> KeptBlock:
    """Why a block no family took stays whole: a stray linear, heads mixed by an einsum, or what it holds."""
    if is_linear(block):
        return KeptBlock("other", f"linear {describe(name, block)} outside any recognised block")
    if (einsum := einsum_heads_reason(block, dims)) is not None:
        return KeptBlock("attention", einsum)
    parts = [
        f"{n} {m.in_features}->{m.out_features}" if is_linear(m) else f"{n} {type(m).__name__}"
        for n, m in block.named_children()
        if has_parameters(m)
    ]
    linear_only = all(is_linear(m) for m in block.children() if has_parameters(m))
    note = "" if linear_only else "; torch's styles shard nn.Linear"
    return KeptBlock("other", f"not recognised as attention or MLP ({type(block).__name__}: {', '.join(parts)}{note})")


# ---------------------------------------------------------------------------------------------
# Plan entries


def colwise_entry(pattern: str, block: ShardedBlock, name: str, input_layout: Any, group: str, why: str) -> PlanEntry:
    """Column-parallel; a packed projection re-laid out so each rank holds its slice of every part."""
    parts = dict(block.fused).get(name)
    if parts is not None and block.shared_parts:
        return PlanEntry(
            pattern,
            "MultiQueryColwiseParallel",
            dict(part_sizes=parts, shared_parts=block.shared_parts, input_layouts=input_layout),
            group,
            f"{why}; multi-query: this rank's query heads, the one key/value head gathered whole "
            "(its gradient summed over TP)",
        )
    if parts is None:
        return PlanEntry(
            pattern,
            "ColwiseParallel",
            dict(input_layouts=input_layout, output_layouts=Shard(-1), use_local_output=True),
            group,
            why,
        )
    if block.shared_parameters:  # differential attention: its heads' two halves, not packed parts
        why = f"{why}; the heads' two halves (pairs i, i + H/2) re-laid out so each rank holds whole pairs"
    else:
        why = f"{why}; packed parts {parts} re-laid out so each rank holds its slice of every part"
    return PlanEntry(
        pattern,
        "FusedColwiseParallel",
        dict(part_sizes=parts, input_layouts=input_layout, use_local_output=True),
        group,
        why,
    )


def sharded_block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """Attention or an MLP sharded by heads or by its intermediate: entered through its own input
    where the layer's call was read (one Replicate DTensor, its gradient reduced once), column-parallel
    projections, the output projection row-parallel."""
    block, group = part.block, part.block.kind
    entries: list[PlanEntry] = []
    call = part.call
    # Grouped-query attention entered through its own input: KV heads replicated where the TP size
    # exceeds them (plangen.styles.kv_heads; the styles read the head counts when applied).
    kv = block.kv_projections if call is not None else ()
    heads = block.head_attributes
    if call is not None:
        gathered = "one all-gather of the sequence per block" if sp else "no communication"
        prepared = dict(**hidden_state_layouts(call, sp), use_local_output=False)
        style = (
            "PrepareAttentionInput"
            if kv
            or heads
            or block.reads_shared_kv
            or block.shared_tables
            or block.padded_heads
            or part.batch_head_inputs
            else "PrepareModuleInput"
        )
        why = f"{gathered}; one gradient reduction per block in backward"
        if block.gate_statistics:
            style, why = (
                "ActivationSparsityParallel",
                f"{why}; its gate's top-k statistics summed over TP (2 x B·S values)",
            )
        if block.input_sharded:  # its forward reshapes by the input's own width: hand it this rank's
            prepared = dict(**hidden_state_layouts(call, sp, desired=Shard(-1)), use_local_output=True)
            why = (
                ("an all-to-all to " if sp else "")
                + "this rank's slice of the hidden dimension, the width its forward "
                "unpacks; each column-parallel projection all-gathers it (a reduce-scatter back in backward)"
            )
        if heads:
            prepared["head_attributes"] = heads
            why += f"; its forward shapes by {', '.join(heads)}: made this rank's"
        if part.batch_head_inputs:
            prepared["batch_head_inputs"] = part.batch_head_inputs
            why += batch_head_rows_why(part.batch_head_inputs)
        if block.padded_heads:
            prepared["padded_heads"] = True
            why += "; its query heads, a count no even TP size divides, padded with zero heads to a multiple of the TP size"
        if block.shared_tables:
            prepared["shared_tables"] = block.shared_tables
            why += f"; its {', '.join(block.shared_tables)} (no heads axis) replicated, their gradient summed over TP"
        if block.head_parameters:  # as gpt-oss's hand-written plan: the block's own style splits them
            style, why = (
                "AttentionSinksParallel",
                f"{why}; its per-head {', '.join(block.head_parameters)} split with the heads",
            )
        if block.shared_parameters:
            style, why = (
                "PairedHeadsAttentionInput",
                (
                    f"{why}; heads paired i, i + H/2 (whole pairs per rank); its {', '.join(block.shared_parameters)}, "
                    "shared by every head, replicated with their gradient summed over TP"
                ),
            )
        entries.append(PlanEntry(part.path, style, prepared, group, why))
        colwise_input = Shard(-1) if block.input_sharded else Replicate()
        colwise_why = "column-parallel: each rank computes its own " + ("heads" if group == "attention" else "slice")
    else:
        if heads:
            entries.append(
                PlanEntry(
                    part.path,
                    "LocalHeadCounts",
                    dict(attributes=heads),
                    group,
                    f"its forward shapes by {', '.join(heads)}: made this rank's",
                )
            )
        colwise_input = SEQ if sp else Replicate()
        colwise_why = (
            "column-parallel, taking its own input: one gradient reduction, as its only input projection"
            if len(block.colwise) == 1
            else "column-parallel, taking its own input (the layer's call of the block could not be read)"
        )
    for name in block.colwise:
        if name in kv:
            why = "column-parallel over KV heads; replicated where TP exceeds them"
            colwise = dict(input_layouts=colwise_input, output_layouts=Shard(-1), use_local_output=True)
            entries.append(PlanEntry(f"{part.path}.{name}", "KVHeadsColwiseParallel", colwise, group, why))
        else:
            entries.append(colwise_entry(f"{part.path}.{name}", block, name, colwise_input, group, colwise_why))
    for name in block.head_gates:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "RowwiseParallel",
                dict(input_layouts=Shard(-1), output_layouts=Shard(-1), use_local_output=True),
                group,
                "reads every KV head's values, one output per KV head: row-parallel on this rank's heads, "
                "the partial sums reduce-scattered to this rank's heads' outputs",
            )
        )
    for name in block.per_head_norms:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ReplicatedWithGradAllReduce",
                dict(sequence_dim=2, use_local_output=True),
                group,
                "per-head norm sees only local heads: its weight gradient is summed over TP",
            )
        )
    for name in block.scalar_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "AllReduceParamGrads",
                {},
                group,
                "single-valued parameters applied to this rank's slice only: their gradient is summed over TP",
            )
        )
    for name in block.conv_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ConvChannelsParallel",
                {},
                group,
                "short conv over a projection's heads: its channels split with them, no communication",
            )
        )
    for name in block.shared_children:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "AllReduceParamGrads",
                {},
                group,
                "read by every local head: replicated, its gradient summed over TP",
            )
        )
    for name in block.projection_norms:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "ShardedNormParallel",
                {},
                group,
                "norm over the whole projection, sharded with its heads: one all-reduce of B·S values each way",
            )
        )
    rowwise, reduced = row_parallel_output(sp)
    style, why = "RowwiseParallel", f"row-parallel: {reduced}"
    if part.modified_in_place and not sp:  # under SP the output stays a DTensor: no view is handed out
        style, why = "RowwiseParallelOwnOutput", f"{why}; its output is a copy, which the layer modifies in place"
    entries.append(PlanEntry(f"{part.path}.{block.rowwise}", style, rowwise, group, why))
    return entries


def moe_block_entries(part: BlockPart, sp: bool) -> list[PlanEntry]:
    """The experts split on the expert dim; shared experts column/row-parallel; every branch a partial
    sum that the block reduces once (all-reduce, or reduce-scatter under SP), as in plans/moe.py."""
    block, call = part.block, part.call
    assert isinstance(block, MoeBlock) and call is not None
    others = (call.outputs or 1) - 1  # e.g. router scores the layer unpacks and drops: passed through
    reduced = "one all-gather of the sequence in, one reduce-scatter out" if sp else "one all-reduce"
    if block.output_norm is not None:
        reduced = ("one all-gather of the sequence in; " if sp else "") + f"the sum reduced into {block.output_norm}"
    # The block reduces its branches' input gradients once (MoeBlockParallel, as plans/moe.py): each
    # branch leaves its own partial, the router's and gates' count once. It needs the block's input
    # positional (its hook reads args[0]), every shared MLP's call read (so PartialGradInput can take
    # its input) and one router; a norm on the summed branches keeps the per-branch reductions.
    once = (
        len(block.routers) == 1
        and call.keyword is None
        and block.output_norm is None
        and all(shared_call is not None for _, _, shared_call in block.shared)
    )
    entries = [
        PlanEntry(
            part.path,
            "MoeBlockParallel" if once else "PrepareModuleInputOutput",
            dict(
                **(dict(router=block.routers[0], gates=tuple(sorted(block.gates))) if once else {}),
                **hidden_state_layouts(call, sp),
                use_local_input=True,
                # Reduced already where a norm on the summed branches is what the block returns.
                output_layouts=(Partial() if block.output_norm is None else Replicate(), *(None,) * others),
                desired_output_layouts=(SEQ if sp else Replicate(), *(Replicate(),) * others),
                use_local_output=not sp,
            ),
            "mlp",
            f"mixture of experts: {reduced} of the summed partial outputs of its branches",
        ),
        PlanEntry(
            f"{part.path}.{block.experts}",
            "ExpertsParallel",
            dict(output_layouts=Partial(), **(dict(sum_input_grad=False) if once else {})),
            "mlp",
            EXPERTS_PARALLEL_WHY + (f"; {INPUT_GRAD_LEFT_WHY}" if once else ""),
        ),
    ]
    for name, mlp, shared_call in block.shared:
        if shared_call is not None:
            entries.append(
                PlanEntry(
                    f"{part.path}.{name}",
                    "PartialGradInput" if once else "PrepareModuleInput",
                    dict(**hidden_state_layouts(shared_call, False), use_local_output=False),
                    "mlp",
                    "shared experts: one Replicate DTensor input, so gate and up "
                    + (
                        f"add their partial input gradients on it; {INPUT_GRAD_LEFT_WHY}"
                        if once
                        else "reduce their input gradient once"
                    ),
                )
            )
        for proj in mlp.colwise:
            entries.append(
                colwise_entry(
                    f"{part.path}.{name}.{proj}", mlp, proj, Replicate(), "mlp", "shared experts: column-parallel"
                )
            )
        entries.append(
            PlanEntry(
                f"{part.path}.{name}.{mlp.rowwise}",
                "RowwiseParallel",
                dict(input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=True),
                "mlp",
                "shared experts: row-parallel, partial sum out (reduced by the block)",
            )
        )
    if block.output_norm is not None:
        entries.append(
            PlanEntry(
                f"{part.path}.{block.output_norm}",
                "PrepareModuleInput",
                dict(
                    input_layouts=(Partial(),),
                    desired_input_layouts=(Replicate(),),
                    input_kwarg_layouts=None,
                    desired_input_kwarg_layouts=None,
                    use_local_output=True,
                ),
                "mlp",
                "norm on the summed branches: their partial sums are all-reduced into it (one all-reduce of B·S·H)",
            )
        )
    for name in block.packed_shared:
        entries.append(
            PlanEntry(
                f"{part.path}.{name}",
                "SharedExpertsParallel",
                dict(output_layouts=Partial(), **(dict(sum_input_grad=False) if once else {})),
                "mlp",
                "shared experts of 3-D weights: a slice of each one's intermediate per rank, partial sum out (reduced "
                "by the block); "
                + (
                    "their per-token scales' gradient summed over TP, their input's left to the block's one reduction"
                    if once
                    else "their input's and per-token scales' gradients summed over TP"
                ),
            )
        )
    for gate in block.gates:
        entries.append(
            PlanEntry(
                f"{part.path}.{gate}",
                "AllReduceOutputGrad",
                {},
                "mlp",
                "replicated gate scaling the shared experts' partial output: its output gradient is summed over TP",
            )
        )
    return entries

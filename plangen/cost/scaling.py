"""From collectives measured on shrunk models to the collectives of the real model.

Every TP collective moves a tensor whose size is a product of the model's dimensions, e.g. the
hidden state ``B·S·H`` (micro-batch x sequence x hidden), the logits ``B·S·V``, a per-head norm's
gradient ``D``. The exponent of each dimension is read off by measuring twice: once at base sizes,
once with some dimensions multiplied by distinct primes (``B x2, S x3, V x5``). A collective
of ``B·S·H`` bytes grows by ``2 x 3 = 6``; the prime factors of its growth name its dimensions.
Then, for a collective of ``b`` bytes at the shrunk sizes ``d``,

    bytes at the real sizes  =  b x prod over dimensions k of (real_k / d_k) ** e_k

Layers are found the same way: a third run with twice the layers adds one layer's collectives per
layer added; what does not grow is fixed (embedding, head, loss). The real step has

    count  =  fixed + per_layer x real_layers

Whatever cannot be explained this way (a growth with another prime factor, two collectives of
equal size that scale differently) is refused with a :class:`CostError`, never guessed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Iterable, Mapping, Sequence

from plangen.cost.data import CollectiveCost
from plangen.cost.settings import CostError

# Dimension names and the letter each shows as in a tensor formula.
LETTERS = {
    "batch": "B",
    "seq": "S",
    # The tokens the layers see where the model prepends P prompt tokens of its own (CpmAnt's 32): the
    # residual stream's collectives are B·(S+P)·H, a sum no product of S and P can be; probed as one
    # dimension of its own (plangen.cost.probe_configs.config_with_tokens), apart from the logits' S.
    "tokens": "(S+P)",
    "hidden": "H",
    "heads": "N",
    "head_dim": "D",
    "intermediate": "I",
    "vocab": "V",
    "q_latent": "Lq",
    "kv_latent": "Lkv",  # latent attention's low ranks (DeepSeek's q_lora_rank, kv_lora_rank)
    "experts": "E",  # routed experts (Llama-4's scores' gradient, B·S·E)
    "topk": "k",  # experts per token (the routing weights' gradient, B·S·k)
    # The decoder layers, where a collective's size grows with them (not probed: read off the run with
    # more layers, layer_exponents): Gemma 4's per-layer input table, B·S·L·Hp, looked up once per step.
    "layers": "L",
    "layer_inputs": "Hp",  # Gemma 4's per-layer input width (hidden_size_per_layer_input)
}
# One run per group: its dimensions are multiplied by distinct primes so that one ratio gives every
# exponent. Groups keep the probed models small: hidden and head size together would grow q_proj 6x,
# and the intermediate width is probed apart from the tokens: batched_mm experts gather one weight
# matrix per routed token (tokens x k x H x I), so tokens x6 with I x7 took gpt-oss's shrunk model at
# TP 8 to 15 GiB (the sweep of docs/cost.md was killed for memory). Top-k goes with the expert count,
# so that the probed model still has as many experts as a token is routed to (measure_tp_collectives).
PROBE_GROUPS: tuple[Mapping[str, int], ...] = (
    {"batch": 2, "seq": 3, "vocab": 5, "tokens": 7},
    {"hidden": 2, "head_dim": 3, "experts": 5, "topk": 7, "layer_inputs": 11},
    {"heads": 2, "q_latent": 3, "kv_latent": 5, "intermediate": 7},
)
MAX_EXPONENT = 3

# Collective names (functional and c10d) -> the kind shown.
KINDS = {
    "all_reduce": "all-reduce",
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "all_gather_into_tensor_coalesced": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "all_to_all_single": "all-to-all",
    "alltoall_base_": "all-to-all",
    "alltoall_": "all-to-all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}


@dataclass(frozen=True)
class Sample:
    """One collective as measured: the phase, the op's name, the bytes of its result."""

    phase: str
    op: str
    nbytes: int
    layer: int | None = None  # the decoder layer it ran in, where known (None: outside them)

    @property
    def key(self) -> tuple[str, str, int]:
        """What tells collectives apart when they are counted: phase, op and size."""
        return (self.phase, self.op, self.nbytes)


@dataclass(frozen=True)
class Probe:
    """The samples of a run whose dimensions in ``factors`` were multiplied by those primes."""

    factors: Mapping[str, int]
    samples: Sequence[Sample]


@dataclass(frozen=True)
class Term:
    """Collectives of one op and size at the shrunk base sizes, how they scale, how many."""

    phase: str
    op: str
    nbytes: int
    exponents: tuple[tuple[str, int], ...]
    fixed: int  # once per step
    per_layer: Fraction  # per decoder layer, on average over the shrunk model's layers
    # Per decoder layer of each kind (measure.layer_kind), where the collectives' layers add up to
    # the per-layer part; empty where they do not (then the shrunk model's mix is assumed).
    per_kind: tuple[tuple[str, Fraction], ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.phase, self.op, self.nbytes)


def kind_of(op: str) -> str:
    return KINDS.get(op, op)


def payload_and_sent(kind: str, result_bytes: float, group_size: int) -> tuple[float, float]:
    """The full tensor of one collective and the bytes one rank sends for it (ring algorithms).

    A reduce-scatter's result is one shard of the tensor it reduces. Ring all-reduce sends
    2(n-1)/n of the tensor per rank; all-gather, reduce-scatter and all-to-all (n-1)/n.
    """
    n = group_size
    if kind == "reduce-scatter":
        payload = result_bytes * n
    else:
        payload = result_bytes
    if kind == "all-reduce":
        return payload, payload * 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return payload, payload * (n - 1) / n
    return payload, payload


def exponents_from_growth(growth: Fraction, factors: Mapping[str, int]) -> dict[str, int] | None:
    """``{dimension: exponent}`` with ``prod(factor ** exponent) == growth``, or None if there is none."""
    exponents: dict[str, int] = {}
    rest = growth
    for name, prime in factors.items():
        e = 0
        while rest.numerator % prime == 0 and e <= MAX_EXPONENT:
            rest /= prime
            e += 1
        if e:
            exponents[name] = e
    return exponents if rest == 1 and all(e <= MAX_EXPONENT for e in exponents.values()) else None


def _same_sequence(base: Sequence[Sample], other: Sequence[Sample], what: str) -> None:
    if [(s.phase, s.op) for s in base] != [(s.phase, s.op) for s in other]:
        raise CostError(
            f"the plan issues different collectives when {what} changes: its cost cannot be scaled from a shrunk model"
        )


def derive_terms(
    base: Sequence[Sample],
    probes: Iterable[Probe],
    doubled: Sequence[Sample],
    base_layers: int,
    doubled_layers: int,
    kinds: Sequence[str] = (),
    extra: Mapping[str, Sequence[Sample]] | None = None,
) -> list[Term]:
    """Exponents, fixed and per-layer counts of every collective, from the measured runs; with the
    base run's layer ``kinds``, per-layer counts of each kind too: from ``extra`` (runs with one more
    layer of each kind, :func:`count_by_kind`), else from the layers they ran in (:func:`split_by_kind`)."""
    exponents: list[dict[str, int]] = [{} for _ in base]
    for probe in probes:
        _same_sequence(base, probe.samples, "the model's sizes")
        for i, (b, p) in enumerate(zip(base, probe.samples)):
            if b.nbytes == 0 or p.nbytes == 0:
                if b.nbytes != p.nbytes:
                    raise CostError(f"a {kind_of(b.op)} of {b.nbytes} bytes grew to {p.nbytes} bytes: cannot scale it")
                continue
            found = exponents_from_growth(Fraction(p.nbytes, b.nbytes), probe.factors)
            if found is None:
                raise CostError(
                    f"a {kind_of(b.op)} of {b.nbytes} bytes grew to {p.nbytes} bytes when "
                    f"{', '.join(f'{LETTERS[k]} x{v}' for k, v in probe.factors.items())}: "
                    "its size is not a product of the model's dimensions"
                )
            exponents[i].update(found)

    added_layers = doubled_layers - base_layers
    if added_layers <= 0:
        raise CostError("the model with more layers has no more layers: cannot separate per-layer collectives")
    depth = layer_exponents(base, doubled, Fraction(doubled_layers, base_layers))
    doubled = at_base_depth(doubled, depth, Fraction(doubled_layers, base_layers))
    extra = {
        kind: at_base_depth(run, depth, Fraction(base_layers + 1, base_layers)) for kind, run in (extra or {}).items()
    }
    for sample, found in zip(base, exponents):
        if sample.key in depth:
            found["layers"] = depth[sample.key]

    by_key: dict[tuple[str, str, int], tuple[tuple[str, int], ...]] = {}
    for sample, found in zip(base, exponents):
        key = sample.key
        signature = tuple(sorted(found.items(), key=lambda item: list(LETTERS).index(item[0])))
        if by_key.setdefault(key, signature) != signature:
            raise CostError(
                f"two {kind_of(sample.op)}s of {sample.nbytes} bytes scale differently at the shrunk sizes: "
                "cannot tell them apart"
            )

    counts_base = Counter(s.key for s in base)
    counts_doubled = Counter(s.key for s in doubled)
    if set(counts_doubled) - set(counts_base):
        raise CostError("the plan issues other collectives when the model has more layers: cannot scale its layers")
    terms = []
    for key, n_base in counts_base.items():
        grown = counts_doubled[key] - n_base
        if grown < 0:
            raise CostError("the plan issues fewer collectives when the model has more layers: cannot scale its layers")
        per_layer = Fraction(grown, added_layers)
        fixed = n_base - per_layer * base_layers
        if fixed < 0 or fixed.denominator != 1:
            raise CostError("collectives do not split into a fixed part and a per-layer part: cannot scale its layers")
        terms.append(Term(*key, exponents=by_key[key], fixed=int(fixed), per_layer=per_layer))
    in_layers = {t.key: t.per_layer * base_layers for t in terms}
    by_kind = count_by_kind(base, kinds, extra, in_layers) or split_by_kind(base, kinds, in_layers)
    return [replace(t, per_kind=by_kind.get(t.key, ())) for t in terms]


def layer_exponents(
    base: Sequence[Sample], deeper: Sequence[Sample], ratio: Fraction
) -> dict[tuple[str, str, int], int]:
    """The power of the layer count in the size of each of the base run's collectives whose size grows
    with the layers (by key; the others are left out): where the run with ``ratio`` times the layers
    has it at ``ratio ** e`` times the size only (Gemma 4's per-layer input table, B·S·L·Hp)."""
    base_keys, deeper_keys = {s.key for s in base}, {s.key for s in deeper}
    found = {}
    for phase, op, nbytes in base_keys - deeper_keys:
        for e in range(1, MAX_EXPONENT + 1):
            size = nbytes * ratio**e
            if size.denominator == 1 and (phase, op, int(size)) in deeper_keys - base_keys:
                found[(phase, op, nbytes)] = e
                break
    return found


def at_base_depth(
    samples: Sequence[Sample], exponents: Mapping[tuple[str, str, int], int], ratio: Fraction
) -> list[Sample]:
    """The samples of a run with ``ratio`` times the base run's layers, the collectives that grow with
    the layers (``exponents``, :func:`layer_exponents`) at their size in the base run."""
    if not exponents:
        return list(samples)
    back: dict[tuple[str, str, int], int] = {}
    for (phase, op, nbytes), e in exponents.items():
        size = nbytes * ratio**e
        if size.denominator != 1:
            raise CostError(
                f"a {kind_of(op)} of {nbytes} bytes grows with the layers to no whole size: cannot scale it"
            )
        back[(phase, op, int(size))] = nbytes
    sizes = {(s.phase, s.op, s.nbytes) for s in samples}
    if any((phase, op, nbytes) in sizes for (phase, op, _), nbytes in back.items()):
        raise CostError("a collective that grows with the layers meets another's size: cannot tell them apart")
    return [replace(s, nbytes=back.get(s.key, s.nbytes)) for s in samples]


def count_by_kind(
    base: Sequence[Sample],
    kinds: Sequence[str],
    extra: Mapping[str, Sequence[Sample]],
    in_layers: Mapping[tuple[str, str, int], Fraction],
) -> dict[tuple[str, str, int], tuple[tuple[str, Fraction], ...]]:
    """Each collective's count per layer of each kind: what a run with one more layer of that kind
    adds. Trusted where every kind has its run and the layers' counts add up to the per-layer part
    the deeper run found (``in_layers``); else nothing."""
    layers_of = Counter(kinds)
    if len(layers_of) < 2 or set(extra) != set(layers_of):
        return {}
    counts = Counter(s.key for s in base)
    runs = {kind: Counter(s.key for s in run) for kind, run in extra.items()}
    if any(set(run) - set(counts) for run in runs.values()):
        return {}
    added = {kind: run - counts for kind, run in runs.items()}
    out = {}
    for key, count in in_layers.items():
        if sum(added[kind][key] * n for kind, n in layers_of.items()) != count:
            return {}
        out[key] = tuple(sorted((kind, Fraction(added[kind][key])) for kind in layers_of))
    return out


def split_by_kind(
    base: Sequence[Sample], kinds: Sequence[str], in_layers: Mapping[tuple[str, str, int], Fraction]
) -> dict[tuple[str, str, int], tuple[tuple[str, Fraction], ...]]:
    """Each collective's count per layer of each kind, from the layer each one ran in (where no run
    with one more layer of each kind can be made: kinds set by index lists or periods).

    Trusted per collective only where the layers it was seen in hold exactly its per-layer part
    (``in_layers``): a parameter's gradient reduction can run after its layer's backward has handed
    its input gradient on (ModTracker's end of the layer), outside every layer; those keep the average."""
    if not kinds or len(set(kinds)) == 1:
        return {}
    layers_of = Counter(kinds)
    out: dict[tuple[str, str, int], tuple[tuple[str, Fraction], ...]] = {}
    for key, count in in_layers.items():
        seen = Counter(kinds[s.layer] for s in base if s.key == key and s.layer is not None)
        if sum(seen.values()) == count:
            out[key] = tuple(sorted((kind, Fraction(seen[kind], n)) for kind, n in layers_of.items()))
    return out


def scale_factor(exponents: Iterable[tuple[str, int]], shrunk: Mapping[str, int], real: Mapping[str, int]) -> Fraction:
    factor = Fraction(1)
    for name, e in exponents:
        factor *= Fraction(real[name], shrunk[name]) ** e
    return factor


def tensor_formula(exponents: Iterable[tuple[str, int]]) -> str:
    """``B·S·H``, ``D``, ``H²``; ``fixed size`` for a collective that does not grow with the model."""
    parts = [LETTERS[name] + ("" if e == 1 else "²" if e == 2 else "³") for name, e in exponents]
    return "·".join(parts) or "fixed size"


def scale_terms(
    terms: Iterable[Term],
    shrunk: Mapping[str, int],
    real: Mapping[str, int],
    real_kinds: Mapping[str, int],
    group_size: int,
) -> tuple[list[CollectiveCost], list[str]]:
    """The real step's TP collectives, grouped by phase, kind, tensor and scope; and notes.
    ``real_kinds``: how many decoder layers of each kind (measure.layer_kind) the real model has."""
    totals: dict[tuple[str, str, str, str], list[float]] = {}
    notes: list[str] = []
    real_layers = sum(real_kinds.values())
    for term in terms:
        each = term.nbytes * scale_factor(term.exponents, shrunk, real)
        kind = kind_of(term.op)
        payload, sent = payload_and_sent(kind, float(each), group_size)
        layer_count = layer_count_of(term, real_kinds)
        if layer_count is None:
            layer_count = term.per_layer * real_layers
            if len(real_kinds) > 1:
                notes.append(
                    "layer kinds differ in their collectives: per-layer counts assume the shrunk model's mix of kinds"
                )
        for scope, count in (("once", Fraction(term.fixed)), ("per layer", layer_count)):
            if count == 0:
                continue
            row = totals.setdefault((term.phase, kind, tensor_formula(term.exponents), scope), [0.0, 0.0, 0.0])
            row[0] += float(count)
            row[1] += float(count) * payload
            row[2] += float(count) * sent
    rows = [
        CollectiveCost("TP", phase, kind, tensor, scope, round(count), round(payload), round(sent))
        for (phase, kind, tensor, scope), (count, payload, sent) in totals.items()
    ]
    return sort_collectives(rows), sorted(set(notes))


def layer_count_of(term: Term, real_kinds: Mapping[str, int]) -> Fraction | None:
    """The term's count over the real model's layers, kind by kind; None where its per-kind counts
    are not known or the real model has a kind the shrunk one lacks."""
    if not term.per_kind or set(real_kinds) - {kind for kind, _ in term.per_kind}:
        return None
    return sum((count * real_kinds.get(kind, 0) for kind, count in term.per_kind), Fraction(0))


def sort_collectives(rows: Iterable[CollectiveCost]) -> list[CollectiveCost]:
    order = {"forward": 0, "backward": 1}
    return sorted(
        rows, key=lambda c: (c.source != "TP", order.get(c.phase, 2), c.scope != "per layer", c.kind, -c.sent_bytes)
    )

"""``measure_peak``: peak memory per rank of one training step, activations included, at full size.

The real model is built on the meta device, parallelized as the runtime does it (TP by the plan,
activation checkpointing, FSDP2) on device meshes of a single-process fake process group, made
outside fake mode (a mesh reads rank tensors), then materialised with ``to_empty`` inside
``FakeTensorMode``: every tensor has its real shape and none its memory. One step (forward, loss
through :mod:`plangen.loss`, backward, AdamW) runs under torch's ``FSDPMemTracker``, which follows
every tensor and files it by kind. Two corrections to the tracker, both explicit:

* **DTensor's shape propagation is not memory.** DTensor works out each op's output shape by
  running the op on *global*-shaped fake tensors, in the active fake mode when there is one. On real
  tensors it uses a fake mode of its own, which the tracker ignores; under our ``FakeTensorMode`` the
  tracker counted those global tensors as allocations (a transient of the whole unsharded tensor:
  AdamW's step on a DP 2 x TP 2 model came out at 6.6x the parameters instead of 3x). The tracker
  here skips every op run inside ``ShardingPropagator._propagate_tensor_meta_non_cached``.
* **Steady state, not the first step.** AdamW creates its states lazily in the first step, so a
  first step under-reports forward and backward (no states yet) and files the new states' creation
  as step temporaries. One untracked warm-up step (zero gradients) creates them first; the step
  measured is the second, as every step after the first is.

Depth: where every decoder layer is alike, the step is traced at 3, 4 and 5 layers and each phase's
peak in each place of the step (outside the layers, the first, the last, the others) fitted exactly
and extrapolated (:mod:`plangen.cost.depth`; a single peak per phase cannot be: with few layers
backward peaks in the head, with many in layer 0); elsewhere, and where a fit is not exact, every
layer is built and traced.
Nothing is printed; errors are one-line :class:`CostError`.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from plangen.cost.depth import AFTER_LAYERS, running_layer, without_root
from plangen.cost.settings import CostError, CostSettings, build_cost_settings

PHASES = ("forward", "backward", "optimizer")
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
NOTES = (
    "not covered: the CUDA caching allocator's fragmentation and reserve, the CUDA context and NCCL buffers "
    "(together often 1-3 GiB per GPU), and attention kernels' workspaces (the CPU sdpa kernel is traced)",
    "the optimizer step is foreach AdamW's (CUDA's default): one temporary copy of the parameters; fused AdamW "
    "holds none",
    "an asynchronous backend that releases FSDP2's last reduce-scatter input late adds up to the root unit's "
    "unsharded gradients to the optimizer step",
)


@dataclass(frozen=True)
class Breakdown:
    """Bytes one rank holds at one moment, by kind (they sum to :attr:`total`)."""

    parameters: int = 0  # FSDP2's sharded parameters in the master dtype, and buffers
    gradients: int = 0  # sharded gradients, and unsharded ones before their reduce-scatter
    optimizer: int = 0  # AdamW's exp_avg and exp_avg_sq
    activations: int = 0  # tensors made in forward (saved for backward or not yet freed), inputs
    gathered: int = 0  # FSDP2's all-gathered parameters and its all-gather / reduce-scatter buffers
    temporary: int = 0  # backward's temporaries (activation gradients), the optimizer step's temporaries

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.gathered + self.temporary

    def items(self) -> list[tuple[str, int]]:
        return [
            (name, getattr(self, name))
            for name in ("parameters", "gradients", "optimizer", "activations", "gathered", "temporary")
        ]


@dataclass(frozen=True)
class PhasePeak:
    phase: str  # "forward", "backward" or "optimizer"
    module: str  # the innermost module running at the peak ("" when none: the loss, the optimizer)
    breakdown: Breakdown
    tracked_total: int  # the tracker's own total at that moment (the breakdown must add up to it)
    # Where in the phase: "before" its first decoder layer, in a "layer", or "after" its layers
    # (what a moment outside every module means: forward's loss, backward's last reduce-scatters).
    place: str = ""
    layer: int | None = None  # the decoder layer's index where place is "layer"


def place_of(layer: int | None) -> str:
    """The :attr:`PhasePeak.place` of a peak recorded at ``layer`` (an index, None or AFTER_LAYERS)."""
    return "before" if layer is None else "after" if layer == AFTER_LAYERS else "layer"


# A moment outside every module of the model, by phase and place.
_OUTSIDE_MODULES = {
    ("forward", "before"): "before the model's modules",
    ("forward", "layer"): "between the decoder layers",
    ("forward", "after"): "after the model's modules (the loss)",
    ("backward", "before"): "before the output head's backward (the loss's)",
    ("backward", "layer"): "between the decoder layers' backward",
    (
        "backward",
        "after",
    ): "after the decoder layers' backward (the embedding's gradient, FSDP2's last reduce-scatters)",
}


def where_in_step(phase: str, module: str, place: str) -> str:
    """Where a peak is, in words: the innermost module running, else the moment of the step."""
    if phase == "optimizer":
        return "optimizer.step()"
    return module or _OUTSIDE_MODULES.get((phase, place), "outside the model's modules")


def phase_peak(phase: str, layer: int | None, module: str, breakdown: Breakdown, tracked_total: int) -> PhasePeak:
    """The peak of ``phase`` recorded at ``layer`` (an index, None before the layers, AFTER_LAYERS after)."""
    place = place_of(layer)
    return PhasePeak(phase, module, breakdown, tracked_total, place, layer if place == "layer" else None)


def in_step_order(peaks: Iterable[PhasePeak]) -> tuple[PhasePeak, ...]:
    """``peaks`` (one per phase and place) as the step runs them: forward from before its first
    layer through layers 0, 1, ... to after them, backward from the loss's through the layers in
    reverse to the embedding's, then the optimizer step."""

    def when(peak: PhasePeak) -> tuple[int, int, int]:
        through = {"before": 0, "layer": 1, "after": 2}[peak.place]
        layer = peak.layer or 0
        return PHASES.index(peak.phase), through, -layer if peak.phase == "backward" else layer

    return tuple(sorted(peaks, key=when))


@dataclass(frozen=True)
class PeakReport:
    model: str
    model_class: str
    plan: str  # the plan's source or name, as in the cost report
    settings: CostSettings
    activation_checkpointing: bool
    layers: int
    phases: tuple[PhasePeak, ...]  # each phase's own peak
    seconds: float
    notes: tuple[str, ...] = field(default=())
    # The peak of each stretch of the step (each phase before, in each decoder layer, after), in step
    # order (in_step_order): what the tracker keeps, not every allocation. phases holds the highest
    # of each phase.
    timeline: tuple[PhasePeak, ...] = field(default=())
    # The depths traced where the step was extrapolated to ``layers`` (plangen.cost.depth); () where
    # every layer was traced.
    extrapolated_from: tuple[int, ...] = field(default=())

    @property
    def peak(self) -> PhasePeak:
        return max(self.phases, key=lambda p: p.breakdown.total)

    def margin(self, gpu_bytes: int) -> int:
        """Bytes left on a GPU of ``gpu_bytes`` at the peak (negative: it does not fit)."""
        return gpu_bytes - self.peak.breakdown.total


def parse_memory(text: str, option: str = "--gpu-memory") -> int:
    """``80GiB``, ``80 GB``, ``141e9`` -> bytes; anything else is a one-line :class:`CostError`."""
    import re

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b|b)?\s*", text.strip().lower())
    if not match:
        raise CostError(f"{option} {text!r}: expected a size such as 80GiB, 80GB or 141e9 (bytes)")
    number, unit = float(match.group(1)), match.group(2) or "b"
    value = int(number * UNITS[unit])
    if value <= 0:
        raise CostError(f"{option} {text!r}: must be more than 0")
    return value


# ---------------------------------------------------------------------------------------------
# The tracker


def _collective_holds(func: Any, args: Any, out: Any) -> tuple[int, ...]:
    """Bytes a collective's work object holds (its distinct input tensors, its output tensors, and
    both), for a c10d or functional collective op; () for any other op (``wait_tensor`` included).

    gloo's worker thread keeps a work (and its tensors) until the end of its loop iteration, a moment
    after the caller's wait returns: on a busy machine a real rank can still hold them when the trace
    has freed them (plangen.cost.validate.held_by_gloo)."""
    # On every op the tracker sees: the cheap test first.
    if getattr(func, "namespace", None) not in ("c10d", "_c10d_functional") or "wait" in func.__name__:
        return ()
    import torch

    from plangen.stack.torch_compat import tree_leaves

    def distinct(values: Any) -> dict[int, int]:
        # By storage (fake tensors have no data pointer): a view and its base are held once.
        return {
            t.untyped_storage()._cdata: t.untyped_storage().nbytes()
            for t in tree_leaves(values)
            if isinstance(t, torch.Tensor)
        }

    ins, outs = distinct((args,)), distinct((out,))
    both = {**ins, **outs}
    return tuple(sorted({sum(ins.values()), sum(outs.values()), sum(both.values())} - {0}))


def _make_tracker(model: Any, optimizer: Any, layer_names: dict[str, int]):
    """An ``FSDPMemTracker`` that skips DTensor's shape propagation and records the peak of each
    phase in each decoder layer (``layer_names``: their names, as the model names them, by index),
    and the bytes each collective's work held, by phase (``held``: :func:`_collective_holds`)."""
    from plangen.stack.torch_compat import peak_tracker_class

    class StepTracker(peak_tracker_class()):
        def __init__(self) -> None:
            super().__init__(model, optimizer)
            self.propagating = 0
            # (phase, where) -> (snapshot, innermost module). where: a decoder layer's index, None
            # before the phase's first layer, AFTER_LAYERS once it has run one (forward: the head;
            # backward: the embedding, then FSDP2's last reduce-scatters). Inside one layer every
            # moment grows alike with the depth and the layer's index; the places apart do not.
            self.peaks: dict[tuple[str, int | None], tuple[dict[str, int], str]] = {}
            self.past_layers: set[str] = set()
            self.held: dict[str, set[int]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.propagating:  # global-shaped fake tensors that exist only to give a shape
                return func(*args, **(kwargs or {}))
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if holds := _collective_holds(func, (args, kwargs), out):
                self.held.setdefault(self._phase(*self.where()), set()).update(holds)
            return out

        def _in_backward(self, is_bw: bool) -> bool:
            # Once backward has begun, what runs before the optimizer (FSDP2's post-backward
            # callbacks) is backward's too, not forward's.
            return is_bw or "backward" in self.past_layers

        def _phase(self, is_bw: bool, in_opt: bool) -> str:
            return "optimizer" if in_opt else "backward" if self._in_backward(is_bw) else "forward"

        def on_peak(self, is_bw: bool, in_opt: bool, parents: set[str], snapshots: list[dict]) -> None:
            in_backward = self._in_backward(is_bw)
            phase = self._phase(is_bw, in_opt)
            layer = running_layer(parents, layer_names, in_backward)
            if layer is not None:
                self.past_layers.add(phase)
            elif phase in self.past_layers:
                layer = AFTER_LAYERS
            for snapshot in snapshots:
                best = self.peaks.get((phase, layer))
                if best is None or snapshot["Total"] > best[0]["Total"]:
                    self.peaks[(phase, layer)] = (
                        {str(getattr(k, "name", k)): v for k, v in snapshot.items()},
                        _innermost(parents, layer, layer_names),
                    )

    return StepTracker()


def _innermost(parents: set[str], layer: int | None = None, layer_names: dict[str, int] | None = None) -> str:
    """The innermost module's name as the model names it (``model.layers.3.mlp``), without the
    root's class name the tracker puts first; the root's class name when only the root runs.
    With ``layer``, only modules inside that decoder layer count (``parents`` can hold two)."""
    names = [without_root(p) for p in parents if p != "Global"]
    if layer is not None and layer_names:
        prefixes = [n for n, i in layer_names.items() if i == layer]
        names = [n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes)] or names
    if not names:
        return ""
    return max(names, key=lambda n: (n.count("."), len(n), n))


@contextmanager
def _skip_shape_propagation(tracker: Any) -> Iterator[None]:
    from plangen.stack.torch_compat import counting_shape_propagation

    with counting_shape_propagation(tracker, "propagating"):
        yield


def _breakdown(snapshot: dict[str, int], optimizer_states: int) -> Breakdown:
    get = lambda *names: sum(snapshot.get(n, 0) for n in names)  # noqa: E731
    optimizer = min(get("OPT"), optimizer_states)
    return Breakdown(
        parameters=get("SHARDED_PARAM", "BUFFER"),
        gradients=get("SHARDED_GRAD", "UNSHARDED_GRAD"),
        optimizer=optimizer,
        activations=get("ACT", "INP"),
        gathered=get("UNSHARDED_PARAM", "ALL_GATHER", "REDUCE_SCATTER"),
        temporary=get("TEMP") + get("OPT") - optimizer,
    )


def track_step(
    model: Any, batch: int, seq: int, vocab: int, foreach: bool = True, held: dict[str, set[int]] | None = None
) -> dict[str, PhasePeak]:
    """Each phase's peak of the second AdamW step of ``model``: :func:`track_layer_peaks`'s, the
    highest of each phase (``held``, when given, gets the bytes each collective's work held, by phase)."""
    return peaks_by_phase(track_layer_peaks(model, batch, seq, vocab, foreach, held))


def peaks_by_phase(peaks: dict[tuple, PhasePeak]) -> dict[str, PhasePeak]:
    best: dict[str, PhasePeak] = {}
    for (phase, *_), peak in peaks.items():
        if phase not in best or peak.tracked_total > best[phase].tracked_total:
            best[phase] = peak
    return {phase: best[phase] for phase in PHASES if phase in best}


def track_layer_peaks(
    model: Any, batch: int, seq: int, vocab: int, foreach: bool = True, held: dict[str, set[int]] | None = None
) -> dict[tuple[str, int | None], PhasePeak]:
    """The peak of each phase in each decoder layer (index), before the phase's first layer (None)
    and after its layers (``AFTER_LAYERS``) of the second AdamW step of ``model`` (an FSDP2 module),
    real or fake tensors.

    The first step (zero gradients) only creates the optimizer states; the second is measured:
    forward, next-token loss through :mod:`plangen.loss`, backward, ``optimizer.step()``.
    ``foreach``: torch's default on CUDA (one temporary copy of the parameters in the step; the
    single-tensor step, CPU's default, holds two copies of one parameter at a time).
    """
    import torch

    from plangen.cost.measure import step_loss
    from plangen.distributed.fake_group import quiet_fake_tensor_log
    from plangen.model.module_tree import find_transformer_layers

    # AdamW runs on the parameters' local shards (the same storages, so the same memory): on
    # DTensors each foreach op pays for a sharding propagation over every parameter (Llama-3.1-70B,
    # 32 layers at TP 8 x DP 4: 106 s traced, 78 s this way; the same bytes).
    params = list(model.parameters())
    shards = [_local(p) for p in params]
    optimizer = torch.optim.AdamW(shards, lr=1e-4, foreach=foreach)

    def optimizer_step() -> None:
        for param, shard in zip(params, shards):
            shard.grad = None if param.grad is None else _local(param.grad)
        optimizer.step()
        for param, shard in zip(params, shards):
            param.grad = shard.grad = None

    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer_step()
    # The batch on the parameters' device: CPU for the trace, the accelerator's for a real run there.
    device = shards[0].device
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    positions = torch.arange(seq, device=device).expand(batch, seq)
    index = {id(layer): i for i, layer in enumerate(find_transformer_layers(model))}
    layer_names = {name: index[id(m)] for name, m in model.named_modules() if id(m) in index}
    tracker = _make_tracker(model, optimizer, layer_names)
    tracker.track_inputs((ids, positions))
    with quiet_fake_tensor_log(), _skip_shape_propagation(tracker), tracker:
        step_loss(model(input_ids=ids, position_ids=positions).logits, ids).backward()
        optimizer_step()
    if held is not None:
        held.update(tracker.held)
    states = sum(
        (v.to_local() if hasattr(v, "to_local") else v).untyped_storage().nbytes()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return {
        key: phase_peak(key[0], key[1], module, _breakdown(snapshot, states), snapshot["Total"])
        for key, (snapshot, module) in tracker.peaks.items()
    }


def _local(tensor: Any) -> Any:
    # A DTensor's local shard: the same storage, so the tracker files it as the DTensor's.
    from plangen.stack.torch_compat import local_tensor

    return local_tensor(tensor)


# ---------------------------------------------------------------------------------------------
# The model at a depth, parallelized as the runtime does it


def parallelize_for_trace(
    model: Any, choice: Any, settings: CostSettings, activation_checkpointing: bool, dp_mesh, tp_mesh
):
    """TP by ``choice``, activation checkpointing, FSDP2: :func:`plangen.parallelize.parallelize_model`'s
    steps, for any plan the cost report names."""
    from plangen.cost.measure import TORCH_DTYPES
    from plangen.distributed.fake_group import quiet_partial_matches
    from plangen.parallelize import apply_activation_checkpointing, apply_fsdp
    from plangen.plans.checks import PlanError
    from plangen.model.module_tree import find_transformer_layers
    from plangen.plans import CHECKPOINT_FILTERS
    from plangen.runtime.tensor_parallel import apply_tp

    layers = find_transformer_layers(model)
    if settings.tp_size > 1:
        try:
            with quiet_partial_matches():
                apply_tp(model, tp_mesh, choice.build(model), dp_size=settings.dp_size)
        except (PlanError, ValueError) as error:
            raise CostError(f"{choice.name}: {error}") from None
    if activation_checkpointing:
        keep = CHECKPOINT_FILTERS.get(type(model).__name__, lambda layer: True)
        apply_activation_checkpointing([layer for layer in layers if keep(layer)])
    return apply_fsdp(model, layers, dp_mesh, TORCH_DTYPES[settings.dtype])


def trace_peak(
    resolved: Any,
    config: Any,
    plan: str,
    settings: CostSettings,
    activation_checkpointing: bool,
    extrapolate: bool = True,
):
    """(plan choice, the peak of each phase in each place for rank 0 of a model built from ``config``,
    how the depth was traced, the depths traced where it was extrapolated, else ()): at depths 3, 4
    and 5 and extrapolated where every layer is alike and the fit is exact (:mod:`plangen.cost.depth`),
    else every layer."""
    from plangen.cost import depth as deep
    from plangen.cost.measure import TORCH_DTYPES
    from plangen.cost.probe_configs import count_layers
    from plangen.cost.training import training_config
    from plangen.model.resolve import build_meta_model
    from plangen.model.module_tree import find_transformer_layers

    config = training_config(config)
    layers = count_layers(config)
    why = f"{layers} layers: few enough to trace each" if layers <= max(deep.DEPTHS) else None
    if why is None and extrapolate:
        try:
            meta = build_meta_model(config, resolved.model_class, dtype=TORCH_DTYPES[settings.master_dtype])
        except Exception as error:  # transformers raises many types for a config it cannot build
            raise CostError(f"cannot build {resolved.model_class.__name__}: {error}") from None
        why = deep.layers_alike(find_transformer_layers(meta), config)
        if why is None:
            traced = {
                n: _trace_at(resolved, deep.config_at_depth(config, n), plan, settings, activation_checkpointing)
                for n in deep.DEPTHS
            }
            peaks = _extrapolated_peaks({n: p for n, (_, p) in traced.items()}, layers)
            if peaks is not None:
                how = (
                    f"depth: traced at {', '.join(map(str, deep.DEPTHS))} layers and extrapolated to {layers}"
                    " (every layer alike; each figure exactly linear in the depth, checked)"
                )
                return traced[deep.DEPTHS[0]][0], peaks, how, deep.DEPTHS
            why = "its memory is not exactly linear in the depth"
    choice, peaks = _trace_at(resolved, config, plan, settings, activation_checkpointing)
    how = f"depth: every layer traced ({why})" if why else "depth: every layer traced"
    return choice, peaks, how, ()


def _extrapolated_peaks(samples: dict[int, dict[tuple, PhasePeak]], layers: int) -> dict[tuple, PhasePeak] | None:
    from plangen.cost import depth as deep

    values = {
        n: {key: {**dict(p.breakdown.items()), "tracked_total": p.tracked_total} for key, p in peaks.items()}
        for n, peaks in samples.items()
    }
    fitted = deep.extrapolate(values, layers)
    if fitted is None:
        return None
    deepest = deep.DEPTHS[-1]
    peaks = {}
    for (phase, layer), v in fitted.items():
        traced = deep.traced_layer(layer, layers, deepest)
        source = samples[deepest].get((phase, traced))
        total = v.pop("tracked_total")
        module = (
            ""
            if source is None
            else source.module
            if layer in (None, AFTER_LAYERS)
            else deep.renumber_module(source.module, traced, layer)
        )
        peaks[(phase, layer)] = phase_peak(phase, layer, module, Breakdown(**v), total)
    return peaks


def _trace_at(resolved: Any, config: Any, plan: str, settings: CostSettings, activation_checkpointing: bool):
    """(plan choice, the peak of each phase in each layer) for rank 0 of a model built from
    ``config``, traced with fake tensors."""
    import torch
    from plangen.stack.torch_compat import fake_tensor_mode_class
    from torch.distributed.device_mesh import DeviceMesh

    from plangen.cost.choices import resolve_plan_choice
    from plangen.cost.measure import TORCH_DTYPES
    from plangen.distributed.fake_group import fake_process_group
    from plangen.model.resolve import build_meta_model, text_config

    world = settings.dp_size * settings.tp_size
    with fake_process_group(world, error=CostError):
        try:
            meta = build_meta_model(config, resolved.model_class, dtype=TORCH_DTYPES[settings.master_dtype])
        except Exception as error:  # transformers raises many types for a config it cannot build
            raise CostError(f"cannot build {resolved.model_class.__name__}: {error}") from None
        choice = resolve_plan_choice(plan, meta, settings.sequence_parallel)
        # Outside fake mode: a mesh reads its ranks from a real tensor.
        mesh = DeviceMesh(
            "cpu", torch.arange(world).view(settings.dp_size, settings.tp_size), mesh_dim_names=("dp", "tp")
        )
        model = parallelize_for_trace(meta, choice, settings, activation_checkpointing, mesh["dp"], mesh["tp"])
        with fake_tensor_mode_class()(allow_non_fake_inputs=True), warnings.catch_warnings():
            # FSDP2's warning for a root returning a view (some plans' logits): about in-place ops, none here.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            model.to_empty(device="cpu")
            model.train()
            try:
                peaks = track_layer_peaks(model, settings.micro_batch, settings.seq_len, text_config(config).vocab_size)
            except CostError:
                raise
            except Exception as error:  # the plan's or the model's, not the trace's: one line
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise CostError(f"{choice.name}: a traced step fails: {type(error).__name__}: {first}") from None
    return choice, peaks


def measure_peak(
    target: str,
    plan: str | None = None,
    *,
    model: str | None = None,
    tp_size: int | None = None,
    dp_size: int = 1,
    seq_len: int = 4096,
    micro_batch: int = 1,
    dtype: str = "bf16",
    master_dtype: str = "fp32",
    sequence_parallel: bool | None = None,
    activation_checkpointing: bool = False,
    extrapolate: bool = True,
) -> PeakReport:
    """Peak memory of rank 0 in one training step of ``target`` (a MODEL or plan file) under ``plan``
    (default: the plan the runtime would use, or the plan file), at DP x TP.

    TP size and sequence parallel default to the plan file's, else TP 2 without sequence parallel,
    as in :func:`plangen.cost.report.build_cost_report`. ``extrapolate=False`` traces every layer
    even where the depth could be extrapolated (:mod:`plangen.cost.depth`).
    """
    from plangen.cost.probe_configs import count_layers
    from plangen.cost.report import recorded_tp_size, read_target, resolve_cost_model
    from plangen.model.resolve import config_for_class

    started = time.perf_counter()
    subject, spec, metadata = read_target(target, model)
    if sequence_parallel is None:
        sequence_parallel = bool(metadata.get("PLANGEN_SEQUENCE_PARALLEL", False))
    settings = build_cost_settings(
        tp_size=tp_size if tp_size is not None else recorded_tp_size(metadata),
        dp_size=dp_size,
        seq_len=seq_len,
        micro_batch=micro_batch,
        dtype=dtype,
        master_dtype=master_dtype,
        sequence_parallel=sequence_parallel,
    )
    resolved = resolve_cost_model(spec, settings)
    config = config_for_class(resolved.config, resolved.model_class)
    choice, peaks, how, traced = trace_peak(
        resolved, config, plan or subject, settings, activation_checkpointing, extrapolate
    )
    phases = peaks_by_phase(peaks)
    return PeakReport(
        spec,
        resolved.model_class.__name__,
        choice.name,
        settings,
        activation_checkpointing,
        count_layers(config),
        tuple(phases[p] for p in PHASES if p in phases),
        time.perf_counter() - started,
        (how, *NOTES),
        in_step_order(peaks.values()),
        tuple(traced),
    )

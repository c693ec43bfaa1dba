"""Follow a plan's layouts through a model: what each style takes and leaves, where they meet.

Level 2 runs one forward of the shrunk, unsharded model (:func:`plangen.model.shrink.build_tiny_model`)
with hooks that play each planned style's part symbolically, from its facts
(:attr:`plangen.plan.style_facts.StyleFacts.hooks`): the output a style leaves (plain local tensor or
DTensor, with its placement) is tagged on the autograd node that produced it, and where a module
reads a tensor, the tags nearest above it in the autograd graph are the layouts the plan hands it,
whatever ops (reshapes, attention, the activation, residual adds) lie between. Each such meeting
is a :class:`Junction`; :func:`find_layout_conflicts` says which plan entry is to blame where the
layouts cannot meet. The real model never sees a DTensor here: the tags are bookkeeping only.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from plangen.check.autograd_graph import nearest_tags
from plangen.model.module_tree import ModuleIndex, generalize
from plangen.plan.style_facts import (
    MODULE_HOOKS,
    PREPARE_INPUT,
    PREPARE_INPUT_OUTPUT,
    PREPARE_OUTPUT,
    CONV1D,
    EMBEDDING,
    LINEAR,
    SEQUENCE_HOOKS,
)
from plangen.styles.base import facts_of, first_layout
from plangen.styles.kinds import module_kind

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

UNKNOWN = "?"  # left by a style whose hooks level 2 does not follow


@dataclass(frozen=True)
class Layout:
    """What a plan entry leaves: a plain local tensor or a DTensor, and its placement.

    ``placement`` is normalized against the tensor's rank (``Shard(-1)`` for the last dim of any
    tensor) so layouts compare across reshapes; ``shown`` is the placement as the plan writes it.
    """

    key: str
    dtensor: bool
    placement: str
    shown: str
    source: str = ""  # the module path whose style left it
    prepared: bool = False  # a block's input, as its PrepareModuleInput hands it to what is inside
    shape: tuple[int, ...] = ()  # of the tensor it was left on (a reader may see a view of it)


@dataclass(frozen=True)
class Junction:
    """A module reading a tensor: the layouts the plan hands it, and what it takes.

    ``takes``: the placement the module's style reads a plain tensor as; None for a module with no
    entry of its own but weights of its own (it takes plain tensors only).
    """

    module: str  # the path, generalized (``model.layers.*.mlp.up_proj``)
    path: str  # the path itself (``model.layers.0.mlp.up_proj``)
    key: str | None  # the plan entry of the reading module (None: it has none)
    style: str  # the reading style's class name, or the module's class name
    takes: str | None
    takes_shown: str | None
    producers: tuple[Layout, ...]


@dataclass(frozen=True)
class Conflict:
    """Layouts that cannot meet at ``junction``; ``blame`` is the entry the finding goes on."""

    junction: Junction
    blame: str
    message: str


# --- placements --------------------------------------------------------------------------------


def _normalized(placement: Any, ndim: int) -> tuple[str, str]:
    """(normalized, shown) text of a placement on a tensor of rank ``ndim``."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if isinstance(placement, Shard):
        dim = placement.dim - ndim if placement.dim >= 0 else placement.dim
        return f"Shard({dim})", f"Shard({placement.dim})"
    if isinstance(placement, Replicate):
        return "Replicate()", "Replicate()"
    if isinstance(placement, Partial):
        return "Partial()", "Partial()"
    return UNKNOWN, str(placement)


def _seen_on(layout: Layout, shape: tuple[int, ...]) -> Layout:
    """``layout`` as a reader sees it on a view of the tensor it was left on, of ``shape``.

    A shard of the features, split into heads or merged back, is a shard of the first feature dim:
    the heads shard ``Shard(2)`` a per-head norm leaves on ``[b, s, heads, head_dim]`` is
    ``Shard(-1)`` of the ``[b, s, heads * head_dim]`` that ``o_proj`` reads (and ``k_norm``'s, on
    fewer KV heads, too: attention repeats each rank's own). That holds where the dims before the
    shard are the reader's and the shard is the last dim of one side; elsewhere (a transpose
    first, another tensor) the placement stays as normalized, its dim counted from the end."""
    source = layout.shape
    if not layout.placement.startswith("Shard(") or not source or source == shape:
        return layout
    dim = int(layout.placement[6:-1]) + len(source)
    if dim >= len(shape) or source[:dim] != shape[:dim] or dim not in (len(source) - 1, len(shape) - 1):
        return layout
    return dataclasses.replace(layout, placement=f"Shard({dim - len(shape)})", shape=shape)


# --- the tracer --------------------------------------------------------------------------------


class LayoutTracer:
    """Hooks on every module of an unsharded model that record :class:`Junction` s as it runs."""

    def __init__(self, model: "nn.Module", styles: Mapping[str, "ParallelStyle"]) -> None:
        index = ModuleIndex(model)
        self.covering: dict[str, str] = {}
        for key in styles:
            for path in index.paths(key):
                self.covering[path] = key
        self.styles = styles
        self.tags: dict[int, Layout] = {}
        self.keep: list[Any] = []  # the tagged nodes stay alive, so their ids are never reused
        self.junctions: list[Junction] = []
        self.handles: list[Any] = []
        opaque = {
            p for p, k in self.covering.items() if facts_of(styles[k]) is None or facts_of(styles[k]).hooks is None
        }
        for path, module in model.named_modules():
            if not path:
                continue
            key = self.covering.get(path)
            if key is not None:
                hooks = facts_of(styles[key]).hooks if facts_of(styles[key]) is not None else None
                self._install(path, module, key, hooks)
            elif any(True for _ in module.parameters(recurse=False)) and not any(
                path.startswith(p + ".") for p in opaque
            ):
                self.handles.append(
                    module.register_forward_pre_hook(self._plain_reader(path, module), with_kwargs=True)
                )
                if module_kind(module) in (LINEAR, CONV1D, EMBEDDING):
                    self.handles.append(
                        module.register_forward_hook(self._unplanned_projection(path), with_kwargs=True)
                    )

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    # --- tagging and reading ----------------------------------------------------------------

    def _tag(self, tensor: "torch.Tensor", layout: Layout) -> "torch.Tensor":
        if not tensor.requires_grad:
            return tensor
        # A copy, not a view: a model that modifies the output in place (Llama-4's block adds its
        # routed sum into the shared expert's output) would rebase a view's autograd node and lose the tag.
        tagged = tensor.clone()
        self.keep.append(tagged.grad_fn)
        self.tags[id(tagged.grad_fn)] = layout
        return tagged

    def producers(self, tensor: Any) -> tuple[Layout, ...]:
        """The tags nearest above ``tensor`` in the autograd graph, in the order first found."""
        import torch

        if not isinstance(tensor, torch.Tensor) or tensor.grad_fn is None:
            return ()
        return tuple(dict.fromkeys(nearest_tags([tensor.grad_fn], self.tags)))

    def _read(self, path: str, key: str | None, style: str, tensor: Any, takes: Any) -> None:
        producers = tuple(dict.fromkeys(_seen_on(p, tuple(tensor.shape)) for p in self.producers(tensor)))
        if not producers:
            return
        normalized, shown = _normalized(takes, tensor.ndim) if takes is not None else (None, None)
        self.junctions.append(Junction(generalize(path), path, key, style, normalized, shown, producers))

    def _layout(self, key: str, tensor: "torch.Tensor", placement: Any, dtensor: bool, path: str = "",
                prepared: bool = False) -> Layout:  # fmt: skip
        normalized, shown = _normalized(placement, tensor.ndim)
        return Layout(key, dtensor, normalized, shown, path, prepared, tuple(tensor.shape))

    # --- the hooks -------------------------------------------------------------------------

    def _unplanned_projection(self, path: str):
        """A projection with no entry computes on whatever it is given: from a whole input, a whole
        output (the layouts above it still hold); from anything else, a layout level 2 does not
        follow (PG205 and PG209 judge such a projection)."""

        def hook(mod, args, kwargs, output):
            producers = self.producers(_first_tensor(args, kwargs))
            if all(not p.dtensor and p.placement == "Replicate()" for p in producers):
                return None
            unknown = Layout("", False, UNKNOWN, UNKNOWN, path)
            return _map_tensors(output, lambda t: self._tag(t, unknown))

        return hook

    def _plain_reader(self, path: str, module: "nn.Module"):
        def hook(mod, args, kwargs):
            tensor = _first_tensor(args, kwargs)
            if tensor is not None:
                self._read(path, None, type(module).__name__, tensor, None)

        return hook

    def _install(self, path: str, module: "nn.Module", key: str, hooks: str | None) -> None:
        style = self.styles[key]
        name = type(style).__name__
        if hooks == MODULE_HOOKS:
            self._module_hooks(path, module, key, name, first_layout(style.input_layouts), first_layout(style.output_layouts),
                               bool(style.use_local_output))  # fmt: skip
        elif hooks == SEQUENCE_HOOKS:
            placement = first_layout(style.sequence_sharding)
            if style.use_local_output:
                self._local_sequence_hooks(path, module, key, name, placement)
            else:
                self._module_hooks(path, module, key, name, placement, placement, False)
        elif hooks in (PREPARE_INPUT, PREPARE_OUTPUT, PREPARE_INPUT_OUTPUT):
            if hooks == PREPARE_INPUT_OUTPUT:
                self._prepare_input(path, module, key, name, style.prepare_module_input)
                self._prepare_output(path, module, key, name, style.prepare_module_output)
            elif hooks == PREPARE_INPUT:
                self._prepare_input(path, module, key, name, style)
            else:
                self._prepare_output(path, module, key, name, style)
        else:
            unknown = Layout(key, False, UNKNOWN, UNKNOWN, path)

            def leave_unknown(mod, args, output):
                return _map_tensors(output, lambda t: self._tag(t, unknown))

            self.handles.append(module.register_forward_hook(leave_unknown))
            # Children the style lays out itself (a Mamba1 mixer's projections) leave what level 2
            # does not follow either: an entry inside (its out_proj) is not judged by their outputs.
            facts = facts_of(style)
            for child in facts.lays_out_children if facts is not None else ():
                if hasattr(getattr(module, child, None), "register_forward_hook"):
                    self.handles.append(getattr(module, child).register_forward_hook(leave_unknown))

    def _module_hooks(self, path, module, key, name, takes, leaves, local) -> None:
        def read(mod, args, kwargs):
            tensor = _first_tensor(args, kwargs)
            if tensor is not None:
                self._read(path, key, name, tensor, takes)

        def leave(mod, args, output):
            return _map_tensors(
                output, lambda t: self._tag(t, self._layout(key, t, leaves, not local, path)), first=True
            )

        self.handles.append(module.register_forward_pre_hook(read, with_kwargs=True))
        self.handles.append(module.register_forward_hook(leave))

    def _local_sequence_hooks(self, path, module, key, name, placement) -> None:
        """A sequence-parallel style that returns its output local (``ReplicatedWithGradAllReduce`` on
        a per-head norm): a plain input is only labelled with its placement, so the weight gradient
        is summed over TP, and the module computes on it as given; what reads the output meets the
        layouts above it (an edited ``q_proj`` seen through ``q_norm`` at ``o_proj``). A DTensor input
        is redistributed to the placement, and its local shard leaves."""
        redistributed: list[bool] = []

        def read(mod, args, kwargs):
            tensor = _first_tensor(args, kwargs)
            dtensor = tensor is not None and any(p.dtensor for p in self.producers(tensor))
            redistributed.append(dtensor)
            if dtensor:
                self._read(path, key, name, tensor, placement)

        def leave(mod, args, output):
            if not (redistributed and redistributed.pop()):
                return None
            return _map_tensors(
                output, lambda t: self._tag(t, self._layout(key, t, placement, False, path)), first=True
            )

        self.handles.append(module.register_forward_pre_hook(read, with_kwargs=True))
        self.handles.append(module.register_forward_hook(leave))

    def _prepare_input(self, path, module, key, name, style) -> None:
        import torch

        local = bool(style.use_local_output)

        def prepare(tensor, given, desired):
            if given is None or not isinstance(tensor, torch.Tensor):
                return tensor
            self._read(path, key, name, tensor, given)
            layout = self._layout(key, tensor, desired if desired is not None else given, not local, path, True)
            return self._tag(tensor, layout)

        def hook(mod, args, kwargs):
            given = style.input_layouts or ()
            desired = style.desired_input_layouts or ()
            args = tuple(
                prepare(a, given[i] if i < len(given) else None, desired[i] if i < len(desired) else None)
                for i, a in enumerate(args)
            )
            given_kw = style.input_kwarg_layouts or {}
            desired_kw = style.desired_input_kwarg_layouts or {}
            kwargs = {k: prepare(v, given_kw.get(k), desired_kw.get(k)) for k, v in kwargs.items()}
            return args, kwargs

        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _prepare_output(self, path, module, key, name, style) -> None:
        import torch

        local = bool(style.use_local_output)
        given = style.output_layouts or ()
        desired = style.desired_output_layouts or ()

        def hook(mod, args, output):
            outputs = output if isinstance(output, tuple) else (output,)
            new = []
            for i, tensor in enumerate(outputs):
                layout = given[i] if i < len(given) else None
                if layout is None or not isinstance(tensor, torch.Tensor):
                    new.append(tensor)
                    continue
                self._read(path, key, name, tensor, layout)
                want = desired[i] if i < len(desired) and desired[i] is not None else layout
                new.append(self._tag(tensor, self._layout(key, tensor, want, not local, path)))
            return type(output)(new) if isinstance(output, tuple) else new[0]

        self.handles.append(module.register_forward_hook(hook))


def _first_tensor(args: tuple, kwargs: Mapping[str, Any]) -> "torch.Tensor | None":
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _map_tensors(output: Any, fn, first: bool = False) -> Any:
    """``output`` with ``fn`` applied to its tensor (a tuple's tensors; only the first if ``first``)."""
    import torch

    if isinstance(output, torch.Tensor):
        return fn(output)
    if isinstance(output, tuple) and not hasattr(output, "_fields"):
        done = False
        items = []
        for item in output:
            if isinstance(item, torch.Tensor) and not (first and done):
                items.append(fn(item))
                done = True
            else:
                items.append(item)
        return tuple(items)
    return output


def trace_junctions(
    model: "nn.Module", styles: Mapping[str, "ParallelStyle"], input_ids: "torch.Tensor"
) -> list[Junction]:
    """The junctions of one forward of ``model`` (unsharded) under the plan ``styles``."""
    import torch

    tracer = LayoutTracer(model, styles)
    try:
        with torch.enable_grad():
            model(input_ids=input_ids)
    finally:
        tracer.remove()
    return tracer.junctions


# --- judging the junctions ----------------------------------------------------------------------


def _describe(dtensor: bool, shown: str) -> str:
    kind = "a DTensor" if dtensor else "a plain tensor"
    if shown == "Replicate()":
        return f"{kind}, whole ({shown})"
    if shown.startswith("Shard("):
        return f"{kind}, this rank's shard on dim {shown[6:-1]} ({shown})"
    return f"{kind} ({shown})"


def _voters(junction: Junction) -> tuple[Layout, ...]:
    """The producers whose placement counts: a block's own input, met again inside the block beside
    what its children leave (DeepSeek's rope part, whole, beside the heads' shards), is broadcast
    there, not read as a layout of its own."""
    inside = [p for p in junction.producers if not (p.prepared and junction.path.startswith(p.source + "."))]
    return tuple(inside) or junction.producers


def _parties(junction: Junction) -> list[tuple[str, str]]:
    """(entry, placement) of each side of a junction of plain tensors, the reader last."""
    parties = [(p.key, p.placement) for p in _voters(junction)]
    if junction.key is not None and junction.takes is not None:
        parties.append((junction.key, junction.takes))
    return parties


def _problem(junction: Junction) -> tuple[list[str], str] | None:
    """(the entries that disagree, the layout the rest agree on) where a junction's layouts cannot
    meet; None where they can (or where level 2 does not judge)."""
    producers = junction.producers
    if any(p.placement == UNKNOWN for p in producers):
        return None
    dtensors = [p for p in producers if p.dtensor]
    plain = [p for p in producers if not p.dtensor]
    if junction.key is None:
        # A module with weights of its own and no entry: plain tensors only.
        return ([p.key for p in dtensors], "plain") if dtensors else None
    if dtensors and plain:
        odd = dtensors if len(dtensors) <= len(plain) else plain
        return [p.key for p in odd], "plain" if odd is dtensors else "DTensor"
    if dtensors or junction.takes is None or junction.takes == UNKNOWN:
        return None  # a DTensor is redistributed to what the style wants
    parties = _parties(junction)
    votes = Counter(placement for _, placement in parties)
    if len(votes) == 1:
        return None
    (top, count), *rest = votes.most_common()
    if rest and rest[0][1] == count:
        tied = {placement for placement, n in votes.items() if n == count}
        return [key for key, placement in parties if placement in tied], ""
    return [key for key, placement in parties if placement != top], top


def find_layout_conflicts(junctions: list[Junction]) -> list[Conflict]:
    """The junctions whose layouts cannot meet, each blamed on one plan entry.

    Where one side stands alone against the others (q_proj left whole beside its shard-leaving
    siblings k_proj and v_proj, all read by o_proj), it is to blame. Where a reader and a producer
    disagree one to one, the entry that disagrees at more junctions over the whole model is (an
    embedding whose output every layer reads differently); ties go to the producer.
    """
    problems = [(j, p) for j in junctions if (p := _problem(j)) is not None]
    disagreements = Counter(key for _, (keys, _) in problems for key in set(keys))
    conflicts = []
    for junction, (keys, agreed) in problems:
        order = [p.key for p in junction.producers]
        blame = max(keys, key=lambda k: (disagreements[k], k in order, -order.index(k) if k in order else 0))
        conflicts.append(Conflict(junction, blame, _message(junction, blame, agreed)))
    return conflicts


def _names(keys) -> str:
    return ", ".join(f"`{k}`" for k in sorted(set(keys)))


def _message(junction: Junction, blame: str, agreed: str) -> str:
    reader = f"`{junction.module}` ({junction.style})"
    if junction.key is None:
        return (
            f"`{blame}` hands a DTensor to {reader}, which has no entry: its weights are plain tensors and torch"
            " refuses to mix a Tensor and a DTensor; give it a style (as its siblings have) or leave"
            f" `{blame}`'s output plain (use_local_output=True)"
        )
    mine = [p for p in junction.producers if p.key == blame]
    if agreed in ("plain", "DTensor"):
        kind = "DTensor" if mine and mine[0].dtensor else "plain tensor"
        others = [p.key for p in junction.producers if p.key != blame]
        return (
            f"`{blame}` leaves a {kind}, {_names(others)} {agreed} tensors, and {reader} reads both mixed: torch"
            " refuses to mix a Tensor and a DTensor (use_local_output decides which one a style leaves)"
        )
    voters = _voters(junction)
    if mine:  # a producer is to blame
        layout = mine[0]
        wanted = agreed or junction.takes
        siblings = [p.key for p in voters if p.key != blame and p.placement == wanted]
        also = f" (like {_names(siblings)})" if siblings else ""
        return (
            f"`{blame}` leaves {_describe(layout.dtensor, layout.shown)}, but {reader} reads"
            f" {_describe(False, junction.takes_shown or '?')}{also}: the shapes do not meet at run time"
        )
    left = [p for p in voters if p.placement == agreed] or list(voters)
    shown = left[0].shown
    return (
        f"{reader} reads its input as {_describe(False, junction.takes_shown or '?')}, but {_names(p.key for p in left)}"
        f" leave {_describe(False, shown)}: its input_layouts should say {shown}"
    )


def iter_conflicts_by_entry(conflicts: list[Conflict]) -> Iterator[Conflict]:
    """The first conflict blamed on each entry."""
    seen: set[str] = set()
    for conflict in conflicts:
        if conflict.blame not in seen:
            seen.add(conflict.blame)
            yield conflict

"""One forward and backward of the shrunk model under a plan, on a single-process fake process group.

Level 2's last check (PG215): the plan is applied by the runtime itself
(:func:`plangen.parallelize.parallelize_model`) to the shrunk model of the same architecture, at the
plan's own TP size, on a fake process group (collectives do nothing, every shape is real), in this
process: no gloo, no worker, a fraction of a second. A failure is charged to the plan entry that
caused it, not to the module that crashed: hooks record which planned modules ran and what layout
each one's output really had (plain or DTensor, which dims are split, against the unsharded
model's shapes), and the entry whose output stands out from the others that meet where it failed
is the culprit (:func:`attribute_failure`).
"""

from __future__ import annotations

import copy
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from plangen.errors import one_line
from plangen.module_tree import ModuleIndex, generalize

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass(frozen=True)
class FakeRunFailure:
    """Where the run failed (``stage``: apply, forward, backward, shapes), why, and the entry to blame."""

    stage: str
    error: str
    key: str | None
    module: str | None = None


@dataclass(frozen=True)
class Observed:
    """What a planned module's output really was: its entry, plain or DTensor, and per dim how many
    times smaller its local tensor is than the unsharded model's (1: whole)."""

    key: str
    path: str
    dtensor: bool
    split: tuple[int, ...]


class RunRecorder:
    """Forward hooks on the sharded model: the stack of running modules (with their calls' planned
    descendants) and, for each planned module's output, what it really was."""

    def __init__(self, model: "nn.Module", covering: Mapping[str, str], shapes: Mapping[str, list[tuple[int, ...]]]):
        self.covering, self.shapes = covering, shapes
        self.stack: list[tuple[str, list[Observed]]] = []
        self.inputs: dict[str, tuple] = {}
        self.order: list[Observed] = []
        self.tags: dict[int, Observed] = {}
        self.keep: list[Any] = []
        self.calls: Counter[str] = Counter()
        self.handles = []
        for name, module in model.named_modules():
            if name:
                self.handles.append(module.register_forward_pre_hook(self._enter(name), with_kwargs=True))
                self.handles.append(module.register_forward_hook(self._leave(name)))

    def _enter(self, name: str):
        def hook(module, args, kwargs):
            self.stack.append((name, []))
            self.inputs[name] = (*args, *kwargs.values())

        return hook

    def _leave(self, name: str):
        def hook(module, args, output):
            if self.stack:
                self.stack.pop()
            call = self.calls[name]
            self.calls[name] += 1
            key = self.covering.get(name)
            tensor = _first_tensor(output)
            if key is None or tensor is None:
                return None
            unsharded = self.shapes.get(name, [])
            observed = Observed(key, name, _is_dtensor(tensor), _split(tensor, unsharded[call] if call < len(unsharded) else None))
            self.order.append(observed)
            for _, inside in self.stack:
                inside.append(observed)
            if tensor.grad_fn is not None:
                self.keep.append(tensor.grad_fn)
                self.tags[id(tensor.grad_fn)] = observed
            return None

        return hook

    def producers(self, values: tuple) -> list[Observed]:
        """The planned outputs nearest above ``values`` in the autograd graph."""
        import torch

        found: dict[str, Observed] = {}
        seen: set[int] = set()
        stack = [v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            observed = self.tags.get(id(node))
            if observed is not None:
                found.setdefault(observed.path, observed)
                continue
            stack.extend(n for n, _ in node.next_functions)
        return list(found.values())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _first_tensor(output: Any) -> "torch.Tensor | None":
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    return getattr(output, "last_hidden_state", None) if not isinstance(output, dict) else None


def _is_dtensor(tensor: "torch.Tensor") -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _split(tensor: "torch.Tensor", unsharded: tuple[int, ...] | None) -> tuple[int, ...]:
    local = tensor.to_local() if _is_dtensor(tensor) else tensor
    if unsharded is None or len(unsharded) != local.dim():
        return ()
    return tuple(round(u / l) if l else 0 for u, l in zip(unsharded, local.shape))


def record_shapes(model: "nn.Module", ids: "torch.Tensor") -> dict[str, list[tuple[int, ...]]]:
    """Each module's output shape, call by call, in one unsharded forward."""
    shapes: dict[str, list[tuple[int, ...]]] = {}
    handles = []
    for name, module in model.named_modules():
        if name:
            def hook(mod, args, output, name=name):
                tensor = _first_tensor(output)
                if tensor is not None:
                    shapes.setdefault(name, []).append(tuple(tensor.shape))

            handles.append(module.register_forward_hook(hook))
    try:
        model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return shapes


# --- the culprit ---------------------------------------------------------------------------------


def _odd_one(candidates: list[Observed], styles: Mapping[str, "ParallelStyle"]) -> str | None:
    """The entry whose output stands out from the others that meet: one layout against several
    alike; between two, the one whose style's layouts differ from torch's defaults."""
    from plangen.style_facts import layout_defaults

    patterns = Counter((o.dtensor, o.split) for o in candidates)
    if len(patterns) < 2 or any(o.split == () for o in candidates):
        return None
    (top, count), *rest = patterns.most_common()
    odd = [o for o in candidates if (o.dtensor, o.split) != top]
    if rest and rest[0][1] == count:  # a tie: the entry written against the defaults
        odd = [o for o in candidates if _differs_from_defaults(styles[o.key], layout_defaults)]
    keys = list(dict.fromkeys(o.key for o in odd))
    return keys[0] if len(keys) == 1 else None


def _differs_from_defaults(style: "ParallelStyle", layout_defaults) -> bool:
    from plangen.check.flow import _first

    defaults = layout_defaults(type(style).__name__)
    return any(_first(getattr(style, arg, None)) not in (None, want) for arg, want in defaults.items())


def attribute_failure(recorder: RunRecorder, styles: Mapping[str, "ParallelStyle"]) -> tuple[str | None, str | None]:
    """(the entry to blame, the module that failed) for a forward that raised.

    The planned modules that ran inside the failing module's call are what met there (q, k and v
    inside the attention); without any, what its inputs came from. The odd one out among them is
    to blame; where none stands out, the failing module's own entry (or its block's).
    """
    from plangen.check.run import key_for_module

    if not recorder.stack:
        return None, None
    module, inside = recorder.stack[-1]
    candidates = inside or recorder.producers(recorder.inputs.get(module, ()))
    culprit = _odd_one(candidates, styles)
    if culprit is None:
        culprit = recorder.covering.get(module) or key_for_module(styles, module)
    return culprit, module


def _first_failing_key(model: "nn.Module", styles: Mapping[str, "ParallelStyle"], mesh) -> str | None:
    """Apply the plan key by key to a fresh copy: the first key that raises is the culprit."""
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.plan_checks import resolve_tied_styles

    fresh = copy.deepcopy(model)
    for key, style in resolve_tied_styles(fresh, styles).items():
        try:
            parallelize_module(fresh, mesh, {key: style})
        except Exception:  # noqa: BLE001 - locating the failure, whatever it is
            return key
    return None


def _batch_split(recorder: RunRecorder) -> str | None:
    """The first planned module whose output is split on the batch, which TP never splits."""
    return next((o.key for o in recorder.order if o.split and o.split[0] > 1), None)


# --- the run ---------------------------------------------------------------------------------------


def run_on_fake_group(
    model: "nn.Module", styles: Mapping[str, "ParallelStyle"], tp_size: int, sequence_parallel: bool
) -> FakeRunFailure | None:
    """Apply ``styles`` to a copy of the shrunk ``model`` at ``tp_size``, run one forward and backward;
    None when every shape and every gradient is there. Raises RuntimeError where no fake group can
    be made (a real process group is running in this process)."""
    import sys

    # init_process_group installs an excepthook that prefixes "[rank0]:" to every traceback of the
    # process, and keeps it after the group is gone: verify's own process is not a rank.
    excepthook = sys.excepthook
    try:
        return _run_on_fake_group(model, styles, tp_size, sequence_parallel)
    finally:
        sys.excepthook = excepthook


def _run_on_fake_group(
    model: "nn.Module", styles: Mapping[str, "ParallelStyle"], tp_size: int, sequence_parallel: bool
) -> FakeRunFailure | None:
    """Apply ``styles`` to a copy of the shrunk ``model`` at ``tp_size``, run one forward and backward;
    None when every shape and every gradient is there. Raises RuntimeError where no fake group can
    be made (a real process group is running in this process)."""
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from plangen.check.run import next_token_loss, sample_batch
    from plangen.cost.measure import fake_process_group, quiet_fake_tensor_log
    from plangen.parallelize import parallelize_model

    reference, model = copy.deepcopy(model), copy.deepcopy(model)
    ids = sample_batch(reference, tp_size)
    with torch.enable_grad():
        shapes = record_shapes(reference, ids)
        ref_logits = reference(input_ids=ids).logits
        next_token_loss(ref_logits, ids).backward()
    index = ModuleIndex(model)
    covering = {path: key for key in styles for path in index.paths(key)}
    with fake_process_group(tp_size), quiet_fake_tensor_log(), _quiet_torch_logs(), warnings.catch_warnings(), \
            torch.random.fork_rng(devices=[]):  # fmt: skip
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", (1, tp_size), mesh_dim_names=("dp", "tp"))
        try:
            sharded = parallelize_model(
                model, mesh["dp"], mesh["tp"], torch.float32,
                sequence_parallel=sequence_parallel, custom_parallel_plan=dict(styles),
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - the plan could not be applied
            key = _first_failing_key(reference, styles, mesh["tp"])
            return FakeRunFailure("apply", one_line(error, part="first", with_type=True), key)
        recorder = RunRecorder(sharded, covering, shapes)
        try:
            with torch.enable_grad():
                logits = sharded(input_ids=ids).logits
        except Exception as error:  # noqa: BLE001
            key, module = attribute_failure(recorder, styles)
            return FakeRunFailure("forward", one_line(error, part="first", with_type=True), key, module)
        finally:
            recorder.remove()
        if tuple(logits.shape) != tuple(ref_logits.shape):
            key = _batch_split(recorder) or recorder.covering.get("lm_head")
            return FakeRunFailure("forward", f"logits have shape {list(logits.shape)}, not {list(ref_logits.shape)}", key)
        try:
            with torch.enable_grad():
                next_token_loss(logits, ids).backward()
        except Exception as error:  # noqa: BLE001
            return FakeRunFailure("backward", one_line(error, part="first", with_type=True), _batch_split(recorder))
        missing, shapes = _gradient_shapes(reference, sharded)
    from plangen.check.run import key_for_module

    if missing:
        return FakeRunFailure("backward", f"`{missing[0]}` gets no gradient", key_for_module(styles, missing[0].rpartition(".")[0]))
    if shapes:
        name, (got, want) = next(iter(shapes.items()))
        return FakeRunFailure(
            "backward", f"the gradient of `{name}` has shape {got}, not {want}", key_for_module(styles, name.rpartition(".")[0])
        )
    return None


def _gradient_shapes(reference: "nn.Module", sharded: "nn.Module") -> tuple[list[str], dict[str, tuple[list[int], list[int]]]]:
    """The parameters that lost their gradient, and those whose gradient has another (global) shape
    than the unsharded model's: a DTensor knows its global shape, so nothing is gathered."""
    grads = {name: p.grad for name, p in sharded.named_parameters() if p.grad is not None}
    missing, shapes = [], {}
    for name, param in reference.named_parameters():
        if param.grad is None:
            continue
        if name not in grads:
            missing.append(name)
        elif tuple(grads[name].shape) != tuple(param.grad.shape):
            shapes[name] = (list(grads[name].shape), list(param.grad.shape))
    return missing, shapes


@contextmanager
def _quiet_torch_logs():
    """torch logs a warning for each redistribution it finds slow and each collective the CPU group
    emulates: what a fake run does by design, not news for the plan's author."""
    import logging

    loggers = [logging.getLogger(name) for name in ("torch.distributed", "torch._logging", "torch.distributed.tensor")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def describe_module(path: str | None) -> str:
    return f" in `{generalize(path)}`" if path else ""

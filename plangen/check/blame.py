"""Which plan entry caused a failed run: hooks that record what each planned module really left.

A run that fails (level 2's on a fake process group, :mod:`plangen.check.fake_run`, and level 3's
shapes stage, :mod:`plangen.check.run`) is charged to the plan entry that caused it, not to the
module that crashed: :class:`RunRecorder` keeps the stack of running modules with the planned
modules that ran inside each call, and what each planned module's output really was (plain or
DTensor, which dims are split, against the unsharded model's shapes); :func:`attribute_failure`
picks the entry whose output stands apart from the others that meet where it failed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from plangen.check.autograd_graph import nearest_tags
from plangen.check.model_plan import parent_path
from plangen.model.module_tree import generalize

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


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
            observed = Observed(
                key, name, _is_dtensor(tensor), _split(tensor, unsharded[call] if call < len(unsharded) else None)
            )
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

        roots = [v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None]
        found: dict[str, Observed] = {}
        for observed in nearest_tags(roots, self.tags):
            found.setdefault(observed.path, observed)
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


def key_for_module(styles: Mapping[str, Any], path: str) -> str | None:
    """The plan key that governs ``path``: its own, else its nearest ancestor's, else a descendant's."""
    from plangen.model.module_tree import key_matches

    probe = path
    while probe:
        found = [key for key in styles if key_matches(key, probe)]
        if found:
            return found[-1]
        probe = parent_path(probe)
    below = [key for key in styles if key.startswith(generalize(path) + ".") or key.startswith(path + ".")]
    return below[0] if below else None


# --- the culprit ---------------------------------------------------------------------------------


def _odd_one(candidates: list[Observed], styles: Mapping[str, "ParallelStyle"]) -> str | None:
    """The entry whose output stands out from the others that meet: one layout against several
    alike; between two, the one whose style's layouts differ from torch's defaults."""
    patterns = Counter((o.dtensor, o.split) for o in candidates)
    if len(patterns) < 2 or any(o.split == () for o in candidates):
        return None
    (top, count), *rest = patterns.most_common()
    odd = [o for o in candidates if (o.dtensor, o.split) != top]
    if rest and rest[0][1] == count:  # a tie: the entry written against the defaults
        odd = [o for o in candidates if _differs_from_defaults(styles[o.key])]
    keys = list(dict.fromkeys(o.key for o in odd))
    return keys[0] if len(keys) == 1 else None


def _differs_from_defaults(style: "ParallelStyle") -> bool:
    from plangen.plan.style_table import STYLE_FACTS
    from plangen.styles.base import first_layout

    facts = STYLE_FACTS.get(type(style).__name__)
    defaults = {} if facts is None else facts.default_placements()
    return any(first_layout(getattr(style, arg, None)) not in (None, want) for arg, want in defaults.items())


def attribute_failure(recorder: RunRecorder, styles: Mapping[str, "ParallelStyle"]) -> tuple[str | None, str | None]:
    """(the entry to blame, the module that failed) for a forward that raised.

    The planned modules that ran inside the failing module's call are what met there (q, k and v
    inside the attention); without any, what its inputs came from. The odd one out among them is
    to blame; where none stands out, the failing module's own entry (or its block's).
    """
    if not recorder.stack:
        return None, None
    module, inside = recorder.stack[-1]
    # What met in the failing call; else what its inputs came from; else, where no autograd history
    # leads back (torch 2.11's functional collectives on the fake group leave none), what ran before
    # it in the nearest enclosing call (q, k and v before the attention's o_proj).
    candidates = (
        inside
        or recorder.producers(recorder.inputs.get(module, ()))
        or next((ran for _, ran in reversed(recorder.stack[:-1]) if ran), [])
    )
    culprit = _odd_one(candidates, styles)
    if culprit is None:
        culprit = recorder.covering.get(module) or key_for_module(styles, module)
    return culprit, module


def batch_split(recorder: RunRecorder) -> str | None:
    """The first planned module whose output is split on the batch, which TP never splits."""
    return next((o.key for o in recorder.order if o.split and o.split[0] > 1), None)

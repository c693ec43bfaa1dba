"""Tensors with one slice per head that the model builds for all heads outside the attention (ALiBi).

MPT and Bloom build one bias per head for every head once, in the module holding the decoder
layers, and hand it to every layer: attention sharded by heads must see only its own heads' bias.
Read from that module's forward source (:mod:`plangen.plans.packed_source`'s reader).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

from torch import nn

from plangen.plans.packed_source import _function, _Reader


@dataclass(frozen=True)
class PerHeadInput:
    """A tensor with one slice per head that the model builds for all heads and hands to every layer
    by keyword (MPT's ALiBi ``position_bias``): sliced to this rank's heads on dimension ``dim``."""

    keyword: str
    dim: int
    source: str


def _per_head_call(reader: _Reader, head_counts: set[int]) -> tuple[ast.Call, str] | None:
    for node in ast.walk(reader.tree):
        if not isinstance(node, ast.Call) or not reader.live(node):
            continue
        if isinstance(node.func, ast.Name) and hasattr(builtins, node.func.id):
            continue  # range(self.n_layers): a loop, not a tensor
        for arg in (*node.args, *(k.value for k in node.keywords)):
            if not isinstance(arg, ast.Attribute):
                continue
            try:
                value = reader.attribute(arg)
            except Exception:  # noqa: BLE001
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value in head_counts and _reaches_layers(reader, node):
                return node, f"{ast.unparse(node.func)}({ast.unparse(arg)}, ...)"
    return None


def _reaches_layers(reader: _Reader, call: ast.Call) -> bool:
    """The call's result is bound to a name handed to a layer (``block(hidden_states, position_bias=alibi)``:
    a call of a loop variable), not a reshape by a count that happens to equal the heads."""
    assign = reader.parents.get(id(call))
    if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name)):
        return False
    name = assign.targets[0].id
    for node in ast.walk(reader.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            values = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(v, ast.Name) and v.id == name for v in values):
                return True
    return False


def read_per_head_arguments(owner: nn.Module, head_counts: set[int]) -> PerHeadInput | str | None:
    """A call in ``owner``'s forward (the module holding the decoder layers) given a head count.

    ALiBi (MPT, Bloom) builds one bias per head for all heads outside the attention and hands it to
    every layer: attention sharded by heads must see only its own heads' bias. Where the layers take
    it by keyword and its builder takes only the module's constants (MPT), the builder is called on
    the meta device to find its head dimension (:class:`PerHeadInput`: sliced per rank); else the
    call, described (the attention then stays whole). Branches the module provably skips (``if
    self.use_alibi:`` with alibi off) are left out.
    """
    tree = _function(type(owner), "forward")
    if tree is None:
        return None
    reader = _Reader(owner, tree)
    found = _per_head_call(reader, head_counts)
    if found is None:
        return None
    call, source = found
    sliced = _sliceable(reader, call, head_counts)
    return PerHeadInput(sliced[0], sliced[1], source) if sliced is not None else source


def _sliceable(reader: _Reader, call: ast.Call, head_counts: set[int]) -> tuple[str, int] | None:
    import torch

    assign = reader.parents.get(id(call))
    if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    passed = [
        (n, k.arg) for n in ast.walk(reader.tree) if isinstance(n, ast.Call)
        for k in n.keywords if isinstance(k.value, ast.Name) and k.value.id == name and k.arg is not None
    ]
    positional = [n for n in ast.walk(reader.tree) if isinstance(n, ast.Call)
                  and any(isinstance(a, ast.Name) and a.id == name for a in n.args)]
    if len(passed) != 1 or positional:
        return None
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
        return None
    try:
        args = [reader.value(a) for a in call.args]
        kwargs = {k.arg: torch.device("meta") if k.arg == "device" else reader.value(k.value)
                  for k in call.keywords if k.arg is not None}
        with torch.device("meta"):
            built = getattr(reader.module, call.func.attr)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a builder that needs more than constants: not sliced
        return None
    if not isinstance(built, torch.Tensor):
        return None
    dims = [i for i, size in enumerate(built.shape) if size in head_counts]
    return (passed[0][1], dims[0]) if len(dims) == 1 else None

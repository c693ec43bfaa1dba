"""Tensors with one slice per head that the model builds for all heads outside the attention (ALiBi).

MPT and Bloom build one bias per head for every head once, in the module holding the decoder
layers, and hand it to every layer: attention sharded by heads must see only its own heads' bias.
Read from that module's forward source (:mod:`plangen.plans.source.packed`'s reader); where the
builder takes the model's attention mask (Bloom's ``[batch x heads, 1, seq]``), its layout is read
off the builder run on a probe mask.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from typing import Any

from torch import nn

from plangen.plan import PlanEntry
from plangen.plans.families.dims import ModelDims

from plangen.plans.source.packed import function_node, SourceReader


@dataclass(frozen=True)
class PerHeadInput:
    """A tensor with one slice per head that the model builds for all heads and hands to every layer
    by keyword (MPT's ALiBi ``position_bias``): sliced to this rank's heads on dimension ``dim``.

    ``batch_major``: ``dim`` stacks every (batch row, head) pair, batch row by batch row (Bloom's
    ``alibi``, ``[batch x heads, 1, seq]``), so no plain slice of it is one rank's heads: the
    attention's own input style keeps its heads' rows (``PrepareAttentionInput``'s ``batch_head_inputs``).
    """

    keyword: str
    dim: int
    source: str
    batch_major: bool = False


def _per_head_call(reader: SourceReader, head_counts: set[int]) -> tuple[ast.Call, str] | None:
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
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and value in head_counts
                and _reaches_layers(reader, node)
            ):
                return node, f"{ast.unparse(node.func)}({ast.unparse(arg)}, ...)"
    return None


def _reaches_layers(reader: SourceReader, call: ast.Call) -> bool:
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


def read_layers_head_input(model: nn.Module, layers_path: str, dims: ModelDims) -> PerHeadInput | str | None:
    """A call in the forward of the module holding the layers at ``layers_path`` that is given a head count (ALiBi)."""
    owner_path = layers_path.rpartition(".")[0]
    owner = model.get_submodule(owner_path) if owner_path else model
    return read_per_head_arguments(owner, {c for c in (dims.heads, dims.kv_heads) if c})


def read_per_head_arguments(owner: nn.Module, head_counts: set[int]) -> PerHeadInput | str | None:
    """A call in ``owner``'s forward (the module holding the decoder layers) given a head count.

    ALiBi (MPT, Bloom) builds one bias per head for all heads outside the attention and hands it to
    every layer: attention sharded by heads must see only its own heads' bias. Where the layers take
    it by keyword and its builder takes only the module's constants (MPT), the builder is called on
    the meta device to find its head dimension (:class:`PerHeadInput`: sliced per rank); where it
    takes the attention mask too (Bloom), on a probe mask, to find heads stacked with the batch rows
    (``batch_major``); else the call, described (the attention then stays whole). Branches the module provably skips (``if
    self.use_alibi:`` with alibi off) are left out.
    """
    tree = function_node(type(owner), "forward")
    if tree is None:
        return None
    reader = SourceReader(owner, tree)
    found = _per_head_call(reader, head_counts)
    if found is None:
        return None
    call, source = found
    sliced = _sliceable(reader, call, head_counts)
    return PerHeadInput(*sliced[:2], source, batch_major=sliced[2]) if sliced is not None else source


def _sliceable(reader: SourceReader, call: ast.Call, head_counts: set[int]) -> tuple[str, int, bool] | None:
    """(the layers' keyword, the head dim, whether it stacks the batch rows' heads), or None."""
    assign = reader.parents.get(id(call))
    if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    passed = [
        (n, k.arg)
        for n in ast.walk(reader.tree)
        if isinstance(n, ast.Call)
        for k in n.keywords
        if isinstance(k.value, ast.Name) and k.value.id == name and k.arg is not None
    ]
    positional = [
        n
        for n in ast.walk(reader.tree)
        if isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == name for a in n.args)
    ]
    if len(passed) != 1 or positional:
        return None
    if not (
        isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
    ):
        return None
    built = _build(reader, call, None)
    if built is not None:  # built from the module's constants alone (MPT): one dim is the heads
        dims = [i for i, size in enumerate(built.shape) if size in head_counts]
        return (passed[0][1], dims[0], False) if len(dims) == 1 else None
    return (passed[0][1], 0, True) if _batch_major(reader, call, head_counts) else None


def _build(reader: SourceReader, call: ast.Call, mask: Any) -> Any:
    """The builder's tensor, called with the module's constants (on the meta device) or, given a
    ``mask``, with it as the forward's ``attention_mask`` and float32 for any ``.dtype`` read (on the
    CPU: its values tell the layout); None where it needs anything else."""
    import torch

    forward_inputs = {a.arg for a in reader.tree.args.args}

    def value(node: ast.AST) -> Any:
        if (
            mask is not None
            and isinstance(node, ast.Name)
            and node.id == "attention_mask"
            and node.id in forward_inputs
        ):
            return mask
        if mask is not None and isinstance(node, ast.Attribute) and node.attr == "dtype":
            return torch.float32
        return reader.value(node)

    device = torch.device("cpu" if mask is not None else "meta")
    try:
        args = [value(a) for a in call.args]
        kwargs = {k.arg: device if k.arg == "device" else value(k.value) for k in call.keywords if k.arg is not None}
        with device:
            built = getattr(reader.module, call.func.attr)(*args, **kwargs)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a builder that needs more than constants: not sliced
        return None
    return built if isinstance(built, torch.Tensor) else None


def _batch_major(reader: SourceReader, call: ast.Call, head_counts: set[int]) -> bool:
    """Bloom's ``build_alibi_tensor(attention_mask, self.num_heads, ...)``: run on a probe mask of two
    rows that differ (the second left-padded), its first dim must stack the rows' heads batch row by
    batch row, each row's slice what the builder makes of that row alone."""
    import torch

    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    built = _build(reader, call, mask)
    heads = [h for h in head_counts if built is not None and built.dim() >= 1 and built.shape[0] == 2 * h]
    if len(heads) != 1 or any(2 * heads[0] == size for size in built.shape[1:]):
        return False
    rows = built.unflatten(0, (2, heads[0]))
    alone = [_build(reader, call, mask[row : row + 1]) for row in range(2)]
    return all(a is not None and a.shape[0] == heads[0] and torch.equal(rows[row], a) for row, a in enumerate(alone))


def read_passed_keyword(layer_cls: type, child: str, parameter: str) -> str | None:
    """The keyword by which ``layer_cls.forward`` hands its own argument ``parameter`` on to
    ``self.<child>`` (Bloom's block: ``self.self_attention(..., alibi=alibi)``), the same in every call
    of it; None where it is not passed so."""
    from plangen.plans.source.forward import self_calls

    keywords = {
        next((k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == parameter), None)
        for call, _ in self_calls(layer_cls).get(child, [])
    }
    return keywords.pop() if len(keywords) == 1 else None


def read_head_input_rows(
    layer_cls: type, child: str, block: object, call: object, head_input: PerHeadInput | str | None
) -> tuple[str, ...] | str | None:
    """How attention ``child`` of a layer gets its heads' slice of ``head_input``: () where the layer's
    input is sliced (MPT), the block's keywords for its input style to keep its heads' rows (Bloom's
    ``alibi``: the style reads the head count from the block's head attributes, so it needs them and
    the layer's call), or why it cannot (the attention then stays whole); None without one."""
    if not isinstance(head_input, PerHeadInput):
        return head_input
    if not head_input.batch_major:
        return ()
    keyword = read_passed_keyword(layer_cls, child, head_input.keyword)
    if keyword is None or call is None or not getattr(block, "head_attributes", ()):
        return f"{head_input.source}, every batch row's heads stacked on one dim, handed on by a call the reader cannot follow"
    return (keyword,)


def per_head_input_entry(layer: str, head_input: PerHeadInput) -> PlanEntry:
    """The layer's input, whole on every rank, cut to this rank's heads on its head dim (MPT)."""
    from torch.distributed.tensor import Replicate, Shard

    return PlanEntry(
        layer,
        "PrepareModuleInput",
        dict(
            input_layouts=None,
            desired_input_layouts=None,
            input_kwarg_layouts={head_input.keyword: Replicate()},
            desired_input_kwarg_layouts={head_input.keyword: Shard(head_input.dim)},
            use_local_output=True,
        ),
        "attention",
        f"{head_input.keyword} holds every head's values ({head_input.source}): each rank keeps its own heads' "
        "(a local slice, no communication)",
    )


def batch_head_rows_why(keywords: tuple[str, ...]) -> str:
    """What the attention's input style does with its ``batch_head_inputs``, for the entry's comment."""
    return (
        f"; its {', '.join(keywords)} (every head's, [batch x heads, ...]) cut to this rank's heads' rows "
        "(a local slice, no communication)"
    )

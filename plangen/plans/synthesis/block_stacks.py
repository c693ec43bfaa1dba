"""Decoder layers held as parallel lists of blocks, one list per kind, called in turn by the model's loop.

XLM's model has no decoder-layer class: it holds ``attentions``, ``layer_norm1``, ``ffns`` and
``layer_norm2``, lists of equal length, and its forward runs layer ``i`` as
``tensor = self.layer_norm1[i](tensor + self.attentions[i](tensor, mask, ...)[0])`` and so on.
:func:`~plangen.plans.synthesis.analysis.find_decoder_stack` finds one of those lists, whose items are then
blocks rather than layers holding blocks. :func:`find_block_stacks` tells that case (its first item
is recognised as attention and its owner holds more lists as long), and :func:`analyze_block_stacks`
walks the lists index by index as the layer they form: items of one value per hidden feature are the
residual stream's norms, the others are recognised as blocks, each entered where the owner's forward
calls ``self.<list>[i](...)`` (:func:`read_indexed_call`), as a layer's child is where the layer calls it.
"""

from __future__ import annotations

import ast

from torch import nn

from plangen.plans.synthesis.findings import BlockPart, Findings
from plangen.plans.source.forward import BlockCall, first_parameter, forward_tree, unpacked_outputs
from plangen.plans.families.core import ShardedBlock
from plangen.plans.families.dims import ModelDims, has_parameters, is_per_feature
from plangen.plans.families.registry import recognize_block


def read_indexed_call(owner_cls: type, list_name: str, item_cls: type) -> BlockCall | None:
    """How ``owner_cls.forward`` calls the items of its list ``self.<list_name>`` (``self.ffns[i](x)``);
    None when it does not, or not the same way at every call."""
    tree = forward_tree(owner_cls)
    found: set[BlockCall] = set()
    for parent in ast.walk(tree) if tree is not None else ():
        for call in ast.iter_child_nodes(parent):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Subscript)
                and isinstance(target := call.func.value, ast.Attribute)
                and target.attr == list_name
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                continue
            if any(isinstance(a, ast.Starred) for a in call.args):
                return None
            if call.args:
                found.add(BlockCall(len(call.args), None, unpacked_outputs(call, parent)))
                continue
            first = first_parameter(item_cls)
            if first is None or first not in {k.arg for k in call.keywords}:
                return None
            found.add(BlockCall(0, first, unpacked_outputs(call, parent)))
    return found.pop() if len(found) == 1 else None


def find_block_stacks(model: nn.Module, layers_path: str, layers: nn.ModuleList, dims: ModelDims) -> tuple[str, ...]:
    """The paths of the lists that hold the layers' blocks side by side (``layers_path`` among them, in
    their owner's order), where ``layers``' items are attention blocks; () for a list of decoder layers."""
    owner_path, _, _ = layers_path.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    lists = [
        name
        for name, child in owner.named_children()
        if isinstance(child, nn.ModuleList) and len(child) == len(layers) and all(has_parameters(c) for c in child)
    ]
    block = recognize_block(layers_path, layers[0], dims)
    if len(lists) < 2 or not (isinstance(block, ShardedBlock) and block.kind == "attention"):
        return ()
    return tuple(f"{owner_path}.{name}" if owner_path else name for name in lists)


def analyze_block_stacks(model: nn.Module, stacks: tuple[str, ...], dims: ModelDims, found: Findings) -> None:
    """Record each list's items, layer by layer: norms, sharded blocks, and what stays whole and why."""
    owner_path = stacks[0].rpartition(".")[0]
    owner = model.get_submodule(owner_path) if owner_path else model
    for index in range(len(model.get_submodule(stacks[0]))):
        for stack in stacks:
            name = stack.rpartition(".")[2]
            item, path = model.get_submodule(stack)[index], f"{stack}.{index}"
            call = read_indexed_call(type(owner), name, type(item))
            if is_per_feature(item, dims.hidden):
                found.add_norm(path, call)
                continue
            recognized = recognize_block(name, item, dims)
            if isinstance(recognized, ShardedBlock):
                found.blocks.append(BlockPart(path, recognized, call))
            else:
                found.keep(
                    path,
                    recognized.why,
                    recognized.kind if recognized.kind in ("attention", "mlp") else "other",
                    f"{path} is replicated ({recognized.why}) in a model that calls its blocks by index",
                )

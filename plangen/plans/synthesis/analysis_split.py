"""Blocks split over two sibling modules (the BERT family's ``attention.self`` then
``attention.output``, ``intermediate`` then ``output``) at concrete paths, and what else their
row-parallel half holds: the walk :func:`plangen.plans.synthesis.analysis.analyze_model` hands such parents to.
"""

from __future__ import annotations

from torch import nn

from plangen.plans.synthesis.findings import BlockPart, Findings
from plangen.plans.source.forward import read_block_call
from plangen.plans.families.core import ShardedBlock
from plangen.plans.families.dims import ModelDims, describe, has_parameters, is_per_feature, own_parameters
from plangen.plans.families.split import SplitBlock, recognize_split_blocks
from plangen.plans.source.split import read_helper_block_call
from plangen.plans.families.registry import recognize_block


def analyze_split(parent: nn.Module, path: str, block: SplitBlock, dims: ModelDims, found: Findings) -> None:
    """A block split over two children of ``parent`` (BERT): the block, and what else its row-parallel
    half holds (norms on the residual stream; the rest computed whole after the reduction)."""
    inner = parent.get_submodule(block.inner)
    found.blocks.append(BlockPart(path, block, read_helper_block_call(type(parent), block.inner, type(inner))))
    if block.inner_norm is not None:
        found.keep(
            f"{path}.{block.inner}.{block.inner_norm}",
            "norm inside the block, before its column-parallel projections: sees the whole input",
            block.kind,
        )
    outer = parent.get_submodule(block.outer)
    for name, child in outer.named_children():
        child_path = f"{path}.{block.outer}.{name}"
        if name == block.rowwise or not has_parameters(child):
            continue
        if is_per_feature(child, dims.hidden):
            _note_norm(outer, name, child, child_path, found)
            continue
        if _analyze_adapters(child, child_path, dims, found):
            continue
        found.keep(
            child_path,
            "runs after the row-parallel reduction, on the whole hidden state",
            block.kind,
            f"{child_path} is replicated on the residual stream and cannot take a sequence shard",
        )


def _note_norm(owner: nn.Module, name: str, child: nn.Module, path: str, found: Findings) -> None:
    """A per-feature norm beside a split block: on the residual stream, so under SP it takes the
    sequence shard its owner passes it first."""
    found.norms.append(path)
    call = read_block_call(type(owner), name, type(child))
    if call is None or call.positional < 1:
        found.sp_problems.append(f"cannot read that {path} takes the hidden state as its first argument")


def _analyze_adapters(container: nn.Module, path: str, dims: ModelDims, found: Findings) -> bool:
    """X-MOD's per-language adapters after the row-parallel reduction (a ``ModuleDict`` of MLPs, each
    run on the tokens of its language, ``hidden[mask]``): each its own column/row-parallel MLP on the
    whole hidden state, one all-reduce each. False, recording nothing, unless every member is such an MLP."""
    if not isinstance(container, (nn.ModuleDict, nn.ModuleList)) or not len(container):
        return False
    blocks = {name: recognize_block(name, member, dims) for name, member in container.named_children()}
    if not all(isinstance(b, ShardedBlock) and b.kind == "mlp" and not b.head_attributes for b in blocks.values()):
        return False
    for name, block in blocks.items():
        found.blocks.append(BlockPart(f"{path}.{name}", block, None))
    found.sp_problems.append(
        f"{path} runs on the tokens it selects from the whole hidden state, not on sequence shards"
    )
    return True


def split_blocks_by_child(parent: nn.Module, dims: ModelDims) -> dict[str, SplitBlock]:
    """The split blocks of ``parent`` by the names of the two children each covers."""
    return {name: block for block in recognize_split_blocks(parent, dims) for name in (block.inner, block.outer)}


def analyze_parent_of_split(parent: nn.Module, path: str, dims: ModelDims, found: Findings) -> bool:
    """A layer child holding a split block (BERT's ``attention``: ``self`` and ``output``): the block,
    and the child's other parts (per-feature norms). False, recording nothing, when it holds none."""
    splits = split_blocks_by_child(parent, dims)
    if own_parameters(parent) or not splits:
        return False
    for name, child in parent.named_children():
        child_path = f"{path}.{name}"
        if name in splits and splits[name].inner == name:
            analyze_split(parent, path, splits[name], dims, found)
        if name in splits or not has_parameters(child):
            continue
        if is_per_feature(child, dims.hidden):
            _note_norm(parent, name, child, child_path, found)
        else:
            found.keep(
                child_path,
                f"not recognised beside the split block ({describe(name, child)})",
                "other",
                f"{child_path} is replicated on the residual stream and cannot take a sequence shard",
            )
    return True

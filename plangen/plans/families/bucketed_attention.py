"""Recognise attention with a projection of one value per (bucket, head): ProphetNet's n-gram
self-attention, whose ``relative_pos_embeddings`` (``nn.Linear`` from the hidden size to
``num_buckets * num_heads``) is viewed as ``(..., self.num_buckets, self.num_attn_heads)``: bucket
major, head minor, so a rank's heads are a slice of every bucket (a packed projection of
``num_buckets`` equal parts). Its forward also unpacks its width from its input and reshapes by it
before and after its output projection, so it is handed this rank's slice of the hidden dimension
(as TrOCR's attention is: :mod:`plangen.plans.source.width`) and its output is gathered back.

Read from structure and source (never run); anything not followed answers None, and the block is
then judged by :func:`plangen.plans.families.core.recognize_attention` as before.

Plan entries for attention with a projection of one value per (bucket, head) (ProphetNet's
n-gram self-attention: :mod:`plangen.plans.families.bucketed_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any
import ast

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from plangen.plan import PlanEntry
from plangen.plans.families.dims import has_parameters, is_linear, ModelDims, own_parameters
from plangen.plans.layouts import SEQ
from plangen.plans.source.forward import BlockCall, forward_tree, read_input_readers
from plangen.plans.source.shape import read_shape_sizes
from plangen.plans.source.split import forward_and_helpers
from plangen.plans.layouts import hidden_state_layouts
from plangen.plans.families.block import FamilyBlock, UNREAD_CALL, Unplaced

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plans.synthesis.findings import BlockPart


@dataclass(frozen=True)
class BucketedAttentionBlock(FamilyBlock):
    """Attention sharded by heads whose ``bucketed`` projection packs ``buckets`` parts of all heads."""

    colwise: tuple[str, ...]  # q, k, v: read the block input
    bucketed: str  # one value per (bucket, head), bucket major
    buckets: int
    rowwise: str  # all heads back to the hidden size
    head_attributes: tuple[str, ...]  # the head counts its forward shapes by: made this rank's
    # Its mask arguments: built for all heads outside it (ProphetNet's decoder expands them to every
    # head, dimension 1), sliced to this rank's heads by the block's style.
    head_inputs: tuple[str, ...] = ()
    # A helper that projects its input transposed (rows in another order than the heads' index):
    # run for all heads, with the dimension of its result that counts them (plangen.styles.bucketed_attention).
    all_heads_helper: tuple[str, int] | None = None
    kind: str = "attention"

    def entries(self, part: BlockPart, sp: bool) -> list[PlanEntry]:
        assert part.call is not None
        desired = hidden_state_layouts(part.call, sp, desired=Shard(-1))
        return bucketed_attention_entries(part.path, self, part.call, desired, sp)

    def call_problem(self, call: BlockCall | None) -> Unplaced | None:
        # Its style takes its input: it must know the call.
        return Unplaced(f"attention shaped by its input's width {UNREAD_CALL}", "attention") if call is None else None


def _self_attribute(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@lru_cache(maxsize=None)
def read_bucket_major_view(block_cls: type, child: str) -> tuple[str, str] | None:
    """``(A, B)`` where the forward or a helper it names assigns ``x = self.<child>(...)`` and views
    ``x`` as ``x.view(<shape> + (self.A, self.B))`` (ProphetNet: ``num_buckets``, ``num_attn_heads``);
    None unless every view of such an ``x`` by a shape ending in two attributes says the same (later
    reshapes of the permuted values, ``reshape(shape + (-1,))``, are not views of the projection's layout)."""
    found: set[tuple[str, str]] = set()
    for tree in forward_and_helpers(block_cls):
        outputs = {
            n.targets[0].id
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and isinstance(n.value, ast.Call)
            and _self_attribute(n.value.func) == child
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("view", "reshape")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in outputs
                and len(node.args) == 1
            ):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and isinstance(arg.right, ast.Tuple):
                names = [_self_attribute(e) for e in arg.right.elts]
                if len(names) == 2 and None not in names:
                    found.add((names[0], names[1]))  # type: ignore[arg-type]
    return found.pop() if len(found) == 1 else None


def read_transposed_projection_helper(block_cls: type, child: str, heads: str) -> tuple[str, int] | None:
    """``(method, dim)``: the helper of ``block_cls.forward`` that calls ``self.<child>`` on its first
    argument transposed (``hidden_states = hidden_states.transpose(1, 2)``, ProphetNet's predict
    stream), and the position of ``self.<heads>`` in the ``view`` of the value it returns."""
    for tree in forward_and_helpers(block_cls)[1:]:
        params = [a.arg for a in tree.args.args[1:]]
        if not params:
            continue
        transposed = any(
            isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id == params[0]
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Attribute)
            and n.value.func.attr in ("transpose", "permute")
            and isinstance(n.value.func.value, ast.Name)
            and n.value.func.value.id == params[0]
            for n in ast.walk(tree)
        )
        projects = any(
            isinstance(n, ast.Call)
            and _self_attribute(n.func) == child
            and n.args
            and isinstance(n.args[0], ast.Name)
            and n.args[0].id == params[0]
            for n in ast.walk(tree)
        )
        returns = [n.value for n in ast.walk(tree) if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)]
        if not (transposed and projects and len(returns) == 1):
            continue
        views = [
            n.value
            for n in tree.body
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id == returns[0].id  # type: ignore[union-attr]
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Attribute)
            and n.value.func.attr == "view"
        ]
        dims = [i for i, a in enumerate(views[-1].args) if _self_attribute(a) == heads] if views else []  # type: ignore[attr-defined]
        if len(dims) == 1:
            return tree.name, dims[0]
    return None


def recognize_bucketed_attention(block: nn.Module, dims: ModelDims) -> BucketedAttentionBlock | None:
    """ProphetNet's n-gram self-attention (see the module docstring), or None.

    Its head count is its own (``self.<B>`` of the bucketed view): ProphetNet's decoder has
    ``num_decoder_attention_heads``, which the config's ``num_attention_heads`` (the encoder's) is not."""
    h = dims.hidden
    readers = read_input_readers(type(block))
    if readers is None or own_parameters(block):
        return None
    children = {name: c for name, c in block.named_children() if has_parameters(c)}
    if len(children) != 5 or not all(is_linear(c) for c in children.values()):
        return None
    reading = [name for name in children if name in readers]
    widths = {children[name].out_features for name in reading}
    if len(reading) != 3 or len(widths) != 1 or any(children[name].in_features != h for name in reading):
        return None
    width = widths.pop()  # all heads' width
    outputs = [
        name for name, m in children.items() if name not in readers and (m.in_features, m.out_features) == (width, h)
    ]
    rest = [name for name in children if name not in readers and name not in outputs]
    if len(outputs) != 1 or len(rest) != 1 or children[rest[0]].in_features != h:
        return None
    layout = read_bucket_major_view(type(block), rest[0])
    buckets, n = (getattr(block, a, None) for a in layout) if layout is not None else (None, None)
    if (
        not (isinstance(buckets, int) and isinstance(n, int))
        or n < 1
        or buckets * n != children[rest[0]].out_features
        or width % n
    ):
        return None
    shapes = read_shape_sizes(type(block))
    if shapes is None or not shapes.input_width:
        return None  # handed the whole input, the plain attention layout would do: not this recogniser's
    counts = {
        layout[1],
        *(a for a in shapes.attributes if getattr(block, a, None) in (n, width) and a not in shapes.last),
    }  # type: ignore[index]
    tree = forward_tree(type(block))
    masks = tuple(a.arg for a in (*tree.args.args, *tree.args.kwonlyargs) if a.arg.endswith("mask")) if tree else ()
    helper = read_transposed_projection_helper(type(block), rest[0], layout[1])  # type: ignore[index]
    # The head count the helper's view reads first: the style makes the first head attribute global for it.
    ordered = (layout[1], *sorted(counts - {layout[1]}))  # type: ignore[index]
    return BucketedAttentionBlock(tuple(reading), rest[0], buckets, outputs[0], ordered, masks, helper)


def bucketed_attention_entries(
    path: str, block: BucketedAttentionBlock, call: BlockCall, prepared: dict[str, Any], sp: bool
) -> list[PlanEntry]:
    """The block handed this rank's slice of the hidden dimension (``prepared``: its input's layouts,
    desired ``Shard(-1)``), q/k/v and the bucketed projection column-parallel on it (each all-gathers
    it), the output projection reduce-scattered back to the slice, and the block's output gathered.
    (No class with this block has a sequence-parallel plan yet: under SP the output would be kept
    sequence-sharded, unproven.)"""
    others = (call.outputs or 1) - 1
    gathered = SEQ if sp else Replicate()
    sliced = dict(input_layouts=Shard(-1), use_local_output=True)
    counts = ", ".join(block.head_attributes)
    style, helper = "PrepareAttentionInputOutput", {}
    if block.all_heads_helper is not None:
        style, helper = (
            "BucketedAttentionInputOutput",
            dict(
                bucketed=block.bucketed,
                all_heads_helper=block.all_heads_helper[0],
                all_heads_dim=block.all_heads_helper[1],
            ),
        )
    entries = [
        PlanEntry(
            path,
            style,
            dict(
                **prepared,
                use_local_input=True,
                output_layouts=(Shard(-1), *(None,) * others),
                desired_output_layouts=(gathered, *(Replicate(),) * others),
                use_local_output=True,
                head_attributes=block.head_attributes,
                head_inputs=block.head_inputs,
                **helper,
            ),
            "attention",
            "this rank's slice of the hidden dimension, the width its forward unpacks and reshapes by before and after "
            f"{block.rowwise}; its output all-gathered back (its other outputs pass through); {counts} made this rank's"
            + (
                f"; its per-head {', '.join(block.head_inputs)} sliced to this rank's heads"
                if block.head_inputs
                else ""
            )
            + (
                f"; {block.all_heads_helper[0]} (its input transposed before {block.bucketed}) run for all heads, "
                f"{block.bucketed}'s output all-gathered for it"
                if block.all_heads_helper
                else ""
            ),
        ),
    ]
    entries += [
        PlanEntry(
            f"{path}.{name}",
            "ColwiseParallel",
            dict(**sliced, output_layouts=Shard(-1)),
            "attention",
            "column-parallel: all-gathers the input slice, computes this rank's heads",
        )
        for name in block.colwise
    ]
    entries.append(
        PlanEntry(
            f"{path}.{block.bucketed}",
            "FusedColwiseParallel",
            dict(part_sizes=(1,) * block.buckets, **sliced),
            "attention",
            f"one value per (bucket, head), bucket major: {block.buckets} parts of all heads, "
            "re-laid out so each rank holds its heads of every bucket",
        )
    )
    entries.append(
        PlanEntry(
            f"{path}.{block.rowwise}",
            "RowwiseParallel",
            dict(input_layouts=Shard(-1), output_layouts=Shard(-1), use_local_output=True),
            "attention",
            "row-parallel: the partial sums reduce-scattered to this rank's slice of the hidden dimension",
        )
    )
    return entries

"""Experts the decoder layer calls itself (Gemma 4's MoE form), under sequence parallelism.

Gemma 4's 26B-A4B layer routes its residual stream to packed experts beside the dense MLP, with no
block around them::

    hidden_states_flat = residual.reshape(-1, residual.shape[-1])
    _, top_k_weights, top_k_index = self.router(hidden_states_flat)
    hidden_states_2 = self.pre_feedforward_layernorm_2(hidden_states_flat)
    hidden_states_2 = self.experts(hidden_states_2, top_k_index, top_k_weights)
    hidden_states_2 = hidden_states_2.reshape(residual.shape)
    hidden_states_2 = self.post_feedforward_layernorm_2(hidden_states_2)

Under SP the residual is a ``Shard(1)`` DTensor and its flattening a strided shard of the tokens.
The router and the experts' input norm take the whole flattened sequence, all-gathered once for both
(``SharedInputGather`` on the layer; they compute whole on every rank, as without SP), the experts leave their partial sum as a
``Partial`` DTensor, and the norm on their output (``SequenceParallel``, as every norm on the
residual stream) reduce-scatters it into this rank's sequence shard: the one reduce-scatter a
row-parallel MLP has. In backward the experts leave their input's gradient partial
(``sum_input_grad=False``) and the shared gather's backward reduce-scatters it, with the router's
whole gradient counted once, into the sequence shards (``partial_readers``): what a column-parallel
block's gather does, where summing it over TP first moved B·S·H per rank twice over.
:func:`read_experts_norms` reads which norms those are from the layer's forward.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Iterator

from torch.distributed.tensor import Partial, Replicate

from plangen.styles.experts import EXPERTS_PARALLEL_WHY
from plangen.plan import PlanEntry
from plangen.plans.source.forward import forward_tree, self_call_name

_VIEWS = frozenset({"reshape", "view", "to", "contiguous"})


def _in_order(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested bodies (``if``, ``with``) in the order they appear."""
    for statement in statements:
        yield statement
        for field in ("body", "orelse", "finalbody"):
            body = getattr(statement, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield from _in_order(body)


def _strip_views(expr: ast.AST) -> ast.AST:
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _VIEWS:
        expr = expr.func.value
    return expr


@lru_cache(maxsize=None)
def read_experts_norms(layer_cls: type, experts: str) -> tuple[str | None, str | None]:
    """(the child whose output ``layer_cls.forward`` hands ``self.<experts>`` as its first argument,
    the child it applies next to the experts' output), through reshapes; None where not read."""
    tree = forward_tree(layer_cls)
    if tree is None:
        return None, None
    producer: dict[str, str | None] = {}  # variable -> the child whose output it holds (views aside)
    before = after = None
    for statement in _in_order(tree.body):
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            continue
        value = _strip_views(statement.value)
        child = self_call_name(value)
        if child is None:
            producer[statement.targets[0].id] = producer.get(value.id) if isinstance(value, ast.Name) else None
            continue
        assert isinstance(value, ast.Call)
        first = value.args[0] if value.args else None
        fed_by = producer.get(first.id) if isinstance(first, ast.Name) else None
        if child == experts:
            before = fed_by
        elif fed_by == experts and after is None:
            after = child
        producer[statement.targets[0].id] = child
    return before, after


def layer_experts_entries(
    path: str, routers: tuple[str, ...], input_norm: str | None, sequence_parallel: bool
) -> list[PlanEntry]:
    """The experts at ``path`` (their layer calls them), and under SP what feeds them the whole sequence."""
    if not sequence_parallel:
        return [
            PlanEntry(
                path,
                "ExpertsParallel",
                dict(output_layouts=Replicate()),
                "mlp",
                f"{EXPERTS_PARALLEL_WHY}, all-reduced here (the layer calls them itself)",
            )
        ]
    layer = path.rpartition(".")[0]
    entries = [
        PlanEntry(
            path,
            "ExpertsParallel",
            dict(
                output_layouts=Partial(),
                use_local_output=False,
                **({} if input_norm is None else dict(sum_input_grad=False)),
            ),
            "mlp",
            f"{EXPERTS_PARALLEL_WHY}; their sum left partial, reduce-scattered by the norm on it into the "
            "sequence-sharded residual"
            + ("; their input's gradient left partial, reduce-scattered by the layer's gather" if input_norm else ""),
        )
    ]
    readers = (*routers, *((input_norm,) if input_norm else ()))
    entries.append(
        PlanEntry(
            layer,
            "SharedInputGather",
            dict(readers=readers, **({} if input_norm is None else dict(partial_readers=(input_norm,)))),
            "mlp",
            f"{' and '.join(readers)} take the flattened residual whole, all-gathered once for both (B·S·H), and "
            f"compute on every token, as without SP"
            + (
                f"; {input_norm}'s gradient (the experts' input's) partial, the gather's backward one reduce-scatter"
                if input_norm
                else ""
            ),
        )
    )
    return entries


__all__ = ["layer_experts_entries", "read_experts_norms"]

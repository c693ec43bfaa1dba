"""What a style needs of the module it is applied to, asked of the style itself.

Each plangen style answers for itself (:meth:`plangen.styles.base.PlangenStyle.fit_problem`, PG203,
and :meth:`~plangen.styles.base.PlangenStyle.required_dims`, PG204); torch's own styles are answered
by torch's column- and row-wise rules (:mod:`plangen.styles.base`). What every module-preparing
style needs besides (its keyword layouts name parameters of the module's forward) is asked here.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput, PrepareModuleInputOutput

from plangen.styles.base import PlangenStyle, linear_required_dims, sharding_fit_problem


def is_sequence_split(placement: object) -> bool:
    from torch.distributed.tensor import Shard

    return isinstance(placement, Shard) and placement.dim in (1, -2)


def suggest_key(pattern: str, style: str) -> str:
    return f'`"{pattern}": {style}`'


def fit_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    """Why ``style`` cannot be applied to ``module`` (PG203), None when it fits."""
    problem = style.fit_problem(module) if isinstance(style, PlangenStyle) else sharding_fit_problem(style, module)
    return problem if problem is not None else _keyword_layout_problem(style, module)


def _keyword_layout_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    prepare = style.prepare_module_input if isinstance(style, PrepareModuleInputOutput) else style
    if not isinstance(prepare, PrepareModuleInput):
        return None
    layouts = {**(prepare.input_kwarg_layouts or {}), **(prepare.desired_input_kwarg_layouts or {})}
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    named = [p for p, v in parameters.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    unknown = [k for k in layouts if k not in named]
    if unknown:
        return (
            f"`{type(style).__name__}` lays out keyword argument `{unknown[0]}`, but `{type(module).__name__}.forward`"
            f" has no such parameter (it takes {', '.join(named) or 'none'}): the layout would never be applied"
        )
    return None


def required_dims(style: ParallelStyle, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
    """(what, size, parts) the style splits into ``parts`` x TP equal local shards of a plain tensor.

    DTensor handles uneven shards as long as a tensor stays a DTensor, or is gathered: a vocabulary
    split by a row-parallel embedding or a column-parallel head with DTensor logits needs no
    divisibility. A shard handed on as a plain local tensor, or read from one, does.
    """
    if isinstance(style, PlangenStyle):
        return style.required_dims(module, tp)
    return linear_required_dims(style, module)

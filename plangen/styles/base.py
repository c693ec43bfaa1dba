"""What every plangen style is, and the registry that finds a style by the name a plan writes.

Plans name their styles (``"FusedColwiseParallel"``) so that a plan can be data, rendered and
checked without torch. Every plangen style subclasses :class:`PlangenStyle` beside the torch style
it extends, and carries its own truth:

- ``facts`` (a :class:`plangen.plan.style_facts.StyleFacts`): what it shards, what it takes and leaves;
- :meth:`PlangenStyle.fit_problem`: why it cannot be applied to a module (PG203), None when it fits;
- :meth:`PlangenStyle.required_dims`: the sizes it cuts into local shards of plain tensors (PG204).

Defining a subclass with ``facts`` of its own registers it in :data:`STYLE_CLASSES`; torch's own
styles are registered with their facts by :mod:`plangen.styles.linear`. The torch-free table that
``plangen verify --static`` and ``plangen init`` read (:mod:`plangen.plan.style_table`) is generated from
this registry by :mod:`plangen.styles.table`, and a test keeps it current.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

if TYPE_CHECKING:  # pragma: no cover
    from plangen.plan import Plan

from plangen.plan.style_facts import (
    EMBEDDING,
    LINEAR,
    PLANGEN_STYLES,
    StyleFacts,
)

# Every style a plan may name, by the class name plan files write; filled as the classes are defined.
STYLE_CLASSES: dict[str, type[ParallelStyle]] = {}
# The facts of each registered style, with its name and the module plan files import it from.
STYLE_FACTS: dict[str, StyleFacts] = {}


def register_style(cls: type[ParallelStyle], facts: StyleFacts, module: str) -> None:
    """Make ``cls`` a style plans may name, with ``facts``; a second class of the same name is refused."""
    name = cls.__name__
    if STYLE_CLASSES.get(name, cls) is not cls:
        raise TypeError(f"two parallel styles named {name!r}: {STYLE_CLASSES[name].__module__} and {cls.__module__}")
    STYLE_CLASSES[name] = cls
    STYLE_FACTS[name] = dataclasses.replace(facts, name=name, module=module)


class PlangenStyle(ParallelStyle):
    """The base of plangen's styles: a subclass whose body sets ``facts`` is registered by being defined.

    A subclass without ``facts`` of its own (a user's variant of a plangen style) is not registered
    and is treated as its nearest registered ancestor (:func:`facts_of`).
    """

    facts: ClassVar[StyleFacts]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "facts" in cls.__dict__:
            register_style(cls, cls.facts, PLANGEN_STYLES)

    def fit_problem(self, module: nn.Module) -> str | None:
        """Why this style cannot be applied to ``module`` (PG203), None when it fits.

        The default is torch's column- and row-wise rule for the module kinds ``facts`` shards."""
        return sharding_fit_problem(self, module)

    def required_dims(self, module: nn.Module, tp: int) -> list[tuple[str, int, int]]:
        """``(what, size, parts)``: sizes this style splits into ``parts`` x ``tp`` equal local shards
        of plain tensors (PG204). DTensor handles uneven shards while a tensor stays a DTensor; a
        shard handed on, or read, as a plain local tensor must be even.

        The default is torch's column- and row-wise rule on a Linear, Conv1D or Embedding."""
        return linear_required_dims(self, module)


def build_style(name: str, kwargs: Mapping[str, Any] | None = None) -> ParallelStyle:
    """Instantiate the registered style ``name`` with ``kwargs``; unknown names list the known ones."""
    try:
        cls = STYLE_CLASSES[name]
    except KeyError:
        known = ", ".join(sorted(STYLE_CLASSES))
        raise ValueError(f"unknown parallel style {name!r}; known styles: {known}") from None
    return cls(**dict(kwargs or {}))


def build_parallel_styles(plan: Plan) -> dict[str, ParallelStyle]:
    """Turn plan data into the ``{pattern: ParallelStyle}`` dict that ``parallelize_module`` takes."""
    return {e.pattern: build_style(e.style, e.kwargs) for e in plan.entries}


# --- questions about a style object ------------------------------------------------------------


def facts_of(style: ParallelStyle) -> StyleFacts | None:
    """The facts of ``style``'s nearest registered class (a user's subclass of ColwiseParallel
    shards like it); None for a style unrelated to every registered one."""
    for cls in type(style).__mro__:
        if STYLE_CLASSES.get(cls.__name__) is cls:
            return STYLE_FACTS[cls.__name__]
    return None


def is_sharding(style: ParallelStyle) -> bool:
    """The style splits the module's weights across TP ranks; every other style keeps them whole."""
    facts = facts_of(style)
    return facts is not None and facts.shards


def style_kind(style: ParallelStyle) -> str:
    """The word the level-2 rules group styles by (:attr:`StyleFacts.role`), ``other`` if unknown."""
    facts = facts_of(style)
    return facts.role if facts is not None else "other"


# --- layouts, in the few words the rules need ---------------------------------------------------


def first_layout(layouts: Any) -> object:
    return layouts[0] if isinstance(layouts, tuple) and layouts else layouts


def placement_text(placement: object) -> str:
    if isinstance(placement, Shard):
        return f"Shard({placement.dim})"
    return f"{type(placement).__name__}()" if placement is not None else "None"


def leaves_local_shard(style: ParallelStyle) -> bool:
    """The style hands on a plain local shard of its output (no DTensor that knows the global shape).
    A packed column-wise style's output layout is always torch's ``Shard(-1)``: the same rule."""
    return isinstance(first_layout(style.output_layouts), Shard) and bool(style.use_local_output)  # type: ignore[attr-defined]


def takes_local_shard(style: ParallelStyle) -> bool:
    """The style reads a plain input as this rank's shard (``DTensor.from_local`` assumes even shards).
    A packed row-wise style's input layout is always torch's ``Shard(-1)``: the same rule."""
    return isinstance(first_layout(style.input_layouts), Shard)  # type: ignore[attr-defined]


# --- the needs of torch's column- and row-wise styles, every style's default ---------------------


def sharding_fit_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    """Whether a column- or row-wise style fits ``module``: torch shards nn.Linear and nn.Embedding,
    each only where ``facts`` says the style splits that kind; None for a style that keeps weights."""
    if not is_sharding(style):
        return None
    name, what = type(style).__name__, type(module).__name__
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        return f"`{name}` shards nn.Linear and nn.Embedding only, not {what} (torch raises NotImplementedError)"
    kinds = facts_of(style).shard_dim  # type: ignore[union-attr] - is_sharding: the facts are known
    if (EMBEDDING if isinstance(module, nn.Embedding) else LINEAR) not in kinds:
        only = " and ".join(f"nn.{'Embedding' if k == EMBEDDING else 'Linear'}" for k in kinds)
        return f"`{name}` shards {only} only, not {what}"
    if isinstance(style, RowwiseParallel) and isinstance(module, nn.Embedding) and takes_local_shard(style):
        return (
            f"`{name}` on an Embedding reads token ids: they must come in whole (input_layouts=Replicate()); "
            f"with input_layouts={placement_text(first_layout(style.input_layouts))} every rank's ids are "
            "gathered into a longer sequence"
        )
    return None


def linear_only_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    """For a style that shards (or hooks) an nn.Linear and nothing else."""
    if isinstance(module, nn.Linear):
        return None
    return f"`{type(style).__name__}` shards nn.Linear only, not {type(module).__name__}"


def own_parameters_problem(style: ParallelStyle, module: nn.Module) -> str | None:
    """For a style that reduces the gradients of the module's own parameters."""
    if any(True for _ in module.parameters(recurse=False)):
        return None
    return f"`{type(style).__name__}` reduces parameter gradients, but {type(module).__name__} has no parameters of its own"


def head_count_dims(module: nn.Module, attributes: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """The head counts a block reshapes by (count / TP): each must divide."""
    from plangen.model.module_facts import head_count_owner

    values = [(a, getattr(*head_count_owner(module, a), None)) for a in attributes]
    return [(a, v, 1) for a, v in values if isinstance(v, int) and not isinstance(v, bool)]


def linear_required_dims(style: ParallelStyle, module: nn.Module) -> list[tuple[str, int, int]]:
    """A column-parallel style leaving a plain local shard needs its output features to divide, a
    row-parallel one reading one its input features (each packed part's where ``split_factor``); a
    column-parallel embedding handing on plain shards its embedding dim."""
    from plangen.model.module_facts import is_conv1d

    split = getattr(style, "split_factor", 1)
    if isinstance(module, nn.Linear) or is_conv1d(module):
        out_features, in_features = (
            (module.nf, module.nx) if is_conv1d(module) else (module.out_features, module.in_features)
        )
        if isinstance(style, ColwiseParallel) and leaves_local_shard(style):
            return [("out_features", out_features, split)]
        if isinstance(style, RowwiseParallel) and takes_local_shard(style):
            return [("in_features", in_features, split)]
    if isinstance(module, nn.Embedding) and isinstance(style, ColwiseParallel) and leaves_local_shard(style):
        return [("embedding_dim", module.embedding_dim, 1)]
    return []

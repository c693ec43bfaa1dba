"""What level 2 of ``plangen verify`` works on: the plan against its model, the findings, the rule base.

:class:`ModelPlan` is a loaded plan against a meta-device model, with the lookups every level-2 rule
needs (which modules each key selects, which key covers each module, what is sharded below a block).
:class:`ModelRule` is the base of the level-2 rules (:mod:`plangen.check.rules.model.shapes`,
:mod:`plangen.check.rules.model.regions`) and of level 3's codes (:mod:`plangen.check.rules.run`): a
code with its story, and findings that sit on plan keys. The driver that loads files and turns
findings into diagnostics is :mod:`plangen.check.model`. Nothing here imports torch at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Literal, Mapping

from plangen.check.rule import Rule, Severity
from plangen.model.module_tree import ModuleIndex

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from plangen.check.shrunk import ShrunkModel
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass(frozen=True)
class ModelFinding:
    """What a level-2 rule reports: a code, a message, and the plan key it concerns (None: the plan)."""

    code: str
    message: str
    key: str | None = None
    at: Literal["key", "value"] = "key"
    severity: Severity = "error"  # the rule's


class ModelRule(Rule):
    """A code whose findings sit on plan keys, with its story; level-2 rules also ``check`` a
    :class:`ModelPlan`. Level 3's codes subclass it for :meth:`finding` only (run.py emits them).
    ``runs_on_shrunk_model``: the rule runs the shrunk model, after every other rule of the level
    and only where they found no error (it names what they cannot see, never the same fault twice)."""

    level = "model"
    runs_on_shrunk_model: ClassVar[bool] = False

    @classmethod
    def finding(cls, message: str, key: str | None = None, at: Literal["key", "value"] = "key") -> ModelFinding:
        return ModelFinding(cls.code, message, key, at, cls.severity)

    def check(self, plan: ModelPlan) -> Iterator[ModelFinding]:
        raise NotImplementedError


def parent_path(path: str) -> str:
    return path.rpartition(".")[0]


@dataclass
class ModelPlan:
    """A loaded plan against a meta model: what every level-2 rule reads.

    ``styles`` are the plan's styles after the runtime's tied-embedding resolution (what
    ``parallelize_model`` applies); ``written`` the keys as the file wrote them.
    """

    model: "nn.Module"
    tp_size: int
    sequence_parallel: bool | None  # None: not declared; the rules infer it from the plan
    written: Mapping[str, "ParallelStyle"]
    styles: Mapping[str, "ParallelStyle"]
    replicated_on_purpose: list[str] = field(default_factory=list)
    source: Any = None  # the resolved model spec (plangen.model.resolve.ResolvedModel); None: no shrunk model
    target: str = "plangen"  # the runtime the plan is handed to (plangen.plan.targets)

    @cached_property
    def shrunk(self) -> "ShrunkModel | None":
        """The shrunk model of the same architecture at this TP size, and the plan's keys that
        select a module of it; None where it cannot be built or run (the checks that need it skip)."""
        from plangen.check.shrunk import build_shrunk_model

        if self.source is None:
            return None
        return build_shrunk_model(self.source, self.tp_size, self.written)

    @cached_property
    def modules(self) -> dict[str, "nn.Module"]:
        return {name: module for name, module in self.model.named_modules() if name}

    @cached_property
    def matches(self) -> dict[str, list[str]]:
        """Key → the module paths it selects (torch's rule: per dotted segment, fnmatch)."""
        index = ModuleIndex(self.model)
        return {key: index.paths(key) for key in self.styles}

    @cached_property
    def covering(self) -> dict[str, str]:
        """Module path → the key whose style it gets (the last matching key, as the runtime decides)."""
        found: dict[str, str] = {}
        for key, names in self.matches.items():
            for name in names:
                found[name] = key
        return found

    def style_of(self, path: str) -> "ParallelStyle | None":
        key = self.covering.get(path)
        return None if key is None else self.styles[key]

    @cached_property
    def laid_out_by_parent(self) -> dict[str, str]:
        """Path of a child that its parent's style lays out itself → the role it plays there
        (:attr:`plangen.plan.style_facts.StyleFacts.lays_out_children`: a Mamba mixer's projections)."""
        from plangen.styles.base import facts_of

        found: dict[str, str] = {}
        for path, key in self.covering.items():
            facts = facts_of(self.styles[key])
            for child, role in (facts.lays_out_children if facts is not None else {}).items():
                if f"{path}.{child}" in self.modules:
                    found[f"{path}.{child}"] = role
        return found

    @cached_property
    def sharded(self) -> set[str]:
        """Paths of the modules whose weights a column- or row-parallel style shards (or their parent's style)."""
        from plangen.styles.base import is_sharding

        return {path for path, key in self.covering.items() if is_sharding(self.styles[key])} | set(
            self.laid_out_by_parent
        )

    @cached_property
    def styles_below(self) -> dict[str, set[str]]:
        """Module path → the kinds (``colwise``, ``rowwise``, ``gather_output``...) of the styles
        on the modules under it, so "is anything under this block row-parallel" is one lookup.
        A column-parallel style that gathers a feature-sharded input (``input_layouts=Shard(-1)``, the
        stable variant's ``o_proj``, :mod:`plangen.plans.variants`) also counts as ``gather_input``:
        like a row-parallel one, it consumes the shards a column-parallel projection leaves."""
        from plangen.styles.base import style_kind

        below: dict[str, set[str]] = {}
        for path, key in self.covering.items():
            style = self.styles[key]
            kinds = {style_kind(style)}
            if kinds == {"colwise"} and _gathers_feature_shards(style):
                kinds.add("gather_input")
            parts = path.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                below.setdefault(".".join(parts[:cut]), set()).update(kinds)
        for path, role in self.laid_out_by_parent.items():
            parts = path.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                below.setdefault(".".join(parts[:cut]), set()).add(role)
        return below

    @cached_property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    @property
    def model_name(self) -> str:
        return type(self.model).__name__


def _gathers_feature_shards(style: "ParallelStyle") -> bool:
    from torch.distributed.tensor import Shard

    layouts = getattr(style, "input_layouts", None)
    layout = layouts[0] if isinstance(layouts, tuple) and layouts else layouts
    return isinstance(layout, Shard) and layout.dim == -1

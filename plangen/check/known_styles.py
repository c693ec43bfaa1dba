"""What the static checks know about parallel styles and placements, written down without torch.

Level 1 must not import torch (it is slow and plan files are checked before anything runs). Each
style's keyword parameters and where a plan imports it from come from :mod:`plangen.plan.style_table`,
generated from the style classes themselves (a test keeps it current); the placements, torch's
modules and transformers' style strings are written down here, and tests compare them with torch
and with :mod:`plangen.styles`.
"""

from __future__ import annotations

from dataclasses import dataclass

from plangen.plan.style_facts import PLACEMENT, TORCH_STYLES, StyleParam, ValueKind  # noqa: F401 - PLACEMENT, ValueKind: the rules read them here
from plangen.plan.style_table import STYLE_FACTS, STYLE_PARAMS


@dataclass(frozen=True)
class StyleSpec:
    """A style class: its keyword-only parameters and the modules a plan may import it from."""

    name: str
    params: tuple[StyleParam, ...]
    modules: tuple[str, ...]

    def param(self, name: str) -> StyleParam | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def import_hint(self) -> str:
        return f"from {self.modules[0]} import {self.name}"


TORCH_PARALLEL = TORCH_STYLES
# plangen.styles imports torch's styles too, so ``from plangen.styles import ColwiseParallel`` works.
TORCH_STYLE_MODULES = (TORCH_PARALLEL, f"{TORCH_PARALLEL}.style", "plangen.styles")
PLANGEN_STYLE_MODULES = ("plangen.styles",)

STYLES: dict[str, StyleSpec] = {
    name: StyleSpec(
        name,
        params,
        TORCH_STYLE_MODULES if STYLE_FACTS[name].module == TORCH_STYLES else PLANGEN_STYLE_MODULES,
    )
    for name, params in STYLE_PARAMS.items()
}

# Public placements and where they can be imported from.
PLACEMENT_MODULES: dict[str, tuple[str, ...]] = {
    "Shard": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
    "Replicate": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
    "Partial": ("torch.distributed.tensor", "torch.distributed.tensor.placement_types", "plangen.styles"),
}
# Private placements: they exist, but their behaviour and constructor change between torch releases.
PRIVATE_PLACEMENTS = ("_StridedShard", "_MaskPartial", "_Partial")
# ``torch.distributed._tensor`` is the deprecated alias of ``torch.distributed.tensor``.
PLACEMENT_MODULE_ALIASES = {"torch.distributed._tensor": "torch.distributed.tensor"}
# ``Partial.ALL_REDUCE_OPS`` in torch 2.13 on (``plangen.stack.torch_compat.PARTIAL_REDUCE_OPS``, which a test compares).
PARTIAL_REDUCE_OPS = ("sum", "avg", "min", "max", "product")

# Modules whose contents are fully known here: a name from one of them that is not in the tables
# is certainly wrong, whereas a name from any other module may be a user's own style.
KNOWN_MODULES = frozenset(
    {*TORCH_STYLE_MODULES, *PLANGEN_STYLE_MODULES}
    | {m for modules in PLACEMENT_MODULES.values() for m in modules}
    | set(PLACEMENT_MODULE_ALIASES)
    | {f"{m}.placement_types" for m in PLACEMENT_MODULE_ALIASES}
)

# What a style's module computes before it is redistributed to ``output_layouts``: torch refuses to
# redistribute to a Partial placement unless the tensor is already in that very placement.
PRODUCED_OUTPUT: dict[str, str] = {name: facts.produces for name, facts in STYLE_FACTS.items() if facts.produces}

# Hugging Face ``tp_plan`` strings and the plangen style with the same semantics, as code
# (``plangen.styles.HF_STYLE_SPECS``; a test builds both and compares them).
# ``qk_rope_head_dim`` is the model config's attribute of that name.
HF_STYLE_EQUIVALENTS: dict[str, str] = {
    "colwise": "ColwiseParallel()",
    "colwise_gather_output": "ColwiseParallel(output_layouts=Replicate())",
    "colwise_rep": "ColwiseParallel(output_layouts=Replicate())",
    "unit_colwise": "ColwiseParallel()",
    "unit_rowwise": "RowwiseParallel()",
    "rowwise": "RowwiseParallel()",
    "rowwise_split_input": "RowwiseParallel(input_layouts=Replicate())",
    "rowwise_rep": "RowwiseParallel(input_layouts=Replicate())",
    "embedding_rowwise": "RowwiseParallel(input_layouts=Replicate())",
    "embedding_colwise": "ColwiseParallel(output_layouts=Replicate())",
    "packed_colwise": "PackedColwiseParallel()",
    "packed_rowwise": "PackedRowwiseParallel()",
    "sequence_parallel": "SequenceParallel(use_local_output=True)",
    "replicated_with_grad_allreduce": "AllReduceParamGrads()",
    "all_reduce": "PrepareModuleOutput(output_layouts=Partial(), desired_output_layouts=Replicate())",
    "mla_kv_a_proj": "MlaKvAProjParallel(rope_dim=qk_rope_head_dim)",
    "replicate": "LeaveUnsharded()",
}
# Hugging Face strings that no torch style can honour (``plangen.styles.HF_UNSUPPORTED_STYLES``).
HF_UNSUPPORTED_STYLES = (
    "moe_tp_experts",
    "moe_identity_expert",
    "grouped_gemm",
    "ep_dispatch_experts",
    "ep_router",
    "local_params",
    "local_colwise",
    "local_rowwise",
    "local_packed_rowwise",
    "local",
    "gather",
)


def placement_import_hint(name: str) -> str:
    return f"from {PLACEMENT_MODULES[name][0]} import {name}"

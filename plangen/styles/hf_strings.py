"""Hugging Face ``tp_plan`` strings as plangen styles.

Hugging Face plans name their styles with transformers' strings (``"colwise"``,
``"embedding_rowwise"``, ...). :data:`HF_STYLE_SPECS` translates each string, as data, into a
registered style name and its keyword arguments, with the same semantics as transformers' own
``TensorParallelLayer`` of that name (see the table's comments); :data:`HF_UNSUPPORTED_STYLES` lists,
with the reason, the strings that torch's parallel styles cannot honour. They raise
:class:`UnsupportedStyleError` rather than being skipped, because a skipped rule leaves a model that
runs and computes something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from plangen.styles.base import build_style


class UnsupportedStyleError(ValueError):
    """A transformers style string that torch's parallel styles cannot honour, on a named module."""

    def __init__(self, style: str, module_name: str | None, reason: str) -> None:
        self.style = style
        self.module_name = module_name
        self.reason = reason
        where = repr(module_name) if module_name else "an unnamed module"
        super().__init__(
            f"transformers parallel style {style!r} on {where} is not supported by plangen: {reason}. "
            "Pass a custom_parallel_plan for this model, or use TP=1."
        )


@dataclass(frozen=True)
class HfStyleSpec:
    """A transformers style string as a plangen style: ``STYLE_CLASSES[style](**kwargs)``.

    ``config_kwargs`` maps a keyword argument to the text-config attribute it is read from when the
    style is resolved (transformers reads the same attribute from the model's config).
    """

    style: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    config_kwargs: Mapping[str, str] = field(default_factory=dict)


# transformers' names (transformers/distributed/tensor_parallel.py, 5.x, and the 4.x names still in
# user plans) with the same input/output layouts, parameter shards and gradient reductions as
# transformers' own TensorParallelLayer of that name. use_local_output is True everywhere because
# transformers always returns local tensors.
_COLWISE = {"input_layouts": Replicate(), "output_layouts": Shard(-1), "use_local_output": True}
_ROWWISE = {"input_layouts": Shard(-1), "output_layouts": Replicate(), "use_local_output": True}
HF_STYLE_SPECS: dict[str, HfStyleSpec] = {
    # Linear, weight (and bias) Shard(0); replicated input (its grad all-reduced); output stays
    # sharded on the last dim.
    "colwise": HfStyleSpec("ColwiseParallel", _COLWISE),
    # As colwise, then the output is all-gathered (lm_head's full-vocabulary logits).
    "colwise_gather_output": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 4.x name of colwise_gather_output, same registration in 5.x.
    "colwise_rep": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 5.25.0: colwise by whole heads over a (heads, replicas) view of the TP mesh; where the TP size
    # divides the heads (all plangen's head checks accept) one replica: exactly colwise.
    "unit_colwise": HfStyleSpec("ColwiseParallel", _COLWISE),
    # Linear, weight Shard(1), bias replicated (added once, after the sum); input sharded on the
    # last dim; partial output all-reduced.
    "rowwise": HfStyleSpec("RowwiseParallel", _ROWWISE),
    # 5.25.0: unit_colwise's row-parallel twin; exactly rowwise where the TP size divides the heads.
    "unit_rowwise": HfStyleSpec("RowwiseParallel", _ROWWISE),
    # As rowwise, but the input arrives replicated and each rank takes its slice.
    "rowwise_split_input": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # 4.x name of rowwise_split_input, same registration in 5.x.
    "rowwise_rep": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Vocab-parallel embedding: weight Shard(0), ids replicated, the partial lookups summed.
    # torch's RowwiseParallel on an nn.Embedding does exactly this.
    "embedding_rowwise": HfStyleSpec(
        "RowwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Hidden-dim-parallel embedding: weight Shard(1), ids replicated, the slices all-gathered.
    # torch's ColwiseParallel on an nn.Embedding does exactly this.
    "embedding_colwise": HfStyleSpec(
        "ColwiseParallel", {"input_layouts": Replicate(), "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Fused [gate; up] Linear: each part sharded on its own (see PackedColwiseParallel).
    "packed_colwise": HfStyleSpec("PackedColwiseParallel", {"split_factor": 2, "use_local_output": True}),
    "packed_rowwise": HfStyleSpec(
        "PackedRowwiseParallel", {"split_factor": 2, "output_layouts": Replicate(), "use_local_output": True}
    ),
    # Params replicated, local input taken as sharded on the sequence dim, local output (5.x;
    # 4.x gathered the output instead).
    "sequence_parallel": HfStyleSpec("SequenceParallel", {"sequence_dim": 1, "use_local_output": True}),
    "replicated_with_grad_allreduce": HfStyleSpec("AllReduceParamGrads"),
    # Forward all-reduce of the module's partial output, identity backward.
    "all_reduce": HfStyleSpec(
        "PrepareModuleOutput",
        {"output_layouts": Partial(), "desired_output_layouts": Replicate(), "use_local_output": True},
    ),
    "mla_kv_a_proj": HfStyleSpec("MlaKvAProjParallel", config_kwargs={"rope_dim": "qk_rope_head_dim"}),
    # 5.x: nothing happens (4.x made the params Replicate DTensors: the same numbers).
    "replicate": HfStyleSpec("LeaveUnsharded"),
}

_MOE = (
    "plangen splits the experts with its own ExpertsParallel instead (whole experts per TP rank, one "
    "all-reduce per MoE layer): use the class's hand-written or synthesized plan (plangen list), or "
    "plangen init to write one"
)
_LOCAL_4X = (
    "a transformers 4.x style that keeps plain local shards with no DTensor and no gradient "
    "synchronisation, for inference-only MoE expert regions"
)

# transformers' names that torch's parallel styles cannot honour, and why.
HF_UNSUPPORTED_STYLES: dict[str, str] = {
    "moe_tp_experts": (
        "runs the fused experts module on local 3-D expert weight shards set by parameter-level rules and "
        f"all-reduces the partial outputs, which torch's module-level styles cannot express; {_MOE}"
    ),
    "moe_identity_expert": (
        "divides a zero-expert's input by the TP size to cancel moe_tp_experts' all-reduce, so it is only "
        f"correct together with that unsupported style; {_MOE}"
    ),
    "grouped_gemm": f"shards MoE expert weights by expert for expert parallelism; {_MOE}",
    "ep_dispatch_experts": f"dispatches tokens to expert-parallel ranks; {_MOE}",
    "ep_router": f"a transformers 4.x expert-parallel router that masks the other ranks' experts; {_MOE}",
    "local_params": (
        "runs a module on its own parameters sharded by parameter-level rules (attention sinks); torch's "
        "parallelize_module shards modules: AttentionSinksParallel on the attention block shards its sinks"
    ),
    "local_colwise": f"{_LOCAL_4X}; the DTensor equivalent is 'colwise'",
    "local_rowwise": f"{_LOCAL_4X}; the DTensor equivalent is 'rowwise'",
    "local_packed_rowwise": f"{_LOCAL_4X}; the DTensor equivalent is 'packed_rowwise'",
    "local": f"{_LOCAL_4X} (isolates a module from DTensor inputs)",
    "gather": f"{_LOCAL_4X} (all-reduces the first output in place, no autograd); the nearest is 'all_reduce'",
}


def known_hf_styles() -> list[str]:
    """Every transformers style string plangen knows, supported or not."""
    return sorted({*HF_STYLE_SPECS, *HF_UNSUPPORTED_STYLES})


def resolve_hf_style(style: str, module_name: str | None = None, *, config: Any = None) -> tuple[str, dict[str, Any]]:
    """The plangen style name and keyword arguments for transformers' ``style`` on ``module_name``.

    ``config`` (the model's text config) supplies the arguments transformers reads from it
    (``mla_kv_a_proj``'s rope width). Raises :class:`UnsupportedStyleError` for a style that cannot
    be honoured and ``ValueError`` for a string transformers never had.
    """
    if style in HF_UNSUPPORTED_STYLES:
        raise UnsupportedStyleError(style, module_name, HF_UNSUPPORTED_STYLES[style])
    spec = HF_STYLE_SPECS.get(style)
    if spec is None:
        where = f" on {module_name!r}" if module_name else ""
        raise ValueError(
            f"unknown transformers parallel style {style!r}{where}; known styles: {', '.join(known_hf_styles())}"
        )
    kwargs = dict(spec.kwargs)
    for kwarg, attribute in spec.config_kwargs.items():
        value = getattr(config, attribute, None)
        if value is None:
            raise UnsupportedStyleError(
                style, module_name, f"needs `{attribute}` from the model's text config (pass config=)"
            )
        kwargs[kwarg] = value
    return spec.style, kwargs


def translate_parallel_style(style: str, module_name: str | None = None, *, config: Any = None) -> ParallelStyle:
    """The torch ``ParallelStyle`` for transformers' ``style`` (NeMo RL's name); see :func:`resolve_hf_style`."""
    name, kwargs = resolve_hf_style(style, module_name, config=config)
    return build_style(name, kwargs)

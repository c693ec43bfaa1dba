"""A model's own Hugging Face tensor-parallel plan, as transformers composes it, as plangen data.

transformers (5.x) composes a model's plan in ``post_init`` (5.24.0 on: ``DistributedMixin.init_parallel_plans``):
the class ``_tp_plan`` (``{"lm_head": "colwise_gather_output"}``), then, on the base model, the
config's ``base_model_tp_plan`` preceded by ``embed_tokens: embedding_rowwise`` when the model has
an ``nn.Embedding`` of that name and no rule for it, then every child's composed plan under the
child's attribute name. 5.5.x and 5.8.x compose the config's plan and the children's only
(:func:`plangen.stack.transformers_compat.plan_composes_head_and_embedding`). The result is the instance's ``tp_plan``, keyed by module paths with ``*``
for layer numbers: ``model.layers.*.self_attn.q_proj`` for ``LlamaForCausalLM``,
``model.language_model.layers.*...`` for Gemma3 / Qwen2-VL / Llava / Mistral3 conditional models.

:func:`collect_hf_tp_plan` returns that plan (the instance's, which is also where transformers
keeps a plan set by the user or by ``DistributedConfig``; the composition is mirrored by
:func:`compose_hf_tp_plan` for modules whose ``post_init`` never ran). :func:`build_hf_plan` turns
it into a :class:`~plangen.plan.Plan`, refusing what torch's styles cannot honour, and
:func:`get_hf_tp_plan` into the ``{pattern: ParallelStyle}`` dict (NeMo RL's name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from plangen.model.resolve import text_config
from plangen.model.module_tree import generalize
from plangen.plan import Plan, PlanEntry
from plangen.styles import UnsupportedStyleError, resolve_hf_style
from plangen.stack.transformers_compat import plan_composes_head_and_embedding

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.tensor.parallel import ParallelStyle


def _is_pretrained_model(module: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel)


def _stored_or_composed_plan(module: nn.Module) -> dict[str, str] | None:
    if not _is_pretrained_model(module):
        return getattr(module, "_tp_plan", None)
    # post_init stores the composed plan on the instance (a child's ran before its parent's), and a
    # plan set later by the user or a DistributedConfig replaces it there: transformers reads that one.
    stored = vars(module).get("_tp_plan")
    return dict(stored) if stored is not None else compose_hf_tp_plan(module)


def compose_hf_tp_plan(model: nn.Module) -> dict[str, str]:
    """The TP plan transformers' ``post_init`` composes for ``model``, from its class, config and children."""
    with_head_and_embedding = plan_composes_head_and_embedding()
    plan = dict(getattr(type(model), "_tp_plan", None) or {}) if with_head_and_embedding else {}
    if _is_pretrained_model(model) and model.base_model is model:
        plan.update(getattr(model.config, "base_model_tp_plan", None) or {})
        if with_head_and_embedding and plan and isinstance(getattr(model, "embed_tokens", None), nn.Embedding):
            plan = {"embed_tokens": "embedding_rowwise", **plan}
    for name, child in model.named_children():
        child_plan = _stored_or_composed_plan(child)
        if child_plan:
            plan.update({f"{name}.{key}": style for key, style in child_plan.items()})
    return plan


def collect_hf_tp_plan(model: nn.Module) -> dict[str, str]:
    """``model``'s TP plan exactly as transformers resolves it: ``{module pattern: style string}``.

    Raises ``ValueError`` when the model has none.
    """
    plan = _stored_or_composed_plan(model) if _is_pretrained_model(model) else compose_hf_tp_plan(model)
    if not plan:
        raise ValueError(
            f"{type(model).__name__} has no Hugging Face tensor-parallel plan (no _tp_plan, no "
            "config.base_model_tp_plan): pass a custom_parallel_plan or use TP=1"
        )
    return plan


def guess_group(pattern: str) -> str:
    """The plan-file group of a pattern: embeddings, attention, mlp, norms, output or other."""
    atoms = pattern.lower().split(".")
    leaf, parents = atoms[-1], atoms[:-1]

    def is_attention(atom: str) -> bool:
        return "attn" in atom or "attention" in atom

    if any("embed" in atom for atom in atoms):
        return "embeddings"
    if "lm_head" in atoms:
        return "output"
    if "norm" in leaf:
        # A per-head q_norm belongs to its attention block; post_attention_layernorm does not.
        return "attention" if any(is_attention(atom) for atom in parents) else "norms"
    if any(is_attention(atom) for atom in atoms):
        return "attention"
    if any("mlp" in atom or "feed_forward" in atom or "expert" in atom for atom in atoms):
        return "mlp"
    return "other"


def build_hf_plan(model: nn.Module) -> Plan:
    """``model``'s Hugging Face TP plan as plangen data (``source="hf"``), faithful to transformers.

    Raises :class:`~plangen.styles.UnsupportedStyleError` naming the style and the pattern for a rule
    torch's styles cannot honour, including a rule on a single parameter (``parallelize_module``
    shards modules, so it would silently leave the parameter whole).
    """
    hf_plan = collect_hf_tp_plan(model)
    config = text_config(getattr(model, "config", None))
    resolved = {key: resolve_hf_style(style, key, config=config) for key, style in hf_plan.items()}

    module_names = {generalize(name) for name, _ in model.named_modules()}
    parameter_names = {generalize(name) for name, _ in model.named_parameters()}
    for key, style in hf_plan.items():
        if key not in module_names and key in parameter_names:
            raise UnsupportedStyleError(
                style, key, "the rule names a parameter, and torch's parallelize_module shards modules only"
            )

    owner = type(model).__name__
    entries = tuple(
        PlanEntry(
            pattern=key,
            style=name,
            kwargs=kwargs,
            group=guess_group(key),
            why=f"transformers' {owner} plan: {hf_plan[key]!r}",
        )
        for key, (name, kwargs) in resolved.items()
    )
    uses_sequence_parallel = any(style == "sequence_parallel" for style in hf_plan.values())
    return Plan(entries=entries, source="hf", sequence_parallel=uses_sequence_parallel)


def get_hf_tp_plan(model: nn.Module) -> dict[str, "ParallelStyle"]:
    """``{module pattern: ParallelStyle}`` for ``model``'s Hugging Face TP plan (NeMo RL's name)."""
    from plangen.styles import build_parallel_styles

    return build_parallel_styles(build_hf_plan(model))


__all__ = ["build_hf_plan", "collect_hf_tp_plan", "compose_hf_tp_plan", "get_hf_tp_plan", "guess_group"]

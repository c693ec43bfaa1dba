"""Plans on peft LoRA-wrapped models: keys written for the base model, adapters placed to match.

peft wraps the model (``PeftModel`` → ``base_model`` (``LoraModel``) → ``model``, so every path
gains a ``base_model.model.`` prefix) and replaces each targeted ``nn.Linear`` by a LoRA layer whose
``base_layer`` is the original linear, with adapters ``lora_A[name]`` (in → r) and ``lora_B[name]``
(r → out) that it adds as ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``. A plan's key
``model.layers.*.self_attn.q_proj`` therefore matches no module, or lands on the wrapper, which has
no ``weight``. :func:`resolve_lora_styles` translates a plan once, before anything is applied:

* keys get the wrapper's prefix where the model is a ``PeftModel`` (keys already written with it
  are kept);
* a column-parallel key on a LoRA layer becomes: the wrapper gathers its input to ``Replicate()``
  once, as a DTensor shared by both paths (:class:`PrepareModuleInput`, no communication unless
  the style's input is sequence-sharded); ``base_layer`` takes the plan's style; ``lora_A`` keeps
  whole weights as ``Replicate()`` DTensors (its input is replicated, its output, ``r`` wide, too);
  ``lora_B`` is column-parallel with the base's output layout, so the sum adds like to like.
  Backward: ``lora_A``'s weight gradient is a partial sum over TP (each rank saw only its columns
  of ``lora_B``), which FSDP2 all-reduces (``r x in`` per adapter, the only new collective); the
  input's gradient joins the base's partial one and is reduced once, as before;
* a row-parallel key on a LoRA layer becomes: ``base_layer`` takes the plan's style; ``lora_A`` is
  row-parallel with the base's layouts (its input is the same feature shard; its ``[tokens, r]``
  partial sum is all-reduced, or reduce-scattered under sequence parallel); ``lora_B`` keeps whole
  weights (``Replicate()`` DTensors) and returns what the base returns (local or DTensor).

Scaling is peft's own, untouched; so is dropout on a column-parallel layer's replicated input
(TP ranks seeded alike draw the unsharded mask). On a row-parallel layer's feature shard
:class:`FeatureShardedDropout` draws the whole input's mask and keeps this rank's columns. Frozen base weights keep ``requires_grad=False``
(torch's styles carry it over), so they get no gradient and FSDP2 reduces none for them.
"""

from __future__ import annotations

from typing import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

from plangen.stack import torch_compat as compat
from plangen.model.module_tree import LORA_PARTS, ModuleIndex
from plangen.plans.checks import PlanError


def is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA layer (duck-typed: peft is optional): a ``base_layer`` and ``lora_A`` adapters."""
    return isinstance(getattr(module, "base_layer", None), nn.Module) and isinstance(
        getattr(module, "lora_A", None), nn.ModuleDict
    )


def is_lora_model(model: nn.Module) -> bool:
    return any(is_lora_layer(m) for m in model.modules())


def find_lora_base(model: nn.Module) -> tuple[str, nn.Module]:
    """(path, module) of the transformers model inside a ``PeftModel``; ``("", model)`` otherwise.

    Plans are chosen for, and written against, that model (its class has the plan)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if base is model or not isinstance(base, nn.Module):
        return "", model
    path = next((name for name, m in model.named_modules() if m is base), None)
    return (path, base) if path else ("", model)


def resolve_plan_model(model: nn.Module) -> nn.Module:
    """The model whose plan ``model`` gets: itself, or for a peft model the wrapped model, seen
    without its LoRA layers (an empty copy on the meta device, built from its config).

    Plan builders and synthesis read the module tree (``nn.Linear`` children, forward sources): on
    the LoRA layers a synthesized plan would not be found, or not be the one the sweep proved.
    The plan is written for the bare model; :func:`resolve_lora_styles` then translates it."""
    import torch

    _, base = find_lora_base(model)
    if not is_lora_model(base):
        return base
    config = getattr(base, "config", None)
    build = getattr(type(base), "_from_config", None)
    if config is None or build is None:
        return base  # not a transformers model: its plan is a custom one, chosen without reading it
    with torch.device("meta"):
        return build(config)


class ReplicatedAdapter(ParallelStyle):
    """A LoRA adapter kept whole on every TP rank, as ``Replicate()`` DTensors, between sharded layers.

    Its input is a DTensor (the wrapper's replicated input, or ``lora_A``'s reduced output) that
    passes through; the output is returned local when ``use_local_output`` (as the base layer's is).
    Where the input is replicated but the gradient arriving is partial (column-parallel
    ``lora_B`` after it), the weight gradient is ``Partial``: FSDP2 all-reduces it to the weight's
    ``Replicate()`` before its reduce-scatter, as it does for sequence-parallel norms.
    """

    def __init__(self, *, use_local_output: bool = False) -> None:
        super().__init__()
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            replicated = distribute_tensor(param, device_mesh, [Replicate()], src_data_rank=self.src_data_rank)
            module.register_parameter(name, nn.Parameter(replicated, requires_grad=param.requires_grad))

        def check_input(mod: nn.Module, args: tuple) -> None:
            if not isinstance(args[0], DTensor):
                raise TypeError(
                    f"{type(self).__name__}: a LoRA adapter between sharded layers expects a DTensor input, "
                    f"got {type(args[0]).__name__} (was the LoRA layer translated by plangen.runtime.lora.resolve_lora_styles?)"
                )

        module.register_forward_pre_hook(check_input)
        if not compat.FLATTENS_SHARDED_DIM and isinstance(module, nn.Linear):
            # torch < 2.13 cannot flatten a sequence-sharded input (lora_B after a row-parallel
            # lora_A under SP): the same product on each rank's tokens.
            linear = module.forward

            def forward(x):
                if (
                    compat.is_row_sharded(x)
                    and isinstance(module.weight, DTensor)
                    and all(p.is_replicate() for p in module.weight.placements)
                ):
                    return compat.linear_on_local_rows(x, module.weight, module.bias)
                return linear(x)

            module.forward = forward
        if self.use_local_output:
            module.register_forward_hook(lambda mod, args, out: out.to_local())
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(use_local_output={self.use_local_output})"


class FeatureShardedDropout(ParallelStyle):
    """A row-parallel LoRA layer's ``lora_dropout``, whose input is this rank's feature shard: the
    mask of the whole input is drawn (from the global generator, as one device would draw it) and
    this rank keeps its columns, so the TP ranks drop exactly what the unsharded model drops.

    ``nn.Dropout`` on the shard would draw a mask of the shard's shape: the same on every TP rank
    (their generators agree), so feature ``j`` and ``j + in/tp`` would always be dropped together.
    The cost is a mask of the whole input per call (bytes of ``[tokens, in]``), no communication.
    Anything but an ``nn.Dropout`` (peft's ``nn.Identity`` for ``lora_dropout=0``) is left alone.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        import types

        if not isinstance(module, nn.Dropout):
            return module
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()

        def forward(mod: nn.Dropout, x):
            import torch

            if not mod.training or mod.p == 0:
                return x
            if mod.p == 1:
                return x * torch.zeros((), dtype=x.dtype)
            # As ATen's CPU dropout: a bernoulli(1 - p) noise of the input's dtype, divided by 1 - p.
            width = x.shape[-1]
            noise = torch.empty((*x.shape[:-1], width * tp), dtype=x.dtype, device=x.device).bernoulli_(1 - mod.p)
            noise = noise[..., rank * width : (rank + 1) * width].div_(1 - mod.p)
            return x * noise

        module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _fit(style: ParallelStyle) -> str | None:
    """``column``, ``row``, or None where the style cannot be translated onto a LoRA layer."""
    from plangen.styles.kv_heads import KVHeadsColwiseParallel

    # Exact classes: a subclass lays out weights its own way (packed parts, gathered outputs, KV
    # heads replicated) that the adapters would have to copy.
    if type(style) in (ColwiseParallel, KVHeadsColwiseParallel):
        return "column"
    if type(style) is RowwiseParallel:
        return "row"
    return None


def _translate(path: str, style: ParallelStyle, fit: str, adapters: str) -> dict[str, ParallelStyle]:
    """The styles of a LoRA layer at ``path`` (a key) whose base layer takes ``style``."""
    if fit == "column":
        (input_layout,) = style.input_layouts
        (output_layout,) = style.output_layouts
        return {
            path: PrepareModuleInput(
                input_layouts=(input_layout,), desired_input_layouts=(Replicate(),), use_local_output=False
            ),
            f"{path}.base_layer": style,
            f"{path}.lora_A.{adapters}": ReplicatedAdapter(use_local_output=False),
            f"{path}.lora_B.{adapters}": ColwiseParallel(
                input_layouts=Replicate(), output_layouts=output_layout, use_local_output=style.use_local_output
            ),
        }
    (input_layout,) = style.input_layouts
    (output_layout,) = style.output_layouts
    return {
        f"{path}.base_layer": style,
        f"{path}.lora_A.{adapters}": RowwiseParallel(
            input_layouts=input_layout, output_layouts=output_layout, use_local_output=False
        ),
        f"{path}.lora_B.{adapters}": ReplicatedAdapter(use_local_output=style.use_local_output),
        f"{path}.lora_dropout.{adapters}": FeatureShardedDropout(),
    }


def check_lora_layer(
    module: nn.Module, parent: nn.Module | None, path: str, style: ParallelStyle, tp_size: int
) -> str | None:
    """Why ``style`` cannot be translated onto the LoRA layer ``module`` at ``path`` (a child of
    ``parent``); None if it can."""
    from plangen.styles.kv_heads import KVHeadsColwiseParallel
    from plangen.model.module_facts import attention_head_counts

    name = type(style).__name__
    if _fit(style) is None:
        return (
            f"{path} is a LoRA layer and {name} cannot be placed on its base layer and adapters "
            "(plangen translates ColwiseParallel, KVHeadsColwiseParallel and RowwiseParallel): "
            "leave the module out of the LoRA target_modules or out of the plan"
        )
    if not isinstance(module.base_layer, nn.Linear):
        return f"{path}: LoRA on {type(module.base_layer).__name__} is not supported under TP (only on nn.Linear)"
    if getattr(module, "lora_variant", None):
        return f"{path}: LoRA variants ({', '.join(module.lora_variant)}; DoRA...) are not supported under TP"
    if isinstance(style, KVHeadsColwiseParallel):
        # Where the TP size exceeds the KV heads the base layer's rows are sliced per rank
        # (plangen.styles.kv_heads), which lora_B would have to follow.
        counts = attention_head_counts(parent) if parent is not None else None
        if counts is not None and counts[1] % tp_size:
            return (
                f"{path}: LoRA on a k/v projection whose KV heads ({counts[1]}) are replicated over TP size "
                f"{tp_size} is not supported: use a TP size that divides the KV heads, or no LoRA on k/v"
            )
    return None


def resolve_lora_styles(
    model: nn.Module, styles: Mapping[str, ParallelStyle], tp_size: int
) -> dict[str, ParallelStyle]:
    """``styles`` written for the base model, as they apply to its LoRA-wrapped form. Pure.

    Unchanged for a model without LoRA layers. Raises :class:`PlanError` for a key that selects
    the inside of a LoRA layer (its base layer or adapters: the translation places those) or a
    style that cannot be translated (see :func:`check_lora_layer`)."""
    if not is_lora_model(model):
        return dict(styles)
    prefix, _ = find_lora_base(model)
    index = ModuleIndex(model)
    modules = dict(model.named_modules())
    resolved: dict[str, ParallelStyle] = {}
    for key, style in styles.items():
        if prefix and not key.startswith(f"{prefix}.") and not index.selects_any(key):
            key = f"{prefix}.{key}"
        paths = index.paths(key)
        inside = [p for p in paths if _inside_lora_layer(p, modules)]
        if inside:
            raise PlanError(
                f"plan key {key} selects the inside of a LoRA layer ({inside[0]}): write the key for the wrapped "
                "module; plangen places its base layer and adapters"
            )
        lora = [p for p in paths if is_lora_layer(modules[p])]
        if not lora:
            resolved[key] = style
            continue
        for path in lora:
            parent = modules.get(path.rpartition(".")[0])
            problem = check_lora_layer(modules[path], parent, path, style, tp_size)
            if problem:
                raise PlanError(problem)
        fit = _fit(style)
        assert fit is not None
        if len(lora) == len(paths):  # every match wrapped: one translated key serves them all
            resolved.update(_translate(key, style, fit, "*"))
            continue
        # Some matches wrapped, some not: spell the wrapped ones out, keep the plain ones by path.
        for path in paths:
            if path in lora:
                resolved.update(_translate(path, style, fit, "*"))
            else:
                resolved[path] = style
    return resolved


def _inside_lora_layer(path: str, modules: Mapping[str, nn.Module]) -> bool:
    parts = path.split(".")
    for i in range(1, len(parts)):
        owner = modules.get(".".join(parts[:i]))
        if parts[i] in LORA_PARTS and owner is not None and is_lora_layer(owner):
            return True
    return False

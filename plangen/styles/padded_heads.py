"""Multi-query attention whose query heads no TP size splits, padded with zero heads (Falcon-7B's 71).

The query heads are padded to the next multiple of the TP size (:mod:`plangen.model.pad_layout`): the
packed ``[q; k; v]`` projection gets zero rows for the pad heads' queries, the output projection
zero input columns for their outputs, and the block's head counts become this rank's padded share.
A pad head's query is zero, so it attends uniformly and its output is the mean of the values; the
zero columns drop that from the block's output, so the forward is the unpadded model's exactly.

Its gradients are not zero by themselves: the output projection's pad columns would get the pad
heads' outputs times the output gradient, and an optimizer step would make them non-zero (the
model would then differ from the Hugging Face one). So the output projection's input is masked to 0
on the pad features (``masked_fill``): the pad columns' gradient is exactly 0, and so is every
gradient flowing back into the pad heads (their queries' rows get exactly 0 too). AdamW leaves a
zero parameter with zero gradients at 0 (its moments stay 0, its decay multiplies 0).

The parameters hold the pad; state-dict hooks drop it on save and zero-fill it on load, so a state
dict (a full one under FSDP2 too) is Hugging Face's, names and shapes, and
:func:`plangen.styles.fused.hugging_face_layout` drops it from gathered parameters and gradients.

:class:`plangen.styles.kv_heads.PrepareAttentionInput` with ``padded_heads=True`` on the attention block
applies this (it comes before the block's projections in a plan) and marks the packed projection;
:class:`plangen.styles.fused.MultiQueryColwiseParallel` on it reads the mark and pads its rows
before it re-lays them out per rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from plangen.styles.hf_layout import PAD_LAYOUT, HuggingFaceLayoutTensor, hugging_face_value, keep_unwrap_last  # noqa: F401 - PAD_LAYOUT: imported from here too
from plangen.model.module_facts import apply_head_counts, attention_head_counts, head_count_owner, output_dim
from plangen.model.pad_layout import local_pad_features, padded_head_count, padded_tp_problem, real_rows

# On the packed projection, set by the block's style: (query heads, padded heads, head size).
PADDED_HEADS = "_plangen_padded_heads"
# On the output projection: the handle of its input mask (a test removes it: the negative control).
PAD_MASK = "_plangen_pad_mask"


def apply_padded_heads(attention: nn.Module, device_mesh: DeviceMesh, head_attributes: tuple[str, ...]) -> None:
    """Pad ``attention``'s query heads to a multiple of the TP size; its head counts this rank's share."""
    counts = attention_head_counts(attention)
    if counts is None:
        raise ValueError(
            f"padded heads: {type(attention).__name__} states no head counts (config.num_attention_heads, head_dim)"
        )
    heads, _, head_dim = counts
    tp = device_mesh.size()
    problem = padded_tp_problem(heads, tp, type(attention).__name__)
    if problem is not None:
        raise ValueError(problem)
    padded = padded_head_count(heads, tp)
    packed, output = _packed_and_output(attention, heads, head_dim)
    for attribute in head_attributes:
        if (value := getattr(*head_count_owner(attention, attribute))) != heads:
            raise ValueError(
                f"padded heads: {type(attention).__name__}.{attribute}={value!r} is not the query head count {heads}"
            )
    local = {attribute: padded // tp for attribute in head_attributes}
    # One KV head: every query head is in its group, so the group size its attention repeats the KV
    # head by (transformers' repeat_kv, Falcon's on 5.25) is the query count, this rank's padded share.
    if getattr(attention, "num_key_value_groups", None) == heads and "num_key_value_groups" not in local:
        local["num_key_value_groups"] = padded // tp
    apply_head_counts(attention, local)
    if padded == heads:
        return  # the TP size divides the heads: nothing to pad
    setattr(packed, PADDED_HEADS, (heads, padded, head_dim))
    rows = real_rows(heads, padded, head_dim)
    pad_parameters(output, {"weight": 1}, rows, padded * head_dim)
    install_pad_load_hook(output, distribute=True)
    install_pad_save_hook(output)
    span = local_pad_features(heads, tp, device_mesh.get_local_rank(), head_dim)
    if span is not None:
        setattr(output, PAD_MASK, apply_pad_mask(output, *span))


def _packed_and_output(attention: nn.Module, heads: int, head_dim: int) -> tuple[nn.Linear, nn.Linear]:
    # The packed multi-query [q; k; v] (q of all heads, one k and one v head) and the projection
    # from all heads' outputs; by their shapes, as plangen.styles.kv_heads finds k/v projections.
    linears = [c for c in attention.children() if isinstance(c, nn.Linear)]
    packed = [c for c in linears if c.out_features == (heads + 2) * head_dim]
    output = [c for c in linears if c.in_features == heads * head_dim and c not in packed]
    if len(packed) != 1 or len(output) != 1:
        raise ValueError(
            f"padded heads: {type(attention).__name__} needs one nn.Linear of (heads + 2) x head_dim = "
            f"{(heads + 2) * head_dim} outputs (multi-query [q; k; v]) and one of heads x head_dim = "
            f"{heads * head_dim} inputs; it has {len(packed)} and {len(output)}"
        )
    if any(isinstance(p, DTensor) for c in (*packed, *output) for p in c.parameters(recurse=False)):
        raise ValueError(
            "padded heads: the block's projections were sharded before it: put PrepareAttentionInput's "
            "key before theirs in the plan"
        )
    return packed[0], output[0]


def apply_padded_packed_rows(
    module: nn.Module, part_sizes: tuple[int, ...], shared: tuple[int, ...]
) -> tuple[int, ...]:
    """Where the block marked ``module`` (:data:`PADDED_HEADS`): its query rows padded with zero heads
    (the load hook installed; the save hook is the caller's, after its own layout hooks), and the
    parts' proportions of the padded layout returned, in heads (``(padded, 1, 1)``). The mark's head
    counts are the module's own: a plan's ``part_sizes`` were written for the full-size model, and
    a shrunk one (``plangen verify``'s) keeps only their layout, q then one head per shared part.
    Unmarked: ``part_sizes`` unchanged."""
    mark = getattr(module, PADDED_HEADS, None)
    if mark is None:
        return part_sizes
    heads, padded, head_dim = mark
    dims = {name: output_dim(module, name) for name, _ in module.named_parameters(recurse=False)}
    rows = next(p.shape[dims[n]] for n, p in module.named_parameters(recurse=False))
    trailing = rows - heads * head_dim
    if shared != tuple(range(1, len(part_sizes))) or trailing != len(shared) * head_dim:
        raise ValueError(
            f"padded heads: {rows} rows (parts {part_sizes}, shared {shared}) are not [q of {heads} heads "
            f"of {head_dim}; one head per shared part]"
        )
    pad_parameters(module, dims, real_rows(heads, padded, head_dim, trailing), padded * head_dim + trailing)
    install_pad_load_hook(module, distribute=False)
    return (padded, *(1,) * len(shared))


def pad_parameters(module: nn.Module, dims: dict[str, int], rows: list[int], size: int) -> None:
    """``module``'s parameters ``dims`` (name -> dim) zero-padded to ``size`` along their dim, Hugging
    Face's values at ``rows``; the layout recorded (:data:`PAD_LAYOUT`) for the hooks and the checks."""
    layout: dict[str, tuple[int, list[int], int]] = {}
    for name, dim in dims.items():
        param = getattr(module, name, None)
        if not isinstance(param, nn.Parameter):
            continue
        module.register_parameter(
            name, nn.Parameter(fill_pad(param.detach(), dim, rows, size), requires_grad=param.requires_grad)
        )
        layout[name] = (dim, rows, size)
    setattr(module, PAD_LAYOUT, layout)


def fill_pad(tensor: torch.Tensor, dim: int, rows: list[int], size: int) -> torch.Tensor:
    """``tensor`` (Hugging Face's values) placed at ``rows`` of a zero tensor of ``size`` along ``dim``."""
    shape = list(tensor.shape)
    shape[dim] = size
    padded = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
    return padded.index_copy(dim, torch.tensor(rows, device=tensor.device), tensor)


def _pad_layout(module: nn.Module, param_name: str) -> tuple[int, list[int], int] | None:
    return getattr(module, PAD_LAYOUT, {}).get(param_name)


def drop_pad(module: nn.Module, param_name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The whole parameter (or gradient) without its pad, as Hugging Face holds it; unpadded ones unchanged."""
    layout = _pad_layout(module, param_name)
    if layout is None:
        return tensor
    dim, rows, _ = layout
    return tensor.index_select(dim, torch.tensor(rows, device=tensor.device))


def hugging_face_shape(model: nn.Module, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``model``'s whole parameter (or gradient) ``name`` (a dotted name) once its pad is
    dropped; others' unchanged."""
    path, _, param_name = name.rpartition(".")
    layout = _pad_layout(model.get_submodule(path), param_name)
    if layout is None:
        return tuple(shape)
    dim, rows, _ = layout
    return tuple(len(rows) if d == dim else n for d, n in enumerate(shape))


def read_pad(module: nn.Module, param_name: str, tensor: torch.Tensor) -> torch.Tensor | None:
    """The pad entries of a whole padded parameter (or gradient) in its padded layout; None where it has none."""
    layout = _pad_layout(module, param_name)
    if layout is None:
        return None
    dim, rows, size = layout
    kept = set(rows)
    return tensor.index_select(dim, torch.tensor([r for r in range(size) if r not in kept], device=tensor.device))


def install_pad_save_hook(module: nn.Module) -> None:
    """``state_dict()`` shows the padded parameters without their pad: for a DTensor a view in Hugging
    Face's layout over this rank's rows, nothing gathered (:mod:`plangen.styles.hf_layout`, which composes
    the pad with any re-layout of the rows); a plain tensor loses its pad rows. Registered after any
    hook that re-lays the rows out (which, over a DTensor, already made the view: it is kept)."""

    def without_pad(mod: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        for param_name in getattr(mod, PAD_LAYOUT, {}):
            key = prefix + param_name
            value = state_dict.get(key)
            if value is None or isinstance(value, HuggingFaceLayoutTensor):
                continue
            state_dict[key] = (
                hugging_face_value(mod, param_name, value)
                if isinstance(value, DTensor)
                else drop_pad(mod, param_name, value)
            )

    module.register_state_dict_post_hook(without_pad)


def install_pad_load_hook(module: nn.Module, *, distribute: bool) -> None:
    """``load_state_dict`` takes Hugging Face's shapes: the pad zero-filled. ``distribute``: then laid out
    as the parameter (this rank's shard); else left whole for a re-layout hook registered after this one."""

    def with_pad(mod: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        for param_name, (dim, rows, size) in getattr(mod, PAD_LAYOUT, {}).items():
            key = prefix + param_name
            value = state_dict.get(key)
            if isinstance(value, HuggingFaceLayoutTensor):
                continue  # this model's own entry, the parameter's storage: keep_unwrap_last's hook takes it
            if value is None or value.shape[dim] != len(rows):
                continue  # load_state_dict reports the missing key or the wrong shape itself
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            padded = fill_pad(whole, dim, rows, size)
            param = getattr(mod, param_name)
            if distribute and isinstance(param, DTensor):  # keep this rank's shard: a local slice
                padded = distribute_tensor(
                    padded.to(param.device_mesh.device_type), param.device_mesh, param.placements, src_data_rank=None
                )
            state_dict[key] = padded

    module.register_load_state_dict_pre_hook(with_pad)
    keep_unwrap_last(module)


def apply_pad_mask(module: nn.Module, start: int, stop: int) -> Any:
    """Mask ``module``'s local input to 0 on features ``start:stop`` (this rank's pad heads' outputs):
    no gradient reaches the pad parameters. Runs before the module's own input handling. The handle."""

    def mask(mod: nn.Module, args: tuple) -> tuple:
        x, *rest = args
        if isinstance(x, DTensor):
            raise TypeError(
                f"padded heads: {type(mod).__name__} takes this rank's heads as a local tensor, not a DTensor"
            )
        pad = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
        pad[start:stop] = True
        return (x.masked_fill(pad, 0), *rest)

    return module.register_forward_pre_hook(mask, prepend=True)

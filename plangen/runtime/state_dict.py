"""The optimizer's state in Hugging Face's layout at sharded memory: resume the optimizer at another layout.

``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` keys each parameter's state by
the parameter's name and keeps its tensors as the parameter holds them. For a parameter plangen holds
in an order of its own (fused projections re-laid out per TP rank, pad heads: :mod:`plangen.styles.hf_layout`),
that is plangen's row order at the TP size it was saved at: loaded at another TP size, Adam's moments
land on other rows than their weights (silently: the shapes agree), and in a plain model they are
not Hugging Face's.

:func:`get_optimizer_state_dict` and :func:`set_optimizer_state_dict` take and give what torch's
functions of the same names do, with the per-element states (a tensor of the parameter's shape:
Adam's ``exp_avg``/``exp_avg_sq``, SGD's momentum) of those parameters shown in Hugging Face's
layout, as :func:`torch.distributed.checkpoint.state_dict.get_model_state_dict` shows the weights:

- sharded (the default): a :class:`~plangen.styles.hf_layout.HuggingFaceLayoutTensor` over this rank's shard
  of the state itself, nothing gathered; ``torch.distributed.checkpoint`` saves it at Hugging Face's
  offsets and loads straight into the live state at any layout (or a plain model);
- ``StateDictOptions(full_state_dict=True)``: each state gathered whole in Hugging Face's layout (pad
  rows dropped), one at a time; ``cpu_offload=True`` keeps them on rank 0's CPU only, as torch does.

A state of another shape on a re-laid-out parameter (Adafactor's row and column factors) has no row
map to follow: refused, naming the parameter and the state (torch's functions resume it at the same
layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import state_dict as torch_state_dict
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.tensor import DTensor

from plangen.stack.torch_compat import tree_map_only
from plangen.styles.hf_layout import HuggingFaceLayoutTensor, RowMap, hugging_face_value, row_map

__all__ = ["get_optimizer_state_dict", "set_optimizer_state_dict"]

_STATE, _PARAM_GROUPS = "state", "param_groups"
# Wrappers whose names torch's state-dict functions leave out of a parameter's name.
_WRAPPER_NAMES = {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}


@dataclasses.dataclass(frozen=True)
class _Relaid:
    module: nn.Module
    name: str
    parameter: torch.Tensor
    rows: RowMap


def _relaid_parameters(model: nn.Module) -> dict[str, _Relaid]:
    """The parameters plangen holds in an order of its own, by the name torch's state dicts give them."""
    found: dict[str, _Relaid] = {}
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            rows = row_map(module, name, tuple(parameter.shape))
            if rows is None:
                continue
            fqn = ".".join(p for p in f"{module_name}.{name}".split(".") if p and p not in _WRAPPER_NAMES)
            found[fqn] = _Relaid(module, name, parameter, rows)
    return found


def _per_parameter_states(state_dict: dict[str, Any], relaid: dict[str, _Relaid]):
    """``(container, key, fqn, state name)`` of every state of a re-laid-out parameter, in the nested
    form (``state[fqn][name]``) and in torch's flattened one (``"state.<fqn>.<name>"``)."""
    nested = state_dict.get(_STATE)
    if isinstance(nested, dict):
        for fqn, states in nested.items():
            if fqn in relaid and isinstance(states, dict):
                for name in list(states):
                    yield states, name, fqn, name
        return
    for key in list(state_dict):
        if key.startswith(_STATE + "."):
            fqn, _, name = key[len(_STATE) + 1 :].rpartition(".")
            if fqn in relaid:
                yield state_dict, key, fqn, name


def _is_per_element(value: Any, parameter: torch.Tensor, fqn: str, name: str) -> bool:
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return False  # a step count, a scalar
    if tuple(value.shape) == tuple(parameter.shape):
        return True
    raise NotImplementedError(
        f"{fqn}: the optimizer's state {name!r} has shape {tuple(value.shape)}, not its parameter's "
        f"{tuple(parameter.shape)}, and the parameter is held in a row order of plangen's own: it cannot "
        "follow Hugging Face's layout; torch.distributed.checkpoint.state_dict's optimizer functions resume it "
        "at the same layout only"
    )


def get_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    submodules: Any = None,
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """torch's ``get_optimizer_state_dict``, with re-laid-out parameters' states in Hugging Face's layout
    (see the module docstring). Call on every rank."""
    options = options or StateDictOptions()
    sharded_options = dataclasses.replace(options, full_state_dict=False, cpu_offload=False)
    kwargs = {"submodules": submodules} if submodules is not None else {}
    state_dict = torch_state_dict.get_optimizer_state_dict(model, optimizers, options=sharded_options, **kwargs)
    relaid = _relaid_parameters(model)
    if isinstance(state_dict.get(_STATE), dict):
        # The nested form's per-parameter dicts are the optimizer's own: write into copies, never into them.
        state_dict[_STATE] = {fqn: dict(s) if fqn in relaid else s for fqn, s in state_dict[_STATE].items()}
    for container, key, fqn, name in list(_per_parameter_states(state_dict, relaid)):
        entry = relaid[fqn]
        if _is_per_element(container[key], entry.parameter, fqn, name):
            container[key] = hugging_face_value(entry.module, entry.name, container[key])
    if options.full_state_dict:
        return _gathered(state_dict, options.cpu_offload)
    if options.cpu_offload:
        return tree_map_only(torch.Tensor, lambda t: t.cpu(), state_dict)
    return state_dict


def set_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    optim_state_dict: dict[str, Any],
    *,
    options: StateDictOptions | None = None,
) -> None:
    """torch's ``set_optimizer_state_dict`` for what :func:`get_optimizer_state_dict` gives (sharded, or
    whole with ``full_state_dict=True``), at this model's layout. Call on every rank."""
    options = options or StateDictOptions()
    relaid = _relaid_parameters(model)
    state_dict = dict(optim_state_dict)
    if isinstance(state_dict.get(_STATE), dict):
        state_dict[_STATE] = {fqn: dict(s) if fqn in relaid else s for fqn, s in state_dict[_STATE].items()}
    for container, key, fqn, name in list(_per_parameter_states(state_dict, relaid)):
        value, entry = container[key], relaid[fqn]
        if isinstance(value, HuggingFaceLayoutTensor):
            container[key] = value.parameter_value()  # the state's own storage, loaded in place by DCP
        elif isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() > 0:
            container[key] = _in_parameter_layout(value, entry, fqn, name)
    torch_state_dict.set_optimizer_state_dict(model, optimizers, state_dict, options=options)


def _in_parameter_layout(whole: torch.Tensor, entry: _Relaid, fqn: str, name: str) -> torch.Tensor:
    """A whole state in Hugging Face's layout put in the parameter's rows (pad rows zero, as an untrained
    pad row's state is)."""
    expected = entry.rows.hf_shape(entry.parameter.shape)
    if tuple(whole.shape) != expected:
        raise ValueError(
            f"{fqn}: the optimizer's state {name!r} has shape {tuple(whole.shape)}; in Hugging Face's layout it is {expected}"
        )
    return entry.rows.from_hugging_face(whole)


def _gathered(state_dict: dict[str, Any], cpu_offload: bool) -> dict[str, Any]:
    """Every state whole (a re-laid-out one in Hugging Face's layout: its ``full_tensor``), one at a
    time; with ``cpu_offload`` on rank 0's CPU and nowhere else (torch's convention)."""
    keep = not cpu_offload or not dist.is_initialized() or dist.get_rank() == 0

    def whole(value: torch.Tensor) -> torch.Tensor:
        value = value.full_tensor() if isinstance(value, DTensor) else value
        return value.cpu() if cpu_offload else value

    gathered = tree_map_only(torch.Tensor, whole, state_dict)
    return gathered if keep else {}

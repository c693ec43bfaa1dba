"""Running a module on local tensors: its parameters swapped for local values during its forward.

Many styles let their module compute on this rank's shards as plain tensors (a fused projection's
rows, a KV head's rows, experts' local weights, a mixer's channels, replicated weights whose gradient
is summed over TP): the module's parameters stay DTensors, which FSDP2, optimizers and state dicts
see, and are replaced by local values only while the module's forward runs. That swap, and putting
the parameters back after the forward (also when it raised), is written once here: a style says what
the local value of each parameter is, and what it does to the inputs and the output around it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class LocalParameters:
    """The parameters replaced for one forward: :meth:`replace` replaces one, :meth:`restore` puts them all back."""

    def __init__(self) -> None:
        self._held: list[tuple[nn.Module, str, Any]] = []

    def replace(self, owner: nn.Module, name: str, value: torch.Tensor) -> None:
        """``owner.<name>`` reads ``value`` until :meth:`restore` (``value`` need not be a Parameter)."""
        self._held.append((owner, name, owner._parameters[name]))
        owner._parameters[name] = value  # type: ignore[assignment]

    def local_views(self, owner: nn.Module, names: tuple[str, ...] | None = None, **to_local: Any) -> None:
        """Each DTensor parameter of ``owner`` (of ``names`` only, when given) replaced by its local
        view, ``to_local(**to_local)``: its backward hands the gradient back in the DTensor's
        placements, or in ``grad_placements`` where given."""
        for name in names if names is not None else list(owner._parameters):
            param = owner._parameters.get(name)
            if isinstance(param, DTensor):
                self.replace(owner, name, param.to_local(**to_local))

    def restore(self) -> None:
        """Every swapped parameter put back, last swapped first."""
        while self._held:
            owner, name, param = self._held.pop()
            owner._parameters[name] = param


Enter = Callable[[LocalParameters, nn.Module, tuple, dict], "tuple[tuple, dict] | None"]
Leave = Callable[[nn.Module, tuple, dict, Any], Any]


def run_on_local_tensors(module: nn.Module, enter: Enter, leave: Leave | None = None) -> LocalParameters:
    """During each forward of ``module``, ``enter(params, module, args, kwargs)`` swaps parameters
    (:meth:`LocalParameters.replace`) and may return new ``(args, kwargs)``. After the forward, also
    when it raised, the parameters are put back first, then ``leave(module, args, kwargs, output)``
    may return a new output (``output`` is None after an exception: nothing to hand on)."""
    params = LocalParameters()

    def swap_in(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        return enter(params, mod, args, kwargs)

    def put_back(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        params.restore()
        return None if leave is None else leave(mod, args, kwargs, output)

    module.register_forward_pre_hook(swap_in, with_kwargs=True)
    # always_call: an exception inside forward must not leave local tensors in place of the parameters.
    module.register_forward_hook(put_back, with_kwargs=True, always_call=True)
    return params


def local_views_during_forward(module: nn.Module, **to_local: Any) -> None:
    """The simplest case: during each forward, every DTensor parameter of ``module`` is its local view."""
    run_on_local_tensors(module, lambda params, mod, args, kwargs: params.local_views(mod, **to_local))

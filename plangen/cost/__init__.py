"""``plangen cost``: what a plan costs per rank and per step, beside the alternatives.

* :mod:`~plangen.cost.settings` — the step costed (sizes, batch, dtypes) and :class:`CostError`;
* :mod:`~plangen.cost.choices` — the plans by name (hand-written, hf, nemo, a file);
* :mod:`~plangen.cost.memory` — parameters, gradients and AdamW state per rank;
* :mod:`~plangen.cost.fsdp` — FSDP2's collectives, from the units' parameters;
* :mod:`~plangen.cost.measure` and :mod:`~plangen.cost.scaling` — TP collectives measured on shrunk
  models and scaled to the real one (the formula: ``docs/cost.md``);
* :mod:`~plangen.cost.report` — :func:`build_cost_report`, the one entry point;
* :mod:`~plangen.cost.peak` — ``measure_peak``: one training step traced with fake tensors, its peak
  memory per rank by kind (``--peak``); :mod:`~plangen.cost.fit` — the layouts that fit (``--fit``);
* :mod:`~plangen.cost.render` — the table and the JSON.

Only the settings are imported here, so that importing the package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plangen.cost.settings import CostError, CostSettings, build_cost_settings

if TYPE_CHECKING:  # pragma: no cover
    from plangen.cost.data import CostReport


def build_cost_report(*args: Any, **kwargs: Any) -> "CostReport":
    """See :func:`plangen.cost.report.build_cost_report`."""
    from plangen.cost.report import build_cost_report as build

    return build(*args, **kwargs)


__all__ = ["CostError", "CostSettings", "build_cost_report", "build_cost_settings"]

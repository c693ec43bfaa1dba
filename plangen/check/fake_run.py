"""One forward and backward of the shrunk model under a plan, on a single-process fake process group.

Level 2's last check (PG215): the plan is applied by the runtime itself
(:func:`plangen.parallelize.parallelize_model`) to the shrunk model of the same architecture, at the
plan's own TP size, on a fake process group (collectives do nothing, every shape is real), in this
process: no gloo, no worker, a fraction of a second. A failure is charged to the plan entry that
caused it, not to the module that crashed: hooks record which planned modules ran and what layout
each one's output really had (plain or DTensor, which dims are split, against the unsharded
model's shapes), and the entry whose output stands out from the others that meet where it failed
is the culprit (:mod:`plangen.check.blame`).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from plangen.check.blame import RunRecorder, attribute_failure, batch_split, key_for_module, record_shapes
from plangen.output.errors import one_line
from plangen.model.module_tree import ModuleIndex, generalize

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass(frozen=True)
class FakeRunFailure:
    """Where the run failed (``stage``: apply, forward, backward, shapes), why, and the entry to blame."""

    stage: str
    error: str
    key: str | None
    module: str | None = None


def _first_failing_key(model: "nn.Module", styles: Mapping[str, "ParallelStyle"], mesh) -> str | None:
    """Apply the plan key by key to a fresh copy: the first key that raises is the culprit."""
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.plans.checks import resolve_tied_styles

    fresh = copy.deepcopy(model)
    for key, style in resolve_tied_styles(fresh, styles).items():
        try:
            parallelize_module(fresh, mesh, {key: style})
        except Exception:  # noqa: BLE001 - locating the failure, whatever it is
            return key
    return None


# --- the run ---------------------------------------------------------------------------------------


def run_on_fake_group(
    model: "nn.Module", styles: Mapping[str, "ParallelStyle"], tp_size: int, sequence_parallel: bool
) -> FakeRunFailure | None:
    """Apply ``styles`` to a copy of the shrunk ``model`` at ``tp_size``, run one forward and backward;
    None when every shape and every gradient is there. Raises FakeGroupError where no fake group can
    be made (a real process group is running in this process)."""
    import sys

    # init_process_group installs an excepthook that prefixes "[rank0]:" to every traceback of the
    # process, and keeps it after the group is gone: verify's own process is not a rank.
    excepthook = sys.excepthook
    try:
        return _run_on_fake_group(model, styles, tp_size, sequence_parallel)
    finally:
        sys.excepthook = excepthook


def _run_on_fake_group(
    model: "nn.Module", styles: Mapping[str, "ParallelStyle"], tp_size: int, sequence_parallel: bool
) -> FakeRunFailure | None:
    """Apply ``styles`` to a copy of the shrunk ``model`` at ``tp_size``, run one forward and backward;
    None when every shape and every gradient is there. Raises FakeGroupError where no fake group can
    be made (a real process group is running in this process)."""
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from plangen.check.run import next_token_loss, sample_batch
    from plangen.distributed.fake_group import fake_process_group, quiet_fake_tensor_log
    from plangen.parallelize import parallelize_model

    reference, model = copy.deepcopy(model), copy.deepcopy(model)
    ids = sample_batch(reference, tp_size)
    with torch.enable_grad():
        shapes = record_shapes(reference, ids)
        ref_logits = reference(input_ids=ids).logits
        next_token_loss(ref_logits, ids).backward()
    index = ModuleIndex(model)
    covering = {path: key for key in styles for path in index.paths(key)}
    with fake_process_group(tp_size), quiet_fake_tensor_log(), _quiet_torch_logs(), warnings.catch_warnings(), \
            torch.random.fork_rng(devices=[]):  # fmt: skip
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", (1, tp_size), mesh_dim_names=("dp", "tp"))
        try:
            sharded = parallelize_model(
                model, mesh["dp"], mesh["tp"], torch.float32,
                sequence_parallel=sequence_parallel, custom_parallel_plan=dict(styles),
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - the plan could not be applied
            key = _first_failing_key(reference, styles, mesh["tp"])
            return FakeRunFailure("apply", one_line(error, part="first", with_type=True), key)
        recorder = RunRecorder(sharded, covering, shapes)
        try:
            with torch.enable_grad():
                logits = sharded(input_ids=ids).logits
        except Exception as error:  # noqa: BLE001
            key, module = attribute_failure(recorder, styles)
            return FakeRunFailure("forward", one_line(error, part="first", with_type=True), key, module)
        finally:
            recorder.remove()
        if tuple(logits.shape) != tuple(ref_logits.shape):
            key = batch_split(recorder) or recorder.covering.get("lm_head")
            return FakeRunFailure(
                "forward", f"logits have shape {list(logits.shape)}, not {list(ref_logits.shape)}", key
            )
        try:
            with torch.enable_grad():
                next_token_loss(logits, ids).backward()
        except Exception as error:  # noqa: BLE001
            return FakeRunFailure("backward", one_line(error, part="first", with_type=True), batch_split(recorder))
        missing, shapes = _gradient_shapes(reference, sharded)
    missing = [name for name in missing if not _routed_by_values(reference, name)]
    if missing:
        return FakeRunFailure(
            "backward", f"`{missing[0]}` gets no gradient", key_for_module(styles, missing[0].rpartition(".")[0])
        )
    if shapes:
        name, (got, want) = next(iter(shapes.items()))
        return FakeRunFailure(
            "backward",
            f"the gradient of `{name}` has shape {got}, not {want}",
            key_for_module(styles, name.rpartition(".")[0]),
        )
    return None


def _routed_by_values(model: "nn.Module", name: str) -> bool:
    """Whether parameter ``name`` belongs to routed experts (packed or flat, however split): on a fake
    group a collective's output holds this rank's values only, never the sum or the gather, the router
    picks from those, and which experts run (any, where a router also has zero-compute experts:
    LongCat-Flash) follows them. Whether they get a gradient
    is level 3's to check, with real values."""
    from plangen.plan.style_facts import EXPERTS, FLAT_EXPERTS
    from plangen.styles.kinds import module_kind

    return module_kind(model.get_submodule(name.rpartition(".")[0])) in (EXPERTS, FLAT_EXPERTS)


def _gradient_shapes(
    reference: "nn.Module", sharded: "nn.Module"
) -> tuple[list[str], dict[str, tuple[list[int], list[int]]]]:
    """The parameters that lost their gradient, and those whose gradient has another (global) shape
    than the unsharded model's: a DTensor knows its global shape, so nothing is gathered."""
    from plangen.styles.padded_heads import hugging_face_shape

    grads = {name: p.grad for name, p in sharded.named_parameters() if p.grad is not None}
    missing, shapes = [], {}
    for name, param in reference.named_parameters():
        if param.grad is None:
            continue
        if name not in grads:
            missing.append(name)
            continue
        # Zero heads padding the query heads (plangen.styles.padded_heads) are not Hugging Face's: their shape without.
        got = hugging_face_shape(sharded, name, tuple(grads[name].shape))
        if got != tuple(param.grad.shape):
            shapes[name] = (list(got), list(param.grad.shape))
    return missing, shapes


@contextmanager
def _quiet_torch_logs():
    """torch logs a warning for each redistribution it finds slow and each collective the CPU group
    emulates: what a fake run does by design, not news for the plan's author."""
    import logging

    from plangen.stack.torch_compat import TORCH_LOGGERS

    loggers = [logging.getLogger(name) for name in TORCH_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def describe_module(path: str | None) -> str:
    return f" in `{generalize(path)}`" if path else ""

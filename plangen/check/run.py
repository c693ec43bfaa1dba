"""Level 3 of ``plangen verify`` (``--run``): apply each plan for real on CPU, in two stages.

1. Shapes: one process, a fake process group at the plan's own TP size. Collectives do nothing, so
   the numbers are meaningless, but every shape of the forward and the backward is the real one: a
   plan that breaks a matmul, loses a gradient or returns logits of the wrong size fails here, at
   any TP size, in a fraction of a second.
2. Parity: gloo, TP=2, two processes (``plangen prove`` adds DP=2 x TP=2 with FSDP2, four). Logits
   and every parameter gradient against the unsharded model, within :data:`TOLERANCE`; the first
   parameter (in the model's order) that differs is named.

Both stages run a shrunk model of the same architecture (:func:`plangen.model.shrink.build_tiny_model`)
through the runtime itself (:func:`plangen.parallelize.parallelize_model`), each in one launch of
:func:`plangen.distributed.launch.run_distributed` for every plan file: bounded in time, a failing or hung
rank ends the run with a finding, never a hung CI job. Progress is reported through a callback as
each case starts, read from a file the workers append to.

The harness core (:func:`next_token_loss`, :func:`full_tensor`, :func:`sample_batch`,
:func:`compare_gradients`) is shared with the multi-process tests (``tests/distributed/cases.py``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from plangen.check.blame import key_for_module
from plangen.check.model_plan import ModelFinding
from plangen.check.rules.run import DiffersFromUnshardedRule, FailsAtTpSizeRule, RunFailedRule
from plangen.check.shrunk import matching_styles
from plangen.output.errors import one_line
from plangen.check.shrunk import sample_batch

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

TOLERANCE = 1e-5
PARITY_TP_SIZE = 2
SHAPES_TARGET = "plangen.check.run:check_shapes_worker"
PARITY_TARGET = "plangen.check.run:check_parity_worker"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunTarget:
    """One plan file to run: its model spec, the TP size it is for, and whether it is sequence parallel."""

    path: str
    model: str
    tp_size: int
    sequence_parallel: bool
    dp_size: int = 1  # the parity stage's FSDP2 size (its TP size is PARITY_TP_SIZE)
    compile: bool = False  # the parity stage compiles each decoder layer (parallelize_model(compile=True))

    def parity_mesh(self) -> str:
        """Where the parity stage runs it, as findings and progress name it."""
        tp = f"TP={PARITY_TP_SIZE}"
        return f"DP={self.dp_size} x {tp}" if self.dp_size > 1 else tp


# --- the harness core -----------------------------------------------------------------------------


def full_tensor(tensor: "torch.Tensor") -> "torch.Tensor":
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_parameter(model: "nn.Module", name: str, tensor: "torch.Tensor") -> "torch.Tensor":
    """Whole parameter (or gradient) ``name`` in Hugging Face's layout (fused ones are re-laid out)."""
    from plangen.styles.fused import hugging_face_layout

    return hugging_face_layout(model, name, full_tensor(tensor))


def next_token_loss(logits: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """Cross-entropy of each next token; vocabulary-parallel logits are never gathered."""
    from torch.distributed.tensor import DTensor, Shard

    from plangen.loss import vocab_parallel_cross_entropy

    if isinstance(logits, DTensor) and not any(
        isinstance(p, Shard) and p.dim % logits.ndim == logits.ndim - 1 for p in logits.placements
    ):
        logits = logits.full_tensor()  # a DTensor not split on the vocabulary: the plain loss
    return vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:])


def compare_gradients(reference: "nn.Module", sharded: "nn.Module") -> dict[str, Any]:
    """Each parameter's gradient against the reference's, in the reference's order.

    Every rank gathers every gradient (a collective), so ranks stay in step even when one differs.
    """
    grads = {name: p.grad for name, p in sharded.named_parameters() if p.grad is not None}
    differences: dict[str, float] = {}
    shapes: dict[str, list[list[int]]] = {}
    missing: list[str] = []
    for name, param in reference.named_parameters():
        if param.grad is None:
            continue
        if name not in grads:
            missing.append(name)
            continue
        grad = full_parameter(sharded, name, grads[name])
        if tuple(grad.shape) != tuple(param.grad.shape):
            shapes[name] = [list(grad.shape), list(param.grad.shape)]
            continue
        differences[name] = (grad - param.grad).abs().max().item()
    first = next((n for n, d in differences.items() if not d <= TOLERANCE), None)
    return {"first_differing": first, "difference": differences.get(first) if first else None,
            "missing": missing, "shapes": shapes}  # fmt: skip


# --- one case, inside a worker --------------------------------------------------------------------


def _build_case(case: Mapping[str, Any], tp_size: int):
    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import build_tiny_model
    from plangen.plan.source import load_custom_plan

    model = build_tiny_model(resolve_model(case["model"]), tp_size=tp_size, seed=0)
    styles = matching_styles(model, load_custom_plan(case["path"]))
    return model, styles


def _first_failing_key(case: Mapping[str, Any], tp_size: int, mesh) -> str | None:
    """Apply the plan key by key to a fresh model: the first key that raises is the culprit."""
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.plans.checks import resolve_tied_styles

    model, styles = _build_case(case, tp_size)
    for key, style in resolve_tied_styles(model, styles).items():
        try:
            parallelize_module(model, mesh, {key: style})
        except Exception:  # noqa: BLE001 - locating the failure, whatever it is
            return key
    return None


# Classes checked in float64 (model and reference), and why float32 cannot hold the check's 1e-5
# (the sweep, scripts/sweep_plans.py, too).
FLOAT64_CHECKS = {
    "RwkvForCausalLM": "its embeddings are initialised at ~1e-4 and read by a LayerNorm (pre_ln), whose "
    "backward multiplies by 1/sqrt(eps) ~ 316: the embedding's gradient is ~27, so 1e-5 is 4e-7 of it, "
    "below float32's resolution of a reordered sum (every other gradient agrees within 3e-7 in float32)",
}


def run_case(case: Mapping[str, Any], tp_size: int, mesh, compare: bool) -> dict[str, Any]:
    """Build, parallelize, forward and backward one plan on a shrunk model; a JSON-able result.

    ``compare``: logits and gradients against the unsharded model (real collectives); otherwise
    only their shapes (a fake process group computes no real numbers).
    """
    import copy

    import torch

    from plangen.parallelize import parallelize_model
    from plangen.plans.checks import plan_heads_problem

    try:
        model, styles = _build_case(case, tp_size)
    except Exception as error:  # noqa: BLE001 - the plan or the model could not be built
        return {"stage": "load", "error": one_line(error, part="first", with_type=True)}
    problem = plan_heads_problem(model, styles, tp_size)
    if problem is not None:
        return {"skipped": problem}
    dtype = torch.float64 if type(model).__name__ in FLOAT64_CHECKS else torch.float32
    model = model.to(dtype)
    from plangen.check.blame import RunRecorder, attribute_failure, record_shapes
    from plangen.model.module_tree import ModuleIndex

    # Compiled at the gloo stage only: the fake group's stage has checked the plan eagerly, with the
    # recorder's hooks on every module (hooks that would be compiled into the layers).
    compiled = compare and case.get("compile", False)
    reference = copy.deepcopy(model)
    ids = sample_batch(model, tp_size)
    shapes = record_shapes(reference, ids)
    ref_logits = reference(input_ids=ids).logits
    next_token_loss(ref_logits, ids).backward()
    try:
        sharded = parallelize_model(
            model, mesh["dp"], mesh["tp"], dtype,
            sequence_parallel=case["sequence_parallel"], custom_parallel_plan=styles,
            compile=compiled,
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001
        return {
            "stage": "apply",
            "error": one_line(error, part="first", with_type=True),
            "key": _first_failing_key(case, tp_size, mesh["tp"]),
        }
    index = ModuleIndex(sharded)
    # The entry that caused a failure, not the module that crashed (plangen.check.fake_run).
    recorder = (
        None if compiled else RunRecorder(sharded, {path: key for key in styles for path in index.paths(key)}, shapes)
    )
    try:
        logits = sharded(input_ids=ids).logits
    except Exception as error:  # noqa: BLE001
        key, module = attribute_failure(recorder, styles) if recorder is not None else (None, None)
        return {
            "stage": "forward",
            "error": one_line(error, part="first", with_type=True),
            "module": module,
            "key": key,
        }
    finally:
        if recorder is not None:
            recorder.remove()
    if tuple(logits.shape) != tuple(ref_logits.shape):
        return {"stage": "forward", "error": f"logits have shape {list(logits.shape)}, not {list(ref_logits.shape)}",
                "key": key_for_module(styles, "lm_head")}  # fmt: skip
    try:
        next_token_loss(logits, ids).backward()
    except Exception as error:  # noqa: BLE001
        return {"stage": "backward", "error": one_line(error, part="first", with_type=True)}
    result: dict[str, Any] = compare_gradients(reference, sharded)
    result["logits"] = (full_tensor(logits) - ref_logits).abs().max().item() if compare else None
    first = result["first_differing"] if compare else None
    if result["missing"] or result["shapes"] or first or (compare and not result["logits"] <= TOLERANCE):
        name = (result["missing"] or list(result["shapes"]) or [first])[0]
        result["key"] = key_for_module(styles, name.rpartition(".")[0]) if name else None
    return result


# --- the workers (run by plangen.distributed.launch, after it made a gloo group) -------------------------------


def _report(progress_dir: str | None, record: dict[str, Any]) -> None:
    """Append a record to this rank's progress file (one file per rank: no interleaved writes)."""
    if progress_dir:
        rank = int(os.environ.get("RANK", "0"))
        with open(Path(progress_dir) / f"rank{rank}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({**record, "rank": rank}) + "\n")


def _quietly(fn: Callable[[], Any]) -> Any:
    """Torch warns, with a module's whole repr, for each layer a key does not select in a shrunk model."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def check_shapes_worker(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Stage 1: each case on a fake process group of its own TP size, in this one process."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        dist.destroy_process_group()  # the launcher's gloo group of one: a fake group takes its place
    results = []
    world = None
    try:
        for index, case in enumerate(payload["cases"]):
            tp_size = case["tp_size"]
            if world != tp_size:
                if dist.is_initialized():
                    dist.destroy_process_group()
                dist.init_process_group("fake", rank=0, world_size=tp_size)
                world = tp_size
            _report(payload.get("progress"), {"stage": "shapes", "case": index, "event": "start"})
            mesh = init_device_mesh("cpu", (1, tp_size), mesh_dim_names=("dp", "tp"))
            with torch.random.fork_rng(devices=[]):
                result = _quietly(lambda: run_case(case, tp_size, mesh, compare=False))
            _report(payload.get("progress"), {"stage": "shapes", "case": index, "event": "done", "result": result})
            results.append(result)
    finally:
        if not dist.is_initialized():  # the launcher destroys a group when this returns
            dist.init_process_group("fake", rank=0, world_size=1)
    return results


def check_parity_worker(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Stage 2: each case at TP=2 over gloo (DP x TP=2 in a launch of DP x 2 ranks), against the
    unsharded model on every rank (every DP rank runs the same batch: their mean is its gradient)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dp_size = dist.get_world_size() // PARITY_TP_SIZE
    mesh = init_device_mesh("cpu", (dp_size, PARITY_TP_SIZE), mesh_dim_names=("dp", "tp"))
    results = []
    for index, case in enumerate(payload["cases"]):
        _report(payload.get("progress"), {"stage": "parity", "case": index, "event": "start"})
        with torch.random.fork_rng(devices=[]):
            result = _quietly(lambda: run_case(case, PARITY_TP_SIZE, mesh, compare=True))
        _report(payload.get("progress"), {"stage": "parity", "case": index, "event": "done", "result": result})
        results.append(result)
    return results


# --- the parent side -------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    findings: dict[str, list[ModelFinding]]  # path -> findings
    notes: list[str]


class _ProgressReader(threading.Thread):
    """Tails the workers' progress files: reports each case as rank 0 starts it, keeps what each
    rank started and finished, so a launch that dies can be charged to the case it died in.

    ``cases`` maps a launch's case numbers to the stage's (a relaunch runs the remaining ones).
    """

    def __init__(self, folder: Path, stage: str, targets: list[RunTarget], cases: list[int], progress: Progress | None):
        super().__init__(daemon=True)
        self.folder, self.stage, self.targets, self.cases, self.progress = folder, stage, targets, cases, progress
        self.done: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> case -> result
        self.running: dict[int, int | None] = {}  # rank -> case
        self.stopped = threading.Event()

    def run(self) -> None:
        offsets: dict[Path, int] = {}
        while True:
            stopping = self.stopped.is_set()
            for path in sorted(self.folder.glob("rank*.jsonl")):
                with open(path, "rb") as file:
                    file.seek(offsets.get(path, 0))
                    for line in iter(file.readline, b""):
                        if not line.endswith(b"\n"):
                            break  # a record still being written: read it whole next time
                        offsets[path] = offsets.get(path, 0) + len(line)
                        self._read(json.loads(line))
            if stopping:
                return
            self.stopped.wait(0.1)

    def _read(self, record: dict[str, Any]) -> None:
        index, rank = self.cases[record["case"]], record["rank"]
        if record["event"] == "start":
            self.running[rank] = index
            if self.progress is not None and rank == 0:
                target = self.targets[index]
                where = (
                    f"TP={target.tp_size}, fake process group"
                    if self.stage == "shapes"
                    else f"{target.parity_mesh()}, gloo"
                )
                self.progress(f"[{self.stage} {index + 1}/{len(self.targets)}] {target.path} ({where})")
        else:
            self.done.setdefault(rank, {})[index] = record["result"]
            self.running[rank] = None

    def finished(self, world_size: int) -> dict[int, dict[str, Any]]:
        """The cases every rank finished, each rank's error first."""
        results = {}
        for index in self.cases:
            per_rank = [self.done.get(rank, {}).get(index) for rank in range(world_size)]
            if all(r is not None for r in per_rank):
                results[index] = next((r for r in per_rank if "error" in r), per_rank[0])
        return results

    def culprit(self, failed_rank: int | None, finished: dict[int, dict[str, Any]]) -> int | None:
        """The case a dead (or, without a rank, the slowest hung) launch was in."""
        if failed_rank is not None and self.running.get(failed_rank) is not None:
            return self.running[failed_rank]
        running = [i for i in self.running.values() if i is not None and i not in finished]
        if running:
            return min(running)
        return next((i for i in self.cases if i not in finished), None)

    def finish(self) -> None:
        self.stopped.set()
        self.join()


def _launch(
    target: str, world_size: int, stage: str, targets: list[RunTarget], deadline: float, progress: Progress | None
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Run one stage for every target: (results by case, errors by case).

    A launch that ends early (a rank died or hung) charges its error to the case that rank was in
    and is started again for the cases after it, while time is left: one broken plan does not hide
    the verdict on the others.
    """
    results: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    pending = list(range(len(targets)))
    while pending and time.monotonic() < deadline:
        got, error, culprit = _launch_once(target, world_size, stage, targets, pending, deadline, progress)
        results.update(got)
        if error is None or culprit is None:
            break
        errors[culprit] = error
        pending = [i for i in pending if i not in results and i != culprit]
    return results, errors


def _launch_once(
    target: str,
    world_size: int,
    stage: str,
    targets: list[RunTarget],
    cases: list[int],
    deadline: float,
    progress: Progress | None,
) -> tuple[dict[int, dict[str, Any]], str | None, int | None]:
    """One launch for ``cases``: (results by case, the launch's error, the case it ended in)."""
    from plangen.distributed.launch import DistributedRunError, run_distributed

    with tempfile.TemporaryDirectory(prefix="plangen-verify-") as tmp:
        reader = _ProgressReader(Path(tmp), stage, targets, cases, progress)
        reader.start()
        payload = {"cases": [asdict(targets[i]) for i in cases], "progress": tmp}
        try:
            per_rank = run_distributed(target, world_size, payload, timeout=max(1.0, deadline - time.monotonic()))
        except DistributedRunError as failure:
            reader.finish()
            finished = reader.finished(world_size)
            text = str(failure)
            rank = re.search(r"\brank(\d+) failed", text)
            culprit = reader.culprit(int(rank.group(1)) if rank else None, finished)
            return finished, _launch_error(text, world_size), culprit
        reader.finish()
    results = {}
    for position, index in enumerate(cases):
        per_case = [rank[position] for rank in per_rank]
        results[index] = next((r for r in per_case if "error" in r), per_case[0])
    return results, None, None


def _launch_error(text: str, world_size: int) -> str:
    """One line from :class:`plangen.distributed.launch.DistributedRunError`'s text: which rank, and why."""
    if "still running after" in text or "no result after" in text:
        # A hang and a slow run look the same from here: say both, and what to do about the second.
        return (
            "no result within the time limit (--timeout), so the run was stopped: a rank hung (a"
            " collective the other ranks never join) or the run needs longer (raise --timeout)"
        )
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    rank = re.search(r"\brank(\d+) failed", text)
    who = f"rank {rank.group(1)}" if rank else "the launcher"
    return f"{who} failed: {lines[-1] if lines else text}"


def check_run(targets: list[RunTarget], timeout: float = 600.0, progress: Progress | None = None) -> RunOutcome:
    """Level-3 findings for each target (by path), and notes on what was skipped."""
    outcome = RunOutcome({t.path: [] for t in targets}, [])
    if not targets:
        return outcome
    deadline = time.monotonic() + timeout
    if progress is not None:
        progress(f"shapes: {len(targets)} plan(s) on a fake process group at their own TP size")
    results, errors = _launch(SHAPES_TARGET, 1, "shapes", targets, deadline, progress)
    passed = _collect(outcome, targets, results, errors, "shapes")
    if not passed:
        return outcome
    # One launch per mesh size: DP x TP=2 ranks each.
    for dp_size in sorted({t.dp_size for t in passed}):
        group = [t for t in passed if t.dp_size == dp_size]
        where = group[0].parity_mesh()
        if time.monotonic() >= deadline:
            outcome.notes += [f"{t.path}: parity at {where} not run: --timeout reached" for t in group]
            continue
        if progress is not None:
            compiled = ", decoder layers compiled" if any(t.compile for t in group) else ""
            progress(f"parity: {len(group)} plan(s) at {where} over gloo against the unsharded model{compiled}")
        results, errors = _launch(PARITY_TARGET, dp_size * PARITY_TP_SIZE, "parity", group, deadline, progress)
        _collect(outcome, group, results, errors, "parity")
    return outcome


def _collect(
    outcome: RunOutcome,
    targets: list[RunTarget],
    results: dict[int, dict[str, Any]],
    errors: dict[int, str],
    stage: str,
) -> list[RunTarget]:
    """Turn a stage's results into findings; returns the targets that passed it."""
    passed = []
    for index, target in enumerate(targets):
        result = results.get(index)
        if index in errors:
            where = f"TP={target.tp_size}, fake process group" if stage == "shapes" else f"{target.parity_mesh()}, gloo"
            outcome.findings[target.path].append(
                RunFailedRule.finding(f"the run ({stage}, {where}) ended: {errors[index]}")
            )
            continue
        if result is None:
            outcome.notes.append(f"{target.path}: {stage} not checked: --timeout reached first")
            continue
        if "skipped" in result:
            outcome.notes.append(f"{target.path}: {stage} not checked: {result['skipped']}")
            continue
        finding = _finding(stage, target, result)
        if finding is None:
            passed.append(target)
        else:
            outcome.findings[target.path].append(finding)
    return passed


def _finding(stage: str, target: RunTarget, result: dict[str, Any]) -> ModelFinding | None:
    mesh = f"TP={target.tp_size}" if stage == "shapes" else target.parity_mesh()
    key = result.get("key")
    if "error" in result:
        where = f" in `{result['module']}`" if result.get("module") else ""
        what = {"load": "loading the plan", "apply": "applying the plan"}.get(result["stage"], result["stage"])
        rule = FailsAtTpSizeRule if stage == "shapes" else RunFailedRule
        return rule.finding(f"at {mesh}, {what} fails{where}: {result['error']}", key)
    if result["missing"]:
        return FailsAtTpSizeRule.finding(f"at {mesh}, `{result['missing'][0]}` gets no gradient", key)
    if result["shapes"]:
        name, (got, want) = next(iter(result["shapes"].items()))
        return FailsAtTpSizeRule.finding(f"at {mesh}, the gradient of `{name}` has shape {got}, not {want}", key)
    if stage == "shapes":
        return None
    logits, first = result["logits"], result["first_differing"]
    if logits <= TOLERANCE and first is None:
        return None
    parts = [] if logits <= TOLERANCE else [f"logits differ by {logits:.1e}"]
    if first is not None:
        parts.append(f"the first gradient that differs is `{first}`'s, by {result['difference']:.1e}")
    return DiffersFromUnshardedRule.finding(
        f"at {mesh} against the unsharded model (tolerance {TOLERANCE:g}): {'; '.join(parts)}", key
    )

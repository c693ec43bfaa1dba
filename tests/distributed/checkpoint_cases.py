"""Worker side of tests/test_checkpoints_distributed.py: save, resume at other layouts, export, per layout kind.

Per case (a tiny model of one plangen layout), at DP 2 x TP 2 on 4 gloo ranks:

- the bytes each rank holds beyond its shard (new storages alive, :class:`LiveBytes`: floating-point
  ones, the weights and their copies; ``*_all`` counts every storage, DCP's pickled plans and index
  tensors too) at their peak
  during ``model.state_dict()``, ``get_model_state_dict``, ``dcp.save`` and the export
  (``iter_hf_weights``, one parameter and 3-parameter buckets), beside its shard and its largest parameter;
- the streamed names and values against the unsharded model's state dict (ties once);
- a ``dcp.save`` at DP 2 x TP 2 loaded at DP 1 x TP 4, DP 4 x TP 1 and into the plain model (weights
  perturbed first), read back whole (``get_model_state_dict(full_state_dict=True)``);
- ``save_hf_checkpoint`` loaded by ``AutoModelForCausalLM.from_pretrained``: its logits against the
  unsharded model's (rank 0).
"""

from __future__ import annotations

import copy
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed.cases import BATCH, SEQ, build_case_model, build_case_plan, result_or_error  # noqa: E402

from plangen.check.run import full_parameter, next_token_loss  # noqa: E402

from plangen.parallelize import parallelize_model  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages made by ops run under it and still alive: ``now`` and ``peak`` (each
    storage once, however many views; a DTensor's by its local tensor's; meta tensors not)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0
        self.now_float = self.peak_float = 0  # floating-point storages only: weights and their copies
        self._alive: set[int] = set()

    def _free(self, key: int, nbytes: int, floating: bool) -> None:
        self._alive.discard(key)
        self.now -= nbytes
        self.now_float -= nbytes if floating else 0

    @staticmethod
    def _storages(tree):
        for tensor in tree_leaves(tree):
            if isinstance(tensor, DTensor):
                tensor = tensor._local_tensor
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            try:
                storage = tensor.untyped_storage()
                yield (storage.data_ptr() if storage.nbytes() else id(storage)), storage, tensor.is_floating_point()
            except RuntimeError:  # a wrapper without storage of its own (an async collective's): its inner one is seen
                continue

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {key for key, _, _ in self._storages((args, kwargs))}  # a view or an in-place op: not new
        for key, storage, floating in self._storages(out):
            if key in self._alive or key in inputs:
                continue
            self._alive.add(key)
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            if floating:
                self.now_float += storage.nbytes()
                self.peak_float = max(self.peak_float, self.now_float)
            weakref.finalize(storage, self._free, key, storage.nbytes(), floating)
        return out


def shard_bytes(model: torch.nn.Module) -> int:
    """Bytes of this rank's parameters and buffers (each storage once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def largest_piece(model: torch.nn.Module) -> int:
    """The largest shard of one parameter any rank holds (bytes): what a gather buffers beside its output."""
    from plangen.styles.hf_layout import rank_boxes

    pieces = [0]
    for param in model.parameters():
        if isinstance(param, DTensor):
            boxes = rank_boxes(tuple(param.shape), param.device_mesh, param.placements)
            pieces += [torch.Size(box).numel() * param.element_size() for _, box, _ in boxes]
    return max(pieces)


def _meshes(kind: str):
    shape = {"dp2tp2": (2, 2), "dp1tp4": (1, 4), "dp4tp1": (4, 1)}[kind]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    return mesh["dp"], mesh["tp"]


def _parallelized(case: dict[str, Any], model: torch.nn.Module, kind: str) -> torch.nn.Module:
    dp_mesh, tp_mesh = _meshes(kind)
    return parallelize_model(
        model,
        dp_mesh,
        tp_mesh,
        torch.float32,
        sequence_parallel=case.get("sp", False),
        custom_parallel_plan=build_case_plan(case, model),
    )


def _hf_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's weights, each parameter once (a tied one under its first name)."""
    owners, seen, out = dict(model.named_parameters(remove_duplicate=False)), set(), {}
    for name, value in model.state_dict().items():
        if name in owners:
            if id(owners[name]) in seen:
                continue
            seen.add(id(owners[name]))
        out[name] = value.detach().clone()
    return out


def _peak(fn) -> tuple[tuple[int, int], Any]:
    """((peak bytes of floating-point storages, of all storages) made by ``fn`` and alive, ``fn()``)."""
    with LiveBytes() as tracker:
        result = fn()
        peak = (tracker.peak_float, tracker.peak)
    return peak, result


def _largest_diff(state: dict[str, torch.Tensor], original: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for name, ref in original.items():
        got = state.get(name)
        if got is None or tuple(got.shape) != tuple(ref.shape):
            return float("inf")
        worst = max(worst, (got.float() - ref.float()).abs().max().item() if ref.numel() else 0.0)
    return worst


def run_case(case: dict[str, Any], directory: Path) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from plangen.runtime.export import iter_hf_weights, save_hf_checkpoint

    model = build_case_model(case)
    reference = copy.deepcopy(model).eval()
    original = _hf_state(model)
    largest = max(t.numel() * t.element_size() for t in original.values())
    sharded = _parallelized(case, model, "dp2tp2")
    result: dict[str, Any] = {"shard": shard_bytes(sharded), "largest": largest, "piece": largest_piece(sharded)}

    def hold(key, fn):  # the peaks while the result is made and held
        (result[key], result[f"{key}_all"]), value = _peak(fn)
        del value

    hold("state_dict", sharded.state_dict)
    hold("get_model_state_dict", lambda: get_model_state_dict(sharded))
    checkpoint = directory / f"{case['name']}-dcp"
    hold("dcp_save", lambda: dcp.save(get_model_state_dict(sharded), checkpoint_id=str(checkpoint)))

    def by_hand():  # what users wrote before plangen.runtime.export: each entry gathered in turn, dropped
        for value in sharded.state_dict().values():
            whole = value.full_tensor() if isinstance(value, DTensor) else value
            del whole

    hold("by_hand", by_hand)
    if case.get("before"):  # the code before this change (no plangen.runtime.export): the memory only
        return result

    def stream(bucket_bytes=None):
        names, worst = [], 0.0
        for name, tensor in iter_hf_weights(sharded, bucket_bytes=bucket_bytes):
            names.append(name)
            ref = original.get(name)
            same = ref is not None and tensor.shape == ref.shape and torch.equal(tensor, ref)
            worst = max(worst, 0.0 if same else float("inf"))
            del tensor
        return names, worst

    (result["export"], result["export_all"]), (names, worst) = _peak(stream)
    bucket = 3 * largest
    result["bucket"] = bucket
    (result["export_bucketed"], result["export_bucketed_all"]), (bucket_names, bucket_worst) = _peak(
        lambda: stream(bucket)
    )
    result["streamed_names"] = names == list(original) and bucket_names == names
    result["streamed_missing"] = sorted(set(original) - set(names))[:4] + sorted(set(names) - set(original))[:4]
    result["streamed_diff"] = max(worst, bucket_worst)

    # Resume the DP 2 x TP 2 checkpoint at other layouts and in a plain model, weights perturbed first.
    full = StateDictOptions(full_state_dict=True)
    resumed: dict[str, Any] = {}
    for kind in ("dp1tp4", "dp4tp1", "plain"):
        fresh = build_case_model(case)
        with torch.no_grad():
            for param in fresh.parameters():
                param.add_(1.0)
        try:
            target = fresh if kind == "plain" else _parallelized(case, fresh, kind)
            state = get_model_state_dict(target)
            dcp.load(state, checkpoint_id=str(checkpoint))
            set_model_state_dict(target, state)
            resumed[kind] = _largest_diff(get_model_state_dict(target, options=full), original)
        except Exception as exc:  # noqa: BLE001 - a layout this tiny model has not: reported, judged by the test
            resumed[kind] = f"{type(exc).__name__}: {str(exc)[:300]}"
    result["resumed"] = resumed

    exported = directory / f"{case['name']}-hf"
    save_hf_checkpoint(sharded, exported, max_shard_size=max(largest, 4096))
    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(exported, attn_implementation=case.get("attn", "sdpa")).eval()
        ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            result["hf_logits"] = (loaded(input_ids=ids).logits - reference(input_ids=ids).logits).abs().max().item()
        result["hf_files"] = len(list(exported.glob("*.safetensors")))
    return result


# Adam's lr and eps as tests/distributed/cases.py's train_steps has them: a moment on another row than
# its weight moves that weight by ~lr, ten times the tolerance.
LR, EPS = 1e-4, 1e-6


def _train_step(model: torch.nn.Module, optimizer, ids: torch.Tensor, rows: slice) -> None:
    optimizer.zero_grad(set_to_none=True)
    next_token_loss(model(input_ids=ids[rows]).logits, ids[rows]).backward()
    optimizer.step()


def _dp_rows(dp_mesh) -> slice:
    rank, dp = dp_mesh.get_local_rank(), dp_mesh.size()
    return slice(rank * BATCH // dp, (rank + 1) * BATCH // dp)


def _moments(model, optimizer, get) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    state = get(model, optimizer, options=StateDictOptions(full_state_dict=True))["state"]
    return {f"{fqn}.{k}": v for fqn, s in state.items() for k, v in s.items() if v.dim() > 0}


def _differs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    if got.keys() != want.keys():
        return float("inf")
    return max(
        (g.float() - want[k].float()).abs().max().item() if tuple(g.shape) == tuple(want[k].shape) else float("inf")
        for k, g in got.items()
    )


def run_optimizer_case(case: dict[str, Any], directory: Path) -> dict[str, Any]:
    """AdamW's state saved at DP 2 x TP 2 after two steps (``plangen.runtime.state_dict``), resumed at DP 1 x TP 4,
    DP 4 x TP 1 and in the plain model, then one step more: the resumed moments against the saved ones
    (read back whole in Hugging Face's layout: exact), the saved ones against the unsharded model's
    optimizer, and the weights after the third step against the unsharded model trained three steps.
    Resumed from a DCP checkpoint of the state dict in torch's flattened form (``flatten_optimizer_state_dict``,
    as torchtitan saves it), and (``*_full``) from the whole state dict (``full_state_dict=True``; torch
    2.13 fails to load a whole flattened one by itself). ``torch_*``: the same DCP resume through
    torch's own optimizer functions, nested (the rows in the order plangen holds them)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as torch_functions
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from plangen.runtime import state_dict as plangen_functions

    ids = torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    model = build_case_model(case)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR, eps=EPS, foreach=False)
    for _ in range(2):
        _train_step(reference, reference_optimizer, ids, slice(None))
    unsharded_moments = {
        f"{n}.{k}": v.clone()
        for n, p in reference.named_parameters()
        for k, v in reference_optimizer.state[p].items()
        if v.dim() > 0
    }
    _train_step(reference, reference_optimizer, ids, slice(None))
    trained = dict(reference.named_parameters())

    dp_mesh, _ = _meshes("dp2tp2")
    sharded = _parallelized(case, model, "dp2tp2")
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=LR, eps=EPS, fused=True)
    for _ in range(2):
        _train_step(sharded, optimizer, ids, _dp_rows(dp_mesh))
    whole_options = StateDictOptions(full_state_dict=True)
    flat = {"options": StateDictOptions(flatten_optimizer_state_dict=True)}
    whole = plangen_functions.get_optimizer_state_dict(sharded, optimizer, options=whole_options)

    def resume(kind: str, functions, load) -> dict[str, float] | str:
        """The model at layout ``kind`` given the trained weights, a fresh AdamW given its state by
        ``load(model, optimizer)``, then the third step."""
        try:
            fresh = build_case_model(case)
            target, rows = fresh, slice(None)
            if kind != "plain":
                target, rows = _parallelized(case, fresh, kind), _dp_rows(_meshes(kind)[0])
            resumed = torch.optim.AdamW(target.parameters(), lr=LR, eps=EPS, fused=kind != "plain", foreach=False)
            load(target, resumed)
            moments = _differs(_moments(target, resumed, functions.get_optimizer_state_dict), saved)
            _train_step(target, resumed, ids, rows)
            weights = max(
                (full_parameter(target, n, p.detach()) - trained[n].detach()).abs().max().item()
                for n, p in target.named_parameters()
            )
            return {"moments": moments, "weights": weights}
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - reported, judged by the test
            return f"{type(exc).__name__}: {str(exc)[:300]}"

    saved = _moments(sharded, optimizer, plangen_functions.get_optimizer_state_dict)
    result: dict[str, Any] = {
        "saved_vs_unsharded": _differs(saved, unsharded_moments),
        "piece": largest_piece(sharded),
        "largest": max(t.numel() * t.element_size() for t in reference.state_dict().values()),
    }
    # The sharded state dict and its save at sharded memory: floating-point bytes allocated and alive.
    (result["get_bytes"], _), views = _peak(lambda: plangen_functions.get_optimizer_state_dict(sharded, optimizer))
    (result["save_bytes"], _), _ = _peak(
        lambda: dcp.save({"optim": views}, checkpoint_id=str(directory / f"{case['name']}-m"))
    )
    for functions in (plangen_functions, torch_functions):
        prefix = "" if functions is plangen_functions else "torch_"
        checkpoint = directory / f"{case['name']}-{prefix}optimizer"
        form = flat if functions is plangen_functions else {}
        dcp.save(
            {
                "model": get_model_state_dict(sharded),
                "optim": functions.get_optimizer_state_dict(sharded, optimizer, **form),
            },
            checkpoint_id=str(checkpoint),
        )
        saved = _moments(sharded, optimizer, functions.get_optimizer_state_dict)

        def from_checkpoint(target, resumed, functions=functions, checkpoint=checkpoint, form=form):
            state = {
                "model": get_model_state_dict(target),
                "optim": functions.get_optimizer_state_dict(target, resumed, **form),
            }
            dcp.load(state, checkpoint_id=str(checkpoint))
            set_model_state_dict(target, state["model"])
            functions.set_optimizer_state_dict(target, resumed, state["optim"], **form)

        for kind in ("dp1tp4", "dp4tp1", "plain"):
            result[f"{prefix}{kind}"] = resume(kind, functions, from_checkpoint)
    saved = _moments(sharded, optimizer, plangen_functions.get_optimizer_state_dict)

    def from_whole(target, resumed):
        set_model_state_dict(
            target,
            get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True)),
            options=StateDictOptions(full_state_dict=True),
        )
        # A copy each time: torch's loading of a whole state dict takes its step counts in as they are.
        plangen_functions.set_optimizer_state_dict(target, resumed, copy.deepcopy(whole), options=whole_options)

    for kind in ("dp1tp4", "dp4tp1"):
        result[f"{kind}_full"] = resume(kind, plangen_functions, from_whole)
    return result


def run_checkpoint_cases(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload``: ``{"directory": a directory every rank sees, "cases": {"dp2tp2": [case, ...]}}``;
    each case's result by name, on every rank."""
    directory = Path(payload["directory"])
    results = {}
    for case in payload["cases"].get("dp2tp2", []):
        started = time.perf_counter()
        result = result_or_error(run_case, case, directory)
        if isinstance(result, dict):
            result["seconds"] = round(time.perf_counter() - started, 3)
        results[case["name"]] = result
    for case in payload["cases"].get("optimizer", []):
        results[f"optimizer/{case['name']}"] = result_or_error(run_optimizer_case, case, directory)
    return results

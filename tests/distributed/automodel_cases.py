"""Worker side of tests/test_automodel.py: plans written by ``plangen init`` under NeMo Automodel itself.

Runs in an interpreter where ``nemo_automodel`` (0.7.0) imports, on four gloo ranks (DP 2 x TP 2,
CPU). Each case does what NeMo RL's DTensor v2 worker has Automodel do with a
``custom_parallel_plan`` (``NeMoAutoModelForCausalLM.from_config``/``from_pretrained`` with
``FSDP2Config(tp_plan=<dotted path>)``), step by step, since that front door itself asks CUDA for
the current device:

1. Automodel's class selection, ``_init_model(NeMoAutoModelForCausalLM, tiny_config, ..., force_hf)``:
   its own model code where its registry has the architecture (Llama, Qwen3, Qwen3-MoE,
   DeepSeek-V3) unless ``force_hf``, else the Hugging Face class (with its checkpointing mixin);
2. ``attach_capabilities_and_validate(model, mesh_context)``, the front door's capability check;
3. ``parallelize_model(model, mesh_context)`` (``model_parallelizer``): TP with the plan, then FSDP2;
4. one forward/backward on a batch split over DP, ``synchronize_tp_replica_gradients`` (what
   Automodel's optimizer loops call once per update), and Automodel's ``clip_grad_norm``.

Logits, every parameter's gradient (whole, in Hugging Face's layout) and the gradient norm are
compared with an unsharded copy. A step that raises ends the case with the exception's type and
message (the refusals the test expects); step 3 runs even when step 2 refused, so both of
Automodel's rules show.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import BATCH, SEQ, full, full_parameter, next_token_loss, result_or_error

TP = 2


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def build_model(case: dict[str, Any]) -> tuple[torch.nn.Module, bool]:
    """Automodel's choice of class for the tiny config of ``case["spec"]``, weights fixed by seed 0."""
    from nemo_automodel import NeMoAutoModelForCausalLM
    from nemo_automodel._transformers.model_init import _init_model

    from plangen.model.resolve import resolve_model
    from plangen.model.shrink import shrink_config

    resolved = resolve_model(case["spec"])
    tiny = shrink_config(resolved.config, TP)
    if not getattr(tiny, "architectures", None):
        tiny.architectures = [resolved.model_class.__name__]  # as a checkpoint's config.json names it
    # Automodel's Qwen3-MoE hands torch.device(f"cuda:{torch.cuda.current_device()}") to its lazy
    # rotary embedding; initialize_weights(buffer_device=cpu) below puts it on the CPU.
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        torch.manual_seed(0)
        is_custom, model = _init_model(
            NeMoAutoModelForCausalLM,
            tiny,
            "sdpa",
            torch.float32,
            None,
            case["force_hf"],
        )
    finally:
        torch.cuda.current_device = current_device
    if is_custom and "buffer_device" in inspect.signature(model.initialize_weights).parameters:
        torch.manual_seed(0)  # its MoE classes leave the weights (experts: torch.empty) to initialize_weights
        model.initialize_weights(buffer_device=torch.device("cpu"), dtype=torch.float32)
    return model.eval(), bool(is_custom)


def same_on_every_rank(model: torch.nn.Module) -> bool:
    """Whether every rank built the very same weights (the reference is each rank's own copy)."""
    digest = torch.stack(
        [p.detach().double().sum() for p in model.parameters()] + [torch.zeros((), dtype=torch.float64)]
    )
    gathered = [torch.empty_like(digest) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, digest)
    return all(torch.equal(g, digest) for g in gathered) and bool(torch.isfinite(digest).all())


def plan_keys_matched(model: torch.nn.Module, plan: dict) -> list[str]:
    """The plan's keys that match no module by torch's rule (fnmatch one name per dot): Automodel's
    dense path drops them silently, so a plan could be "accepted" and do nothing."""
    names = [name.split(".") for name, _ in model.named_modules()]
    unmatched = []
    for key in plan:
        parts = key.split(".")
        if not any(len(n) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(n, parts)) for n in names):
            unmatched.append(key)
    return unmatched


def tp_sharded_parameters(model: torch.nn.Module) -> list[str]:
    """Parameters split over the TP axis of their mesh (what the plan did)."""
    from torch.distributed.tensor import DTensor, Shard

    out = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ()):
            placement = p.placements[p.device_mesh.mesh_dim_names.index("tp")]
            if isinstance(placement, Shard):
                out.append(name)
    return out


def run_case(case: dict[str, Any], device_mesh) -> dict[str, Any]:
    from nemo_automodel._transformers.capabilities import (
        attach_capabilities_and_validate,
    )
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext
    from nemo_automodel.components.distributed.model_parallelizer import (
        parallelize_model,
    )
    from nemo_automodel.components.distributed.tp_replicas import (
        synchronize_tp_replica_gradients,
    )
    from nemo_automodel.components.training.utils import clip_grad_norm
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model, is_custom = build_model(case)
    out: dict[str, Any] = {
        "class": f"{type(model).__module__}.{type(model).__name__}",
        "automodel_class": is_custom,
    }
    out["same_weights"] = same_on_every_rank(model)
    reference = copy.deepcopy(model)

    # NeMo RL's v2 worker: FSDP2Config(tp_plan=custom_parallel_plan, mp_policy=...), fp32 here.
    policy = MixedPrecisionPolicy(
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        output_dtype=torch.float32,
    )
    strategy = FSDP2Config(tp_plan=case["plan"], sequence_parallel=False, mp_policy=policy)
    context = MeshContext.from_meshes(device_mesh, strategy_config=strategy)
    try:
        attach_capabilities_and_validate(model, context)
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        out["capabilities"] = _error(exc)
    try:
        model = parallelize_model(model, context)
    except Exception as exc:  # noqa: BLE001
        out["parallelize"] = _error(exc)
    if "capabilities" in out or "parallelize" in out:
        return out

    if case["plan"]:
        module, attr = case["plan"].rsplit(".", 1)
        out["unmatched_keys"] = plan_keys_matched(model, getattr(importlib.import_module(module), attr))
    out["tp_sharded"] = len(tp_sharded_parameters(model))
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    out["tied"] = emb.weight is head.weight

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab - 8, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    dp, dp_rank = device_mesh["dp"].size(), device_mesh["dp"].get_local_rank()
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)

    ref_logits = reference(input_ids=ids).logits
    per_slice = [
        next_token_loss(
            ref_logits[r * BATCH // dp : (r + 1) * BATCH // dp],
            ids[r * BATCH // dp : (r + 1) * BATCH // dp],
        )
        for r in range(dp)
    ]
    torch.stack(per_slice).mean().backward()  # FSDP2 averages over DP: the mean of the slices' losses
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    ref_norm = torch.nn.utils.get_total_norm([g for g in ref_grads.values()]).item()

    logits = model(input_ids=ids[rows]).logits
    out["logits"] = (full(logits) - ref_logits[rows]).abs().max().item()
    next_token_loss(logits, ids[rows]).backward()
    out["tp_replica_grads_synced"] = synchronize_tp_replica_gradients([model], device_mesh)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    diffs = {n: (full_parameter(model, n, grads[n]) - ref_grads[n]).abs().max().item() for n in ref_grads if n in grads}
    worst = max(diffs, key=diffs.get) if diffs else None
    out.update(
        grads=diffs,
        grad=diffs[worst] if worst else None,
        worst_grad=worst,
        missing_grads=sorted(set(ref_grads) - set(grads)),
        extra_grads=sorted(set(grads) - set(ref_grads)),
    )
    embedding = model.get_input_embeddings().weight
    out["embedding_grad"] = full(embedding.grad).double().sum().item()  # a control case compares it
    norm = clip_grad_norm(1e9, [model], device_mesh=device_mesh)  # no clipping: the norm (CPU: its loop)
    out["grad_norm"] = abs(float(norm) - ref_norm)
    out["ref_grad_norm"] = ref_norm
    return out


def run_cases(payload: dict[str, Any]) -> dict[str, Any]:
    from nemo_automodel.components.distributed.config import FSDP2Config
    from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes
    from torch.distributed.fsdp import MixedPrecisionPolicy

    sys.path.insert(0, payload["plans_dir"])  # the plans' package, as on a NeMo RL worker's PYTHONPATH
    # One mesh for every case (Automodel's: pp, dp_replicate, dp_shard, cp, tp and the flattened dp).
    mesh = MeshContext.build(
        FSDP2Config(mp_policy=MixedPrecisionPolicy()),
        ParallelismSizes(tp_size=TP),
        world_size=dist.get_world_size(),
    ).device_mesh
    results = {case["name"]: result_or_error(run_case, case, mesh) for case in payload["cases"]}
    dist.barrier()
    return results

"""Worker side of the multi-process tests: run many parity cases in one launch.

Every case builds the same tiny random model on every rank (same seed), keeps an unsharded copy
as the reference, parallelizes the other copy with plangen, runs one forward/backward on the same
batch (split over DP ranks), and reports the largest differences: logits, loss, every parameter
gradient, and the gradient norm.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for dotted custom plans

from tiny_configs import build_tiny  # noqa: E402

from plangen.check.run import full_parameter, full_tensor as full, next_token_loss  # noqa: E402,F401 - the harness core, shared with verify --run
from plangen.distributed.comm import CollectiveCounter  # noqa: E402
from plangen.model.resolve import text_config  # noqa: E402
from plangen.parallelize import get_grad_norm, parallelize_model  # noqa: E402
from plangen.model.tower_inputs import build_tower_inputs, text_logits  # noqa: E402

BATCH, SEQ = 4, 8


def build_meshes(kind: str):
    """dp2tp2: 2x2 mesh. tp4: TP=4, DP=1. tp2: TP=2 with DP=1, replicated twice to use all four ranks.
    hsdp: a 2-D DP mesh (2 replicas x 2 shards), TP=1."""
    if kind == "dp2tp2":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    elif kind == "hsdp":
        mesh = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        return mesh["dp_replicate", "dp_shard"], mesh["tp"]
    elif kind == "tp4":  # TP over all four ranks: more TP ranks than KV heads (plangen.styles.kv_heads)
        mesh = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    elif kind == "tp2":
        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 1, 2), mesh_dim_names=("rep", "dp", "tp"))
    else:
        raise ValueError(kind)
    return mesh["dp"], mesh["tp"]


_TINY_BY_TYPE: dict[tuple[str, str], torch.nn.Module] = {}


def build_case_model(case: dict[str, Any]):
    """``model``: a name in tests/tiny_configs.py; ``class``: any class, shrunk by plangen.model.shrink;
    ``model_type``: any registered type, shrunk by plangen.model.shrink (built once per worker and copied:
    a sweep runs several cases of one type)."""
    attn = case.get("attn", "sdpa")
    if "model_type" in case:
        from plangen.model.resolve import resolve_model
        from plangen.model.shrink import build_tiny_model

        key = (case["model_type"], attn)
        if key not in _TINY_BY_TYPE:
            resolved = resolve_model(case["model_type"])
            _TINY_BY_TYPE[key] = build_tiny_model(resolved, seed=0, attn_implementation=attn)
        return copy.deepcopy(_TINY_BY_TYPE[key])
    if "class" in case:
        from plangen.model.resolve import resolve_model
        from plangen.model.shrink import build_tiny_model

        return build_tiny_model(resolve_model(case["class"]), seed=0, attn_implementation=attn)
    return build_tiny(case["model"], seed=0, attn_implementation=attn)


def build_case_plan(case: dict[str, Any], model: torch.nn.Module):
    """``plan`` as given; or ``plan_kind``: "synthesized" or "hf", built for this model whether or not
    the runtime would pick it (the sweep proves synthesized plans before the runtime trusts them)."""
    kind = case.get("plan_kind")
    if kind is None:
        return case.get("plan")
    from plangen.styles import build_parallel_styles

    if kind == "synthesized":
        from plangen.plans.synthesis.synthesize import build_synthesized_plan

        return build_parallel_styles(build_synthesized_plan(model, case.get("sp", False)))
    if kind == "hf":
        from plangen.plans.hf_plan import get_hf_tp_plan

        return get_hf_tp_plan(model)
    raise ValueError(f"unknown plan_kind {kind!r}")


def _count_routes(model: torch.nn.Module) -> tuple[list[list[int]], list[Any]]:
    """Per MoE layer, how many (token, expert) routes each expert gets in the next forwards; the hooks."""
    from plangen.styles.flat_experts import flat_expert_shape
    from plangen.styles.experts import expert_count

    counts: list[list[int]] = []
    handles = []
    for module in model.modules():
        if (
            type(module).__name__ == "Llama4Router"
        ):  # every expert runs every token, scaled by its score (0 off the top-k)
            handles.append(
                module.register_forward_hook(lambda mod, args, out: counts.append((out[0] > 0).sum(0).tolist()))
            )
            continue
        experts = expert_count(module) or (flat_expert_shape(module) or (None,))[0]  # DBRX's flat experts too
        if experts:
            handles.append(
                module.register_forward_hook(
                    lambda mod, args, out, n=experts: (
                        counts.append(torch.bincount(args[1].flatten(), minlength=n).tolist())
                        # experts called without routing (Llama4's: counted at the router), or with per-expert
                        # token counts (JetMoE's, a list)
                        if len(args) > 1 and isinstance(args[1], torch.Tensor)
                        else None
                    )
                )
            )
    return counts, handles


def run_case(case: dict[str, Any], dp_mesh, tp_mesh) -> dict[str, Any]:
    model = build_case_model(case)
    if case.get("dtype") == "float64":  # the reference too (plangen.check.run.FLOAT64_CHECKS)
        model = model.double()
    if "experts" in case:  # the experts implementation: eager or grouped_mm (transformers' default)
        model.config._experts_implementation = case["experts"]
    reference = copy.deepcopy(model)
    id_bound = text_config(model.config).vocab_size
    if "model_type" in case:
        from plangen.model.shrink import SPECIAL_TOKEN_SPAN

        id_bound -= SPECIAL_TOKEN_SPAN  # a shrunk vocabulary keeps special (image) tokens in its top ids
    ids = torch.randint(0, id_bound, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    dp_group = dp_mesh.get_group() if dp_mesh.ndim == 1 else dp_mesh._flatten().get_group()
    dp, dp_rank = dp_mesh.size(), dist.get_rank(dp_group)
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    mask = torch.ones_like(ids)
    if case.get("pad"):
        mask[0, :3] = 0  # left padding in the first row of every DP slice
        mask[BATCH // 2, :5] = 0

    ids, towers = build_tower_inputs(model, ids)  # pixel values / audio features, one per row: the towers run

    def run(m, sl=slice(None)):
        return m(input_ids=ids[sl], attention_mask=mask[sl], **{k: v[sl] for k, v in towers.items()})

    aux_coef = case.get("aux_coef", 0.0)  # train on the load-balancing loss too, as out.loss does
    ref_out = run(reference)
    ref_logits = ref_out.logits
    ref_text = text_logits(ref_logits, ids)
    reference_loss(reference, ref_out, ids, dp, run, aux_coef).backward()
    # Text-only batches leave a vision tower without gradients: compare what the reference has.
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    # Summed in float64, as get_grad_norm does: a float32 norm of RemBert's gradients (15.99) is off by 6e-5.
    ref_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in ref_grads.values())).item()

    model_state = {k: v.detach().clone() for k, v in model.state_dict().items()} if case.get("state_dict") else None
    plan = build_case_plan(case, model)
    if case.get("bare"):
        sharded = parallelize_bare(model, dp_mesh, tp_mesh, case.get("sp", False))
    else:
        sharded = parallelize_model(
            model,
            dp_mesh,
            tp_mesh,
            getattr(torch, case.get("dtype", "float32")),
            sequence_parallel=case.get("sp", False),
            activation_checkpointing=case.get("ac", False),
            cpu_offload=case.get("cpu_offload", False),
            custom_parallel_plan=plan,
            plan_variant=case.get("variant", "optimized"),
        )
    state_dict = check_state_dict_round_trip(sharded, model_state) if case.get("state_dict") else None
    off_dim0 = read_off_dim0_layouts(sharded, dp_mesh)
    with CollectiveCounter() as forward:
        out = run(sharded, rows)
    logits = out.logits
    aux, routed = None, []
    routes, hooks = _count_routes(reference)  # MoE: the routes of this rank's rows, per layer and expert
    if hooks:
        with torch.no_grad():
            ref_rows = run(reference, rows)
        for hook in hooks:
            hook.remove()
        routed = routes
        if getattr(out, "aux_loss", None) is not None:  # load balancing, from replicated router logits
            aux = abs(float(full(out.aux_loss)) - float(ref_rows.aux_loss))
    loss = next_token_loss(text_logits(logits, ids), ids[rows])
    (loss + aux_coef * full(out.aux_loss) if aux_coef else loss).backward()

    grads = {n: p.grad for n, p in sharded.named_parameters() if p.grad is not None}
    norm = get_grad_norm(list(sharded.parameters()), dp_group, tp_mesh.get_group())
    norm_inf = get_grad_norm(list(sharded.parameters()), dp_group, tp_mesh.get_group(), norm_type="inf")
    ref_norm_inf = max(g.abs().max().item() for g in ref_grads.values())
    grad_diffs = {
        n: (full_parameter(sharded, n, grads[n]) - ref_grads[n]).abs().max().item() for n in ref_grads if n in grads
    }
    worst = max(grad_diffs, key=grad_diffs.get) if grad_diffs else None
    ref_slice_loss = next_token_loss(ref_text[rows], ids[rows]).item()
    param_drift = train_steps(
        reference, sharded, ids, mask, rows, dp, case.get("steps", 3), case.get("adam_eps", 1e-8), run, aux_coef
    )
    return {
        "param_drift": param_drift,
        "pad": read_pad_after_steps(sharded),
        "forward_collectives": forward.counts(),
        "logits_type": "DTensor" if isinstance(logits, DTensor) else "Tensor",
        "logits_placements": [str(p) for p in logits.placements] if isinstance(logits, DTensor) else None,
        "logits": (full(logits) - ref_logits[rows]).abs().max().item(),
        "logits_bitwise": bool(torch.equal(full(logits), ref_logits[rows])),
        "loss": abs(loss.item() - ref_slice_loss),
        "grad": grad_diffs[worst] if worst else None,
        "worst_grad": worst,
        "missing_grads": sorted(set(ref_grads) - set(grads)),
        # Parameters the check's batch never reaches (a tower fed no inputs): compared by nothing.
        "unreached": sorted(n for n, p in reference.named_parameters() if p.requires_grad and n not in ref_grads),
        "extra_grads": sorted(set(grads) - set(ref_grads)),
        "grad_norm": abs(norm - ref_norm),
        "grad_norm_inf": abs(norm_inf - ref_norm_inf),
        "aux_loss": aux,
        "state_dict": state_dict,
        "routes": routed,
        "off_dim0": off_dim0,
        "tied": bool(
            getattr(sharded.get_output_embeddings(), "weight", None)
            is getattr(sharded.get_input_embeddings(), "weight", 0)
        ),
    }


def read_pad_after_steps(sharded: torch.nn.Module) -> float | None:
    """The largest pad entry of the parameters padded with zero heads (plangen.styles.padded_heads), after the
    training steps: exactly 0 where the pad gets no gradient; None where nothing is padded."""
    from plangen.styles.fused import padded_layout
    from plangen.styles.padded_heads import read_pad

    largest = None
    for name, param in sharded.named_parameters():
        path, _, param_name = name.rpartition(".")
        module = sharded.get_submodule(path)
        pad = read_pad(module, param_name, padded_layout(module, param_name, full(param.detach())))
        if pad is not None:
            largest = max(largest or 0.0, pad.abs().max().item())
    return largest


def parallelize_bare(model: torch.nn.Module, dp_mesh, tp_mesh, sequence_parallel: bool) -> torch.nn.Module:
    """NeMo RL's runtime with plangen's plan function for the class (``bare`` cases,
    ``PARALLELIZE_FUNCTIONS``): ``parallelize_module``, then ``fully_shard`` on each decoder layer and
    the root, nothing else of plangen's runtime (no checks, no re-tying): the styles must be right on
    their own."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.model.module_tree import find_transformer_layers
    from plangen.parallelize import PARALLELIZE_FUNCTIONS

    parallelize_module(model, tp_mesh, PARALLELIZE_FUNCTIONS[type(model)](model, sequence_parallel))
    for layer in find_transformer_layers(model):
        fully_shard(layer, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)


def read_off_dim0_layouts(sharded: torch.nn.Module, dp_mesh) -> dict[str, list]:
    """Parameters FSDP2 shards on another dim than 0 over DP: name -> [its placements, its local shape]."""
    dp_index = dp_mesh.ndim - 1  # (replicate, shard) for HSDP: the shard dim is the last DP dim
    return {  # Shard or _StridedShard (over a column-parallel TP shard): both have .dim
        name: [[str(p) for p in param.placements], list(param.to_local().shape)]
        for name, param in sharded.named_parameters()
        if getattr(param.placements[dp_index], "dim", 0) != 0
    }


def check_state_dict_round_trip(sharded: torch.nn.Module, original: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The parallelized model's full state dict (torch.distributed.checkpoint's API, and
    ``model.state_dict()`` with each DTensor gathered) against the Hugging Face weights: same names,
    shapes, values; then those weights loaded back in, and read out again, land where they belong
    (perturbed first, so a no-op load would show)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    full = get_model_state_dict(sharded, options=options)
    names_differ = sorted(set(full) ^ set(original))
    shapes_differ = sorted(k for k in full if k in original and tuple(full[k].shape) != tuple(original[k].shape))
    read = max((full[k] - original[k]).abs().max().item() for k in full if k in original and k not in shapes_differ)
    # model.state_dict() gathered by hand, as a user without torch.distributed.checkpoint would.
    plain = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sharded.state_dict().items()}
    plain_names = sorted(set(plain) ^ set(original))
    plain_read = max(
        (plain[k] - original[k]).abs().max().item() if plain[k].shape == original[k].shape else float("inf")
        for k in plain
        if k in original
    )
    with torch.no_grad():
        for param in sharded.parameters():
            param.add_(1.0)
    # A copy: loading a full state dict distributes its tensors in place.
    set_model_state_dict(sharded, {k: v.clone() for k, v in original.items()}, options=options)
    again = get_model_state_dict(sharded, options=options)
    loaded = max((again[k] - original[k]).abs().max().item() for k in again if k in original and k not in shapes_differ)
    return {
        "names": names_differ[:5],
        "shapes": shapes_differ[:5],
        "read": read,
        "loaded": loaded,
        "plain_names": plain_names[:5],
        "plain_read": plain_read,
    }


def reference_loss(reference, out, ids, dp: int, forward, aux_coef: float = 0.0) -> torch.Tensor:
    """The loss the DP ranks' losses average to (FSDP2 averages gradients over DP): the mean of the
    per-slice losses, each with its slice's load-balancing loss times ``aux_coef`` where that is
    not 0 (a slice's routing statistics are its own: the reference runs each slice again)."""
    text, per_slice = text_logits(out.logits, ids), []
    for r in range(dp):
        rows = slice(r * BATCH // dp, (r + 1) * BATCH // dp)
        loss = next_token_loss(text[rows], ids[rows])
        per_slice.append(loss + aux_coef * forward(reference, rows).aux_loss if aux_coef else loss)
    return torch.stack(per_slice).mean()


def train_steps(
    reference, sharded, ids, mask, rows, dp: int, steps: int, eps: float = 1e-8, forward=None, aux_coef: float = 0.0
) -> float | None:
    """Continue from the gradients already computed: ``steps`` AdamW steps on both models, then
    the largest parameter difference (optimizer state sharded by FSDP2 must not change the result).

    Adam divides by sqrt(v): on near-zero gradients fp32 rounding alone moves a weight by up to
    lr. lr is 1e-4 (still above RL fine-tuning rates): a wrong optimizer state moves weights by
    ~lr per step, 10x the 1e-5 tolerance. ``eps`` (the ``adam_eps`` case key) bounds that
    amplification: a gradient that is zero in exact arithmetic (a key bias: softmax ignores it)
    is rounding noise of ~1e-10 on both sides, which eps=1e-8 turns into a full lr step of random
    sign; eps=1e-6 turns a 1e-8 gradient difference into at most 1e-6 of parameter.

    The sharded model steps with fused AdamW, the reference with the plain per-tensor loop (the
    definition): the same update, and on DTensors one sharding propagation per step instead of
    one per parameter shape and op (~1 s of a launch's time per model at DP 2 x TP 2)."""
    if steps <= 0:
        return None
    if forward is None:  # text only

        def forward(m, sl=slice(None)):
            return m(input_ids=ids[sl], attention_mask=mask[sl])

    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-4, eps=eps, foreach=False)
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-4, eps=eps, fused=True)
    for step in range(steps):
        if step:
            for m in (reference, sharded):
                m.zero_grad(set_to_none=True)
            reference_loss(reference, forward(reference), ids, dp, forward, aux_coef).backward()
            out = forward(sharded, rows)
            loss = next_token_loss(text_logits(out.logits, ids), ids[rows])
            (loss + aux_coef * full(out.aux_loss) if aux_coef else loss).backward()
        ref_opt.step()
        opt.step()
    ref_params = dict(reference.named_parameters())
    return max(
        (full_parameter(sharded, n, p.detach()) - ref_params[n].detach()).abs().max().item()
        for n, p in sharded.named_parameters()
    )


def result_or_error(run, *args) -> dict[str, Any]:
    """``run(*args)``, or the error it raised as the case's result: one broken case must not hide the others."""
    try:
        return run(*args)
    except Exception as err:
        import traceback

        return {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-3000:]}


def run_cases(payload: dict[str, Any]) -> dict[str, Any]:
    """Every case's result on every rank. Where a mesh is smaller than the launch (``tp2``: two
    copies of TP 2), the copies take turns at the cases and then share their results: a copy would
    compute exactly what the other does, and four ranks share two cores."""
    results: dict[str, Any] = {}
    mesh_size: dict[str, int] = {}
    for mesh_kind, cases in payload.items():
        dp_mesh, tp_mesh = build_meshes(mesh_kind)
        size = mesh_size[mesh_kind] = dp_mesh.size() * tp_mesh.size()
        copies, copy = dist.get_world_size() // size, dist.get_rank() // size
        for index, case in enumerate(cases):
            if index % copies != copy:
                continue
            started = time.perf_counter()
            result = result_or_error(run_case, case, dp_mesh, tp_mesh)
            if isinstance(result, dict):
                result["seconds"] = round(time.perf_counter() - started, 3)  # what a case costs a launch
            results[f"{mesh_kind}/{case['name']}"] = result
    return share_copies(results, mesh_size)


def share_copies(results: dict[str, Any], mesh_size: dict[str, int]) -> dict[str, Any]:
    """This rank's results, with the cases another copy of its mesh ran taken from the rank at the
    same place in that copy."""
    if all(size == dist.get_world_size() for size in mesh_size.values()):
        return results
    every: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, results)
    rank = dist.get_rank()
    shared = dict(results)
    for other, theirs in enumerate(every):
        for key, result in theirs.items():
            size = mesh_size[key.split("/")[0]]
            if key not in shared and other % size == rank % size:
                shared[key] = result
    return shared


TOL = 1e-5


def case_problem(result: dict[str, Any]) -> str | None:
    """Why one rank's result of a case fails the parity check (the test suite's criteria), or None."""
    if "error" in result:
        return result["error"]
    sd = result.get("state_dict")
    if sd is not None and (
        sd["names"] or sd["shapes"] or sd["read"] > 0 or sd["loaded"] > 0 or sd["plain_names"] or sd["plain_read"] > 0
    ):
        return f"full state dict differs from the Hugging Face weights: {sd}"
    if result["missing_grads"] or result["extra_grads"]:
        return f"gradients missing {result['missing_grads'][:3]} or extra {result['extra_grads'][:3]}"
    if result.get("pad"):  # zero heads padding the query heads (plangen.styles.padded_heads) must stay exactly 0
        return f"pad heads' parameters are not zero after the steps: {result['pad']:.1e}"
    for key in ("logits", "loss", "grad", "grad_norm", "grad_norm_inf", "param_drift", "aux_loss"):
        if result.get(key) is not None and not result[key] < TOL:
            where = f" ({result['worst_grad']})" if key == "grad" else ""
            return f"{key} differs by {result[key]:.1e}{where}"
    return None

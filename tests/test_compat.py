"""plangen.stack.torch_compat: the one module that names torch's private or version-dependent API.

A scan of ``plangen/`` (AST) fails where any other module names one; each shim is checked over gloo
against what it replaces: the same values and gradients as the torch call it stands for (and, on a
release that has that call, bitwise the same as it).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from plangen.stack import torch_compat as compat

PACKAGE = Path(compat.__file__).resolve().parents[1]  # plangen/

# Attributes and names that are private to torch or missing from a release of the window.
VERSIONED_ATTRIBUTES = frozenset(
    {
        "all_gather_single_autograd",
        "mesh_scatter",  # DTensor's scatter, patched where the fake backend leaves it unwritten
        "all_gather_tensor_autograd",
        "all_gather_single",
        "all_gather_into_tensor",
        "reduce_scatter_single",
        "reduce_scatter_tensor",
        "ALL_REDUCE_OPS",
        "_local_tensor",
        "_spec",
        "_StridedShard",
        "_overloadpacket",
        "_propagate_tensor_meta_non_cached",
        "_update_peak_stats",
        "_curr_mem_snap",
        "_mod_tracker",
        "_in_opt",
        "_sharding_prop",
        "_disable_current_modes",
        "_functional_collectives",
        "_c10d_functional",
    }
)
VERSIONED_NAMES = frozenset({"funcol", "_StridedShard", "_disable_current_modes"})


def _private_torch_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def torch_name_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private or version-dependent torch name ``source`` uses."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _private_torch_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            if _private_torch_module(node.module or ""):
                found.append((node.lineno, f"from {node.module} import ..."))
            found += [
                (node.lineno, f"from {node.module} import {a.name}") for a in node.names if a.name.startswith("_")
            ]
        elif isinstance(node, ast.Attribute) and node.attr in VERSIONED_ATTRIBUTES:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Attribute) and _private_torch_module(_dotted(node) or ""):
            found.append((node.lineno, _dotted(node)))
        elif isinstance(node, ast.Name) and node.id in VERSIONED_NAMES:
            found.append((node.lineno, node.id))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "from_local"
            and any(k.arg == "grad_placements" for k in node.keywords)
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "compat")
        ):
            found.append((node.lineno, "from_local(grad_placements=)"))
    return found


def test_the_scan_finds_each_kind_of_use():
    source = "\n".join(
        [
            "import torch.distributed._functional_collectives as funcol",
            "from torch.distributed.tensor.placement_types import _StridedShard",
            "from torch._subclasses.fake_tensor import FakeTensorMode",
            "x = t._local_tensor",
            "dist.reduce_scatter_single(a, b)",
            "DTensor.from_local(x, mesh, p, grad_placements=(Partial(),))",
            "ops = Partial.ALL_REDUCE_OPS",
            "torch.ops._c10d_functional.wait_tensor(t)",
            "placement_types.mesh_scatter = scatter_this_ranks_chunk",
            "y = x.to_local(grad_placements=(Partial(),))",  # public on every release: not a use
            "z = compat.from_local(x, mesh, p, grad_placements=(Partial(),))",  # the shim: not a use
            "from torch.distributed.tensor import DTensor",  # public: not a use
        ]
    )
    lines = sorted({line for line, _ in torch_name_uses(source)})
    assert lines == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_no_module_but_compat_names_torch_private_or_versioned_api():
    uses = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "stack" / "torch_compat.py":
            continue
        found = torch_name_uses(path.read_text())
        if found:
            uses[str(path.relative_to(PACKAGE.parent))] = found
    assert not uses, f"go through plangen.stack.torch_compat: {uses}"


def test_the_parallel_style_hooks_plangen_overrides_exist_in_this_torch():
    import torch.distributed.tensor.parallel as tp

    missing = [
        f"{cls}.{hook}"
        for cls, hooks in compat.PARALLEL_STYLE_HOOKS.items()
        for hook in hooks
        if not callable(getattr(getattr(tp, cls), hook, None))
    ]
    assert not missing


def test_partial_reduce_ops_are_torchs_and_the_static_checks():
    from torch.distributed.tensor import Partial

    from plangen.check import known_styles as known

    assert compat.PARTIAL_REDUCE_OPS == known.PARTIAL_REDUCE_OPS
    if hasattr(Partial, "ALL_REDUCE_OPS"):
        assert compat.PARTIAL_REDUCE_OPS == tuple(Partial.ALL_REDUCE_OPS)
    assert all(Partial(op).reduce_op == op for op in compat.PARTIAL_REDUCE_OPS)


def test_strided_shard_and_local_tensor():
    from torch.distributed.tensor import Shard

    placement = compat.strided_shard(0, 2)
    assert compat.is_strided_shard(placement) and placement.dim == 0 and placement.split_factor == 2
    assert not compat.is_strided_shard(Shard(0))
    plain = torch.ones(2)
    assert compat.local_tensor(plain) is plain


@pytest.mark.distributed
def test_the_shims_compute_what_they_replace_over_gloo():
    from plangen.distributed.launch import run_distributed

    for rank, diffs in enumerate(run_distributed(f"{__file__}:gloo_worker", 2, timeout=120)):
        assert len(diffs) >= 12, diffs
        bad = {k: v for k, v in diffs.items() if v != 0.0}
        assert not bad, f"rank {rank}: {bad}"


def gloo_worker(payload: Any) -> dict[str, float]:
    """One rank of two: each shim against the values it must give, exactly (integers in floats)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    diffs: dict[str, float] = {}

    def diff(key: str, got: torch.Tensor, want: torch.Tensor) -> None:
        diffs[key] = float("inf") if got.shape != want.shape else (got - want).abs().max().item()

    def per_rank(r: int, *shape: int) -> torch.Tensor:
        return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * (r + 1) + 10 * r

    # from_local(grad_placements=(Partial(),)) on a Replicate input whose gradient arrives Partial (a
    # column-parallel matmul's): the local partial gradient, no reduction; by default all-reduced.
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5
    c = [per_rank(r, 2, 4).chunk(world, -1)[r] for r in range(world)]
    w_parts = w.chunk(world, -1)
    partial_want = c[rank] @ w_parts[rank].T
    summed_want = sum(c[r] @ w_parts[r].T for r in range(world))
    weight = distribute_tensor(w, mesh, (Shard(1),))
    emulated = lambda t, p, g: compat._FromLocalGradAs.apply(t, mesh, p, g, None, None)  # noqa: E731
    makers = {"compat": lambda t, p, g: compat.from_local(t, mesh, p, grad_placements=g), "emulated": emulated}
    if compat.NATIVE_FROM_LOCAL_GRAD_PLACEMENTS:
        makers["torch"] = lambda t, p, g: DTensor.from_local(t, mesh, p, run_check=False, grad_placements=g)
    grads = {}
    for name, make in makers.items():
        local = x.clone().requires_grad_(True)
        y = make(local, (Replicate(),), (Partial(),)) @ weight
        (y.to_local() * c[rank]).sum().backward()
        diff(f"from_local/{name}/partial_grad", local.grad, partial_want)
        grads[name] = local.grad
        # A Replicate gradient taken as Partial: each rank's 1/world of it (torch's Replicate -> Partial).
        local = x.clone().requires_grad_(True)
        (make(local, (Replicate(),), (Partial(),)).to_local() * 2).sum().backward()
        diff(f"from_local/{name}/replicate_grad", local.grad, torch.full_like(x, 2.0 / world))
        # Already in grad_placements: the local gradient as it is.
        local = x.clone().requires_grad_(True)
        (make(local, (Shard(0),), (Shard(0),)).to_local() * 3).sum().backward()
        diff(f"from_local/{name}/same_grad", local.grad, torch.full_like(x, 3.0))
    local = x.clone().requires_grad_(True)
    y = compat.from_local(local, mesh, (Replicate(),)) @ weight
    (y.to_local() * c[rank]).sum().backward()
    diff("from_local/default/summed_grad", local.grad, summed_want)
    if "torch" in grads:
        diffs["from_local/emulated_is_torch_bitwise"] = float(not torch.equal(grads["emulated"], grads["torch"]))

    # all_gather on the last dim, autograd: forward concatenates, backward reduce-scatters (sum).
    mine = per_rank(rank, 2, 3).requires_grad_(True)
    whole = compat.all_gather(mine, 1, mesh)
    diff("all_gather/forward", whole, torch.cat([per_rank(r, 2, 3) for r in range(world)], 1))
    # A non-contiguous gradient (through a transpose), as ProphetNet's bucketed projection gives it.
    (whole.t() * per_rank(rank, 3 * world, 2)).sum().backward()
    diff(
        "all_gather/backward", mine.grad, sum(per_rank(r, 3 * world, 2).t().chunk(world, 1)[rank] for r in range(world))
    )
    # On dim 0 with the gradient arriving non-contiguous (ProphetNet's bucketed projection's case).
    rows = per_rank(rank, 2, 3).requires_grad_(True)
    stacked = compat.all_gather(rows, 0, mesh)
    (stacked.t() * per_rank(rank, 3, 2 * world)).sum().backward()
    diff(
        "all_gather/dim0_noncontiguous_grad",
        rows.grad,
        sum(per_rank(r, 3, 2 * world).t().chunk(world, 0)[rank] for r in range(world)),
    )
    native = getattr(funcol, "all_gather_single_autograd", None)
    if native is not None:
        again = per_rank(rank, 2, 3).requires_grad_(True)
        out = native(again, 1, mesh)
        out = out.wait() if isinstance(out, funcol.AsyncCollectiveTensor) else out
        (out.t() * per_rank(rank, 3 * world, 2)).sum().backward()
        diffs["all_gather/is_torch_bitwise"] = float(
            not (torch.equal(out, whole) and torch.equal(again.grad, mine.grad))
        )

    # c10d reduce-scatter and all-gather into a tensor; functional all-reduce.
    out = torch.empty(2, 3)
    compat.reduce_scatter(out, per_rank(rank, 2 * world, 3))
    diff("reduce_scatter", out, sum(per_rank(r, 2 * world, 3).chunk(world, 0)[rank] for r in range(world)))
    out = torch.empty(2 * world, 3)
    compat.all_gather_into(out, per_rank(rank, 2, 3))
    diff("all_gather_into", out, torch.cat([per_rank(r, 2, 3) for r in range(world)]))
    diff("all_reduce", compat.all_reduce(per_rank(rank, 2, 3), mesh), sum(per_rank(r, 2, 3) for r in range(world)))

    # A linear with replicated weights on a sequence-sharded input: each rank's rows (torch < 2.13
    # cannot flatten them), against the whole computation and, where it can, DTensor's own linear.
    seq = torch.arange(2 * 2 * world * 3, dtype=torch.float32).reshape(2, 2 * world, 3) % 5 - 2
    lin_w, lin_b = torch.arange(15, dtype=torch.float32).reshape(5, 3) % 7 - 3, torch.arange(5, dtype=torch.float32)
    coef = torch.arange(2 * 2 * world * 5, dtype=torch.float32).reshape(2, 2 * world, 5) % 3 - 1
    ref_x, ref_w, ref_b = (
        seq.clone().requires_grad_(True),
        lin_w.clone().requires_grad_(True),
        lin_b.clone().requires_grad_(True),
    )
    ref_out = torch.nn.functional.linear(ref_x, ref_w, ref_b)
    (ref_out * coef).sum().backward()
    runs = {"rows": compat.linear_on_local_rows}
    if compat.FLATTENS_SHARDED_DIM:
        runs["torch"] = lambda x, w, b: torch.nn.functional.linear(x, w, b)
    got = {}
    for name, run in runs.items():
        local_x = seq.chunk(world, 1)[rank].clone().requires_grad_(True)
        xd = DTensor.from_local(local_x, mesh, (Shard(1),), run_check=False)
        assert compat.is_row_sharded(xd)
        wd = distribute_tensor(lin_w, mesh, (Replicate(),)).requires_grad_(True)
        bd = distribute_tensor(lin_b, mesh, (Replicate(),)).requires_grad_(True)
        out = run(xd, wd, bd)
        (out.to_local() * coef.chunk(world, 1)[rank]).sum().backward()
        diff(f"rows/{name}/out", out.full_tensor(), ref_out.detach())
        diff(f"rows/{name}/grad_input", local_x.grad, ref_x.grad.chunk(world, 1)[rank])
        diff(f"rows/{name}/grad_weight", wd.grad.full_tensor(), ref_w.grad)
        diff(f"rows/{name}/grad_bias", bd.grad.full_tensor(), ref_b.grad)
        diffs[f"rows/{name}/placements"] = float(
            out.placements != (Shard(1),) or not wd.grad.placements[0].is_partial()
        )
        got[name] = (out.to_local(), local_x.grad, wd.grad.to_local())
    if "torch" in got:
        diffs["rows/is_torch_bitwise"] = float(not all(torch.equal(a, b) for a, b in zip(got["rows"], got["torch"])))
    return diffs

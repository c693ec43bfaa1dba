"""Two ways to shard a fused projection under TP + FSDP2, measured at DP 2 × TP 2 (docs/fused.md).

``strided``: torch's ``_StridedShard`` (plangen's PackedColwiseParallel), the parameter keeps the
Hugging Face layout and DTensor says which rows each rank holds. ``relayout``: plangen's
FusedColwiseParallel, the rows re-ordered once so a plain ``Shard(0)`` gives each rank its parts,
with state-dict hooks translating both ways.

For each: a fused ``[gate; up]`` (equal parts) and a GQA ``[q; k; v]`` (4 : 2 : 2 heads) Linear,
TP then ``fully_shard``; reported per rank: whether this rank's rows are its own parts, the forward's
correctness, the full state dict (torch.distributed.checkpoint) against the original weight, a
Hugging Face weight loaded and read back, the local parameter size, and the collectives of a
forward and of a ``state_dict()``.

    python benchmarks/fused_layouts.py        # 4 gloo processes, a few seconds
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Out features and part sizes: [gate; up] 16 + 16; [q; k; v] of 4, 2, 2 heads of 6 (24 + 12 + 12).
CASES = {"gate_up": (32, (1, 1)), "qkv_gqa": (48, (4, 2, 2))}


def _counts(fn) -> dict[str, int]:
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        fn()
    return {str(k).rsplit(".", 1)[-1]: v for k, v in comm.get_comm_counts().items()}


def measure(layout: str, case: str) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from plangen.styles.fused import FusedColwiseParallel, interleave_index
    from plangen.styles import PackedColwiseParallel

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rows, parts = CASES[case]
    torch.manual_seed(0)

    class Holder(nn.Module):  # the FSDP2 root: its forward unshards the parameter
        def __init__(self) -> None:
            super().__init__()
            self.m = nn.Linear(8, rows, bias=False)

        def forward(self, x):
            return self.m(x)

    holder = Holder()
    original = holder.m.weight.detach().clone()
    # The rows TP rank r must hold so that its own heads' parts meet: the r-th slice of every part.
    own = interleave_index(rows, parts, 2).view(2, -1)[mesh["tp"].get_local_rank()]
    if layout == "strided":  # equal parts only: split_factor = number of parts
        style = PackedColwiseParallel(split_factor=len(parts))
    else:
        style = FusedColwiseParallel(part_sizes=parts)
    parallelize_module(holder, mesh["tp"], {"m": style})
    tp_local = holder.m.weight.to_local()
    holds_own = bool(torch.equal(tp_local, original[own]))
    fully_shard(holder, mesh=mesh["dp"])
    local_numel = holder.m.weight.to_local().numel()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    out = holder(x)
    forward_ok = bool(torch.allclose(out, (x @ original.T)[:, own], atol=1e-6))
    forward_collectives = _counts(lambda: holder(x))
    options = StateDictOptions(full_state_dict=True)
    read = (get_model_state_dict(holder, options=options)["m.weight"] - original).abs().max().item()
    state_dict_collectives = _counts(lambda: holder.state_dict())
    new = torch.randn_like(original)
    set_model_state_dict(holder, {"m.weight": new.clone()}, options=options)
    loaded = (get_model_state_dict(holder, options=options)["m.weight"] - new).abs().max().item()
    out_after = holder(x)
    load_forward_ok = bool(torch.allclose(out_after, (x @ new.T)[:, own], atol=1e-5))
    return {
        "holds_own_parts": holds_own,
        "forward_ok": forward_ok,
        "full_state_dict_error": read,
        "loaded_error": loaded,
        "forward_after_load_ok": load_forward_ok,
        "local_params": local_numel,
        "whole_params": original.numel(),
        "forward_collectives": forward_collectives,
        "state_dict_collectives": state_dict_collectives,
    }


def worker(payload: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for layout in ("strided", "relayout"):
        for case in CASES:
            try:
                results[f"{layout}/{case}"] = measure(layout, case)
            except Exception as err:  # a layout that cannot express the case says why
                results[f"{layout}/{case}"] = {"error": f"{type(err).__name__}: {err}"[:200]}
    return results


def main() -> None:
    from plangen.distributed.launch import run_distributed

    per_rank = run_distributed(f"{Path(__file__).resolve()}:worker", 4, None, timeout=300)
    print(
        "| layout / case | rank | own parts | forward | full state dict max error | load, read back | forward after load | local / whole params | forward collectives | state_dict() collectives |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in per_rank[0]:
        for rank, results in enumerate(per_rank):
            r = results[key]
            if "error" in r:
                print(f"| {key} | {rank} | {r['error']} |||||||")
                continue
            print(
                f"| {key} | {rank} | {r['holds_own_parts']} | {r['forward_ok']} | {r['full_state_dict_error']:.3g} |"
                f" {r['loaded_error']:.3g} | {r['forward_after_load_ok']} | {r['local_params']} / {r['whole_params']} |"
                f" {r['forward_collectives'] or '{}'} | {r['state_dict_collectives'] or '{}'} |"
            )


if __name__ == "__main__":
    main()

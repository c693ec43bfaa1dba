"""Per-rank memory of saving and exporting weights at full size, before and after issue 29 (docs/checkpoints.md).

The model is built on the meta device from a shared config and tensor-parallelized by the plan
plangen picks, on a single-process fake process group (what ``plangen cost`` does); every number is
read off the parallelized parameters (each rank's local shape, the re-laid-out ones'
:func:`plangen.styles.hf_layout.row_map`), in the master dtype (fp32), at DP 1 (FSDP2 divides the shard by DP):

- shard: this rank's parameters;
- ``state_dict()`` / ``dcp.save``, before: the shard plus every re-laid-out (fused, padded) parameter
  gathered whole by its state-dict hook, all held at once; after: the shard (the entries are views);
- export, before (a loop of ``full_tensor()`` over ``state_dict()``): that state dict plus the largest
  parameter; after (``plangen.runtime.export.iter_hf_weights``): the shard and the parameter being gathered,
  with one rank's shard of it where it is sharded on another dim than 0 (a gather's buffer: the
  shard does not land whole in the output), at the largest such sum.

    python benchmarks/checkpoint_memory.py /work/shared/model-configs/phi-3.5-mini.json --tp 2 4 8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GIB = 2**30


def measure(config_path: str, tp_size: int) -> dict[str, float]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from plangen.distributed.fake_group import fake_process_group, quiet_partial_matches
    from plangen.styles.hf_layout import row_map
    from plangen.model.resolve import build_meta_model, resolve_model
    from plangen.runtime.lora import resolve_plan_model
    from plangen.plans.choice import choose_plan
    from plangen.runtime.tensor_parallel import apply_tp

    resolved = resolve_model(config_path)
    with fake_process_group(tp_size):
        model = build_meta_model(resolved.config, resolved.model_class, dtype=torch.float32)
        chosen = choose_plan(resolve_plan_model(model), False, None)
        with quiet_partial_matches():
            apply_tp(model, DeviceMesh("cpu", torch.arange(tp_size)), chosen.build_styles(), dp_size=1)
        shard = relaid = largest = gathered = 0
        for name, param in model.named_parameters():
            path, _, param_name = name.rpartition(".")
            whole = param.numel() * param.element_size()
            local = param.to_local() if isinstance(param, DTensor) else param
            local_bytes = local.numel() * local.element_size()
            shard += local_bytes
            if (
                isinstance(param, DTensor)
                and row_map(model.get_submodule(path), param_name, tuple(param.shape)) is not None
            ):
                relaid += whole - local_bytes
            largest = max(largest, whole)
            # A shard on another dim than 0 does not land whole in the output: one shard buffered.
            off_dim0 = isinstance(param, DTensor) and any(getattr(p, "dim", 0) != 0 for p in param.placements)
            gathered = max(gathered, whole + (local_bytes if off_dim0 else 0))
    before_sd = shard + relaid
    return {
        "plan": chosen.source,
        "shard": shard / GIB,
        "largest": largest / GIB,
        "state_dict_before": before_sd / GIB,
        "state_dict_after": shard / GIB,
        "export_before": (before_sd + largest) / GIB,
        "export_after": (shard + gathered) / GIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--tp", nargs="+", type=int, default=[2, 4, 8])
    args = parser.parse_args()
    rows = []
    for config in args.configs:
        for tp in args.tp:
            row = {"model": Path(config).stem, "tp": tp, **measure(config, tp)}
            rows.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print("\n| model | TP | shard | `state_dict()` / `dcp.save`: before → after | export: before → after |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['model']} | {r['tp']} | {r['shard']:.2f} GiB | {r['state_dict_before']:.2f} → {r['state_dict_after']:.2f} GiB "
            f"| {r['export_before']:.2f} → {r['export_after']:.2f} GiB |"
        )


if __name__ == "__main__":
    main()

"""Train a tiny random Llama for a few steps on CPU with DP=2 x TP=2, using a plan made by `plangen init`.

    torchrun --nproc-per-node 4 examples/train_llama.py [--steps 8]

The tensor-parallel plan is ``generated/llama_plan.py`` (``plangen init llama``), passed to
``parallelize_model`` by its dotted path; edit that file and rerun to try another plan. The output
head is vocabulary-parallel, so the logits are a DTensor sharded on the vocabulary and the loss is
``plangen.loss.vocab_parallel_cross_entropy`` (the vocabulary is never gathered). Rank 0 prints
the loss of each step, averaged over the data-parallel ranks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # "generated.llama_plan" imports from any working directory

from plangen.loss import vocab_parallel_cross_entropy  # noqa: E402
from plangen.parallelize import parallelize_model  # noqa: E402

PLAN = "generated.llama_plan.custom_parallel_plan"
DP, TP = 2, 2
BATCH, SEQ = 4, 16


def build_model(seed: int = 0) -> LlamaForCausalLM:
    """A small random Llama built from its config: same weights on every rank for the same seed."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def train(options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the training steps on an initialized gloo process group of DP x TP ranks; return the losses."""
    options = options or {}
    steps, lr = int(options.get("steps", 8)), float(options.get("lr", 3e-3))
    if dist.get_world_size() != DP * TP:
        raise SystemExit(f"run with {DP * TP} processes (DP={DP} x TP={TP}), not {dist.get_world_size()}")
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]

    model = parallelize_model(build_model(), dp_mesh, tp_mesh, torch.float32, custom_parallel_plan=PLAN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    # Each DP rank trains on its own batch; the TP ranks of one DP rank see the same batch.
    generator = torch.Generator().manual_seed(1000 + dp_mesh.get_local_rank())
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=generator)

    losses = []
    for step in range(steps):
        logits = model(input_ids=ids).logits  # DTensor, Shard(-1): sharded on the vocabulary
        loss = vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        mean = loss.detach().clone()
        dist.all_reduce(mean, group=dp_mesh.get_group())
        losses.append(mean.item() / DP)
        if dist.get_rank() == 0:
            print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    return {"losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # several ranks share the cores
    dist.init_process_group("gloo")
    try:
        train({"steps": args.steps, "lr": args.lr})
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What a cost is computed for: parallel sizes, the batch of one step, and the dtypes.

Pure data and validation; nothing here imports torch, so the CLI can refuse bad input at once.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per element of the dtypes a user can name.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
# plangen's FSDP2 policy (parallelize.apply_fsdp) reduce-scatters gradients in float32.
REDUCE_DTYPE = "fp32"


class CostError(ValueError):
    """The cost cannot be computed for this input; the message is one line and says what to change."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class CostSettings:
    """One training step of one micro-batch on a DP x TP mesh.

    ``dtype`` is the compute and communication dtype (FSDP2's ``param_dtype``: activations and
    all-gathered parameters); ``master_dtype`` is what parameters, gradients and AdamW states
    are stored in.
    """

    tp_size: int = 2
    dp_size: int = 1
    seq_len: int = 4096
    micro_batch: int = 1
    dtype: str = "bf16"
    master_dtype: str = "fp32"
    sequence_parallel: bool = False

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def master_bytes(self) -> int:
        return DTYPE_BYTES[self.master_dtype]

    @property
    def reduce_bytes(self) -> int:
        return DTYPE_BYTES[REDUCE_DTYPE]


def normalize_dtype(name: str, option: str = "--dtype") -> str:
    """``bfloat16`` -> ``bf16``; an unknown name is a :class:`CostError` listing the known ones."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise CostError(f"{option} {name!r}: expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_ALIASES[key]


def build_cost_settings(
    *,
    tp_size: int = 2,
    dp_size: int = 1,
    seq_len: int = 4096,
    micro_batch: int = 1,
    dtype: str = "bf16",
    master_dtype: str = "fp32",
    sequence_parallel: bool = False,
) -> CostSettings:
    """Validated settings; every problem is a one-line :class:`CostError`."""
    for option, value in (
        ("--tp-size", tp_size),
        ("--dp-size", dp_size),
        ("--seq-len", seq_len),
        ("--micro-batch", micro_batch),
    ):
        if value < 1:
            raise CostError(f"{option} must be at least 1, got {value}")
    if sequence_parallel and seq_len % tp_size:
        raise CostError(
            f"--seq-len {seq_len} is not divisible by --tp-size {tp_size}: sequence parallel shards the sequence"
        )
    return CostSettings(
        tp_size=tp_size,
        dp_size=dp_size,
        seq_len=seq_len,
        micro_batch=micro_batch,
        dtype=normalize_dtype(dtype),
        master_dtype=normalize_dtype(master_dtype, "--master-dtype"),
        sequence_parallel=sequence_parallel,
    )

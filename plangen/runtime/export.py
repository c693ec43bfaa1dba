"""Hugging Face weights out of a parallelized model at bounded memory: streamed, or saved as safetensors.

- :func:`iter_hf_weights` yields ``(hugging_face_name, tensor)``, every tensor whole and in Hugging
  Face's layout (fused projections' rows put back, pad heads dropped, tied weights once), cast to
  ``dtype``: what an inference engine's ``load_weights`` takes to refit (vLLM's
  ``model.load_weights(weights)`` takes exactly this iterable). Every rank must iterate, in step: each
  parameter is gathered by broadcasts over its mesh, one rank's shard at a time into the output
  (:func:`plangen.styles.hf_layout.gather_whole`), so a rank holds its shard, the tensors it was handed and
  not yet dropped, and at most one more shard while a parameter is gathered.
- :func:`iter_hf_buckets` yields the same tensors in lists of at most ``bucket_bytes`` (a parameter
  larger than that alone), for consumers that send weights in buckets.
- :func:`save_hf_checkpoint` writes sharded safetensors, their index and the config (what
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads), atomically: into a temporary directory
  beside the target, renamed to it at the end; rank 0 writes, holding at most one file's tensors.

Nothing here needs a process group on an unsharded model.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from plangen.styles.hf_layout import HuggingFaceLayoutTensor, gather_whole

__all__ = ["iter_hf_weights", "iter_hf_buckets", "save_hf_checkpoint", "parse_size"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _entries(model: nn.Module):
    """``(name, state-dict value)`` in state-dict order, each parameter once (a tied one under its
    first name: the embedding's, as ``save_pretrained`` keeps it). Nothing is gathered here."""
    state_dict = model.state_dict()  # views of this rank's shards (plangen.styles.hf_layout)
    owners = dict(model.named_parameters(remove_duplicate=False))
    seen: set[int] = set()
    for name, value in state_dict.items():
        param = owners.get(name)
        if param is not None:
            if id(param) in seen:
                continue
            seen.add(id(param))
        yield name, value


def _target_dtype(value: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and value.is_floating_point() else value.dtype


def _whole(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    cast = _target_dtype(value, dtype)
    if isinstance(value, HuggingFaceLayoutTensor):
        return gather_whole(value.parameter_value(), value._row_map, cast)
    return gather_whole(value, None, cast)


def _nbytes(value: torch.Tensor, dtype: torch.dtype | None) -> int:
    return value.numel() * _target_dtype(value, dtype).itemsize


def iter_hf_buckets(
    model: nn.Module, *, dtype: torch.dtype | None = None, bucket_bytes: int | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Lists of ``(hugging_face_name, whole tensor)`` of at most ``bucket_bytes`` each (in ``dtype``;
    one parameter alone where it is larger; None: one parameter per list). Every rank, in step."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in _entries(model):
        nbytes = _nbytes(value, dtype)
        if bucket and (bucket_bytes is None or size + nbytes > bucket_bytes):
            out, bucket, size = bucket, [], 0
            yield out
            del out
        bucket.append((name, _whole(value, dtype)))
        size += nbytes
    if bucket:
        yield bucket


def iter_hf_weights(
    model: nn.Module, *, dtype: torch.dtype | None = None, bucket_bytes: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hugging_face_name, tensor)`` for every weight of ``model`` (parallelized by plangen or not), whole,
    in Hugging Face's layout, floating ones cast to ``dtype``, gathered one parameter at a time (or a
    bucket of ``bucket_bytes`` at a time). Every rank must iterate it to the end, in step; each gets
    every tensor. Drop each tensor once used: a kept one stays held."""
    for bucket in iter_hf_buckets(model, dtype=dtype, bucket_bytes=bucket_bytes):
        while bucket:
            yield bucket.pop(0)


def parse_size(size: int | str) -> int:
    """Bytes of ``5GB`` (10^9), ``5GiB`` (2^30), ``500MB``, or an int."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B|B)?\s*", size, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {size!r} (say 5GB, 500MiB or a number of bytes)")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    scale = {
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }[unit]
    return int(number * scale)


def _plan_files(entries: list[tuple[str, int]], max_bytes: int) -> dict[str, str]:
    """name -> file: the names in order, a new file where the next tensor would pass ``max_bytes``."""
    groups: list[list[str]] = []
    size = 0
    for name, nbytes in entries:
        if not groups or (groups[-1] and size + nbytes > max_bytes):
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) <= 1:
        return {name: SINGLE_NAME for name, _ in entries}
    return {
        name: f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i, group in enumerate(groups) for name in group
    }


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_hf_checkpoint(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model``'s weights (parallelized by plangen or not) as a Hugging Face checkpoint in
    ``directory``: safetensors files of at most ``max_shard_size`` each (one tensor alone where larger)
    with their index, the config (its ``dtype`` the saved one) and any generation config.

    Every rank calls it (the weights are gathered in step, :func:`iter_hf_weights`); rank 0 writes,
    holding one file's tensors at a time (on CPU), into ``.<name>.partial-<id>`` beside ``directory``,
    renamed to ``directory`` once complete: a crash before that leaves nothing under ``directory``'s
    name that was not there (and a previous checkpoint there whole). A previous checkpoint at
    ``directory`` is moved aside to ``.<name>.replaced-<id>`` just before the rename and deleted after
    it (a crash between the two leaves it whole under that name). The path on rank 0's filesystem;
    every rank returns once it is in place. ``dtype``: floating tensors cast (default: as held)."""
    directory = Path(directory)
    writer = _rank() == 0
    entries = [(name, _nbytes(value, dtype)) for name, value in _entries(model)]
    files = _plan_files(entries, parse_size(max_shard_size))
    last_of_file = {file: name for name, file in files.items()}  # dicts keep the last name per file
    partial = directory.parent / f".{directory.name}.partial-{uuid.uuid4().hex[:8]}"
    error: BaseException | None = None
    if writer:
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            partial.mkdir()
        except BaseException as exc:  # noqa: BLE001 - reported on every rank after the gathers
            error = exc
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in iter_hf_weights(model, dtype=dtype):
        if not writer or error is not None:
            continue
        try:
            pending[name] = tensor.detach().to("cpu").contiguous()
            del tensor
            if last_of_file[files[name]] == name:
                _write_file(partial / files[name], pending)
                pending = {}
        except BaseException as exc:  # noqa: BLE001
            error = exc
            pending = {}
    if writer and error is None:
        try:
            _write_metadata(model, partial, files, dict(entries), dtype)
            _move_into_place(partial, directory)
        except BaseException as exc:  # noqa: BLE001
            error = exc
    if error is not None:
        shutil.rmtree(partial, ignore_errors=True)
    _raise_on_every_rank(error, directory)
    return directory


def _write_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _write_metadata(
    model: nn.Module, partial: Path, files: dict[str, str], sizes: dict[str, int], dtype: torch.dtype | None
) -> None:
    if set(files.values()) != {SINGLE_NAME}:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": files}
        (partial / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = getattr(model, "config", None)
    if config is not None:
        config = copy.deepcopy(config)
        if dtype is not None:
            config.dtype = dtype
        config.save_pretrained(partial)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(partial)


def _move_into_place(partial: Path, directory: Path) -> None:
    replaced = None
    if directory.exists() or directory.is_symlink():
        replaced = directory.parent / f".{directory.name}.replaced-{uuid.uuid4().hex[:8]}"
        os.replace(directory, replaced)
    os.replace(partial, directory)
    if replaced is not None:
        shutil.rmtree(replaced) if replaced.is_dir() and not replaced.is_symlink() else replaced.unlink()


def _raise_on_every_rank(error: BaseException | None, directory: Path) -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        failed = torch.tensor([0 if error is None else 1], dtype=torch.int32)
        backend = dist.get_backend()
        if backend == "nccl":
            failed = failed.cuda()
        dist.all_reduce(failed)
        if error is None and failed.item():
            raise RuntimeError(f"save_hf_checkpoint({directory}): rank 0 failed to write; see its error")
    if error is not None:
        raise error

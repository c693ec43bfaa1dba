"""State-dict values in Hugging Face's layout at sharded memory, and gathering one parameter whole.

Some plangen layouts hold a parameter's rows in an order (or with rows) of their own: a fused
projection re-laid out per TP rank (:class:`plangen.styles.fused.FusedColwiseParallel`, the packed
depthwise convs, the packed experts), query heads padded to a multiple of the TP size
(:mod:`plangen.styles.padded_heads`), both at once (Falcon-7B's padded multi-query ``[q; k; v]``). Their
``state_dict()`` shows Hugging Face's layout without gathering anything: the entry is a
:class:`HuggingFaceLayoutTensor`, a DTensor of Hugging Face's shape whose local tensor is this
rank's shard of the parameter itself (no copy), with a *row map* that says which Hugging Face rows
each of its rows is (at most one contiguous run per fused part, pad rows in none).

- ``torch.distributed.checkpoint`` saves each run as a chunk at its Hugging Face offsets, and loads
  into the same views (straight into the parameter): a checkpoint saved at one layout loads at any
  other, or into a plain model, exactly; nothing is gathered either way.
- ``full_tensor()`` (and ``redistribute`` to ``Replicate``, which ``get_model_state_dict(...,
  full_state_dict=True)`` calls) gathers this one parameter in Hugging Face's layout:
  :func:`gather_whole`, at most the whole parameter plus one rank's shard of it.
- ``load_state_dict`` takes it back (the value already is the parameter's storage); a cast, a move
  to another device and a clone keep the layout over a copy of the shard; any other op on it is
  refused: its placements are the parameter's, its shape Hugging Face's.

:func:`gather_whole` gathers any DTensor (or plain tensor) this way, one source rank's shard at a
time into the output: what :mod:`plangen.runtime.export` streams.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from plangen.stack.torch_compat import (
    DISABLED_TORCH_FUNCTION,
    TO_COPY,
    DTensorSpec,
    TensorMeta,
    dtensor_spec,
    local_shape_and_offset,
    local_tensor,
)

from plangen.model.module_facts import output_dim


# The attribute a re-laid-out module carries: (part_sizes, tp_size, dims), what undoes its layout
# (plangen.styles.fused.install_layout_hooks sets it).
LAYOUT_ATTRIBUTE = "_plangen_fused_layout"
# On a module whose parameters hold pad: {parameter: (dim, rows of Hugging Face's values, padded size)}
# (plangen.styles.padded_heads sets it).
PAD_LAYOUT = "_plangen_pad_layout"


def interleave_index(rows: int, part_sizes: Sequence[int], tp_size: int) -> torch.Tensor:
    """The fused rows in their TP order: for each rank ``r``, the ``r``-th slice of every part.

    ``part_sizes`` are the parts' relative sizes (``(heads, kv_heads, kv_heads)``, ``(1, 1)``);
    ``permuted = fused.index_select(dim, index)``, and ``argsort(index)`` undoes it.
    """
    total = sum(part_sizes)
    if rows % total:
        raise ValueError(f"{rows} fused features do not split in the proportions {tuple(part_sizes)}")
    sizes = [rows // total * p for p in part_sizes]
    bad = [s for s in sizes if s % tp_size]
    if bad:
        raise ValueError(
            f"fused parts of {sizes} features (proportions {tuple(part_sizes)}) must each split evenly over "
            f"{tp_size} TP ranks; {bad[0]} does not"
        )
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return torch.cat(
        [
            torch.arange(start + rank * (size // tp_size), start + (rank + 1) * (size // tp_size))
            for rank in range(tp_size)
            for start, size in zip(starts, sizes)
        ]
    )


def relaid_dim(module: nn.Module, param_name: str, dims: dict[str, int] | None) -> int | None:
    # dims None: every parameter of the module is re-laid out on its output dim (a fused Linear);
    # else only the named ones, each on its own dim (a packed experts module's gate_up_proj).
    if dims is None:
        return output_dim(module, param_name)
    return dims.get(param_name)


@dataclass(frozen=True)
class RowMap:
    """Along ``dim``, the parameter's row ``p`` is Hugging Face's row ``to_hf[p]`` (-1: a pad row,
    in no Hugging Face tensor); Hugging Face's tensor has ``hf_rows`` rows there."""

    dim: int
    to_hf: tuple[int, ...]
    hf_rows: int

    def hf_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.hf_rows if d == self.dim else n for d, n in enumerate(shape))

    def to_hugging_face(self, whole: torch.Tensor) -> torch.Tensor:
        """A whole tensor in the parameter's rows put in Hugging Face's (pad rows dropped)."""
        order = sorted((p for p, hf in enumerate(self.to_hf) if hf >= 0), key=lambda p: self.to_hf[p])
        return whole.index_select(self.dim, torch.tensor(order, device=whole.device))

    def from_hugging_face(self, whole: torch.Tensor) -> torch.Tensor:
        """A whole tensor in Hugging Face's rows put in the parameter's (pad rows zero)."""
        real = [p for p, hf in enumerate(self.to_hf) if hf >= 0]
        shape = tuple(len(self.to_hf) if d == self.dim else n for d, n in enumerate(whole.shape))
        index = torch.tensor(real, device=whole.device)
        source = torch.tensor([self.to_hf[p] for p in real], device=whole.device)
        return whole.new_zeros(shape).index_copy_(self.dim, index, whole.index_select(self.dim, source))

    def runs(self, start: int, length: int) -> list[tuple[int, int, int]]:
        """The rows ``start:start+length`` of the parameter as runs ``(local row, HF row, rows)``:
        consecutive in both, pad rows left out."""
        runs: list[list[int]] = []
        for local, hf in enumerate(self.to_hf[start : start + length]):
            if hf < 0:
                continue
            if runs and runs[-1][0] + runs[-1][2] == local and runs[-1][1] + runs[-1][2] == hf:
                runs[-1][2] += 1
            else:
                runs.append([local, hf, 1])
        return [tuple(run) for run in runs]  # type: ignore[misc]


def row_map(module: nn.Module, param_name: str, shape: Sequence[int]) -> RowMap | None:
    """How ``module``'s parameter ``param_name`` (of ``shape``, the whole parameter) maps onto Hugging
    Face's tensor: the fused re-layout and the pad heads composed; None where it is Hugging Face's."""
    layout = getattr(module, LAYOUT_ATTRIBUTE, None)
    pad = getattr(module, PAD_LAYOUT, {}).get(param_name)
    relaid = None
    if layout is not None:
        part_sizes, tp_size, dims = layout
        relaid = relaid_dim(module, param_name, dims)
    if relaid is None and pad is None:
        return None
    dim = relaid if relaid is not None else pad[0]
    if pad is not None and pad[0] != dim:
        raise NotImplementedError(
            f"{type(module).__name__}.{param_name}: re-laid out on dim {dim}, padded on dim {pad[0]}"
        )
    rows = shape[dim]
    # The parameter's row p holds padded row index[p] (Hugging Face's order, pad heads in place).
    index = interleave_index(rows, part_sizes, tp_size).tolist() if relaid is not None else list(range(rows))
    if pad is None:
        return RowMap(dim, tuple(index), rows)
    _, real, size = pad
    if size != rows:
        raise ValueError(f"{type(module).__name__}.{param_name}: {rows} rows on dim {dim}, its pad layout says {size}")
    position = [-1] * size
    for hf, padded in enumerate(real):
        position[padded] = hf
    return RowMap(dim, tuple(position[p] for p in index), len(real))


# --- where every rank's shard lies ---------------------------------------------------------------


def rank_boxes(
    shape: Sequence[int], mesh, placements: Sequence[Any]
) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Every rank of ``mesh`` with the box it holds of a DTensor of ``shape``: ``(global rank, local
    shape, global offset)``, one rank per distinct box (replicas are left out), mesh order."""
    key = (tuple(shape), tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()), tuple(placements))
    cached = _BOXES.get(key)
    if cached is not None:
        return cached
    seen: set[tuple] = set()
    boxes = []
    for coordinate in itertools.product(*(range(n) for n in mesh.mesh.shape)):
        local, offset = local_shape_and_offset(shape, mesh.mesh.shape, coordinate, placements)
        if (local, offset) in seen:
            continue
        seen.add((local, offset))
        boxes.append((int(mesh.mesh[coordinate].item()), local, offset))
    _BOXES[key] = boxes
    return boxes


_BOXES: dict[tuple, list] = {}


def box_chunks(local_shape: Sequence[int], offset: Sequence[int], rows: RowMap | None):
    """A box of the parameter as chunks of Hugging Face's tensor: ``(slices into the box, HF
    offsets, sizes)``; one chunk where there is no row map, one per run otherwise."""
    if any(n == 0 for n in local_shape):
        return []
    if rows is None:
        return [(tuple(slice(None) for _ in local_shape), tuple(offset), tuple(local_shape))]
    chunks = []
    d = rows.dim
    for local, hf, length in rows.runs(offset[d], local_shape[d]):
        where = tuple(slice(local, local + length) if i == d else slice(None) for i in range(len(local_shape)))
        chunks.append(
            (
                where,
                tuple(hf if i == d else o for i, o in enumerate(offset)),
                tuple(length if i == d else n for i, n in enumerate(local_shape)),
            )
        )
    return chunks


def gather_whole(value: torch.Tensor, rows: RowMap | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor of ``value`` (a DTensor, else returned as it is, cast) in Hugging Face's
    layout, on every rank of its mesh; each rank's shard cast to ``dtype`` before it is sent.

    Memory: the output and one buffer of a rank's box (a broadcast from each rank holding a
    distinct box, in turn, through that buffer). Never a second whole copy (a
    ``full_tensor()`` then a re-order would hold two). Needs the mesh to span the
    default process group; over a smaller mesh, ``full_tensor()`` and a re-order instead."""
    if not isinstance(value, DTensor):
        return value if dtype is None else value.to(dtype)
    local = local_tensor(value) if dtype is None else local_tensor(value).to(dtype)
    mesh = value.device_mesh
    shape = tuple(dtensor_spec(value).shape)
    if mesh.mesh.numel() != dist.get_world_size():
        whole = DTensor.from_local(
            local, mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
        ).full_tensor()
        if rows is None:
            return whole
        keep = [p for p, h in enumerate(rows.to_hf) if h >= 0]
        order = sorted(keep, key=lambda p: rows.to_hf[p])
        return whole.index_select(rows.dim, torch.tensor(order, device=whole.device))
    out = torch.empty(rows.hf_shape(shape) if rows else shape, dtype=local.dtype, device=local.device)
    me = dist.get_rank()
    boxes = rank_boxes(shape, mesh, value.placements)
    # Every broadcast goes through one buffer of the largest box, never through views of ``out``:
    # a collective's backend may keep its tensor a moment after wait() returns (gloo's worker thread
    # until the end of its loop iteration; NCCL's watchdog until it cleans the work up), and a view
    # would keep this whole output alive after the caller has dropped it, beside the next one.
    scratch = torch.empty(
        max((math.prod(box) for _, box, _ in boxes), default=0), dtype=local.dtype, device=local.device
    )
    for rank, box, offset in boxes:
        buffer = scratch[: math.prod(box)].view(box)
        if rank == me:
            buffer.copy_(local)
        dist.broadcast(buffer, src=rank)
        for where, hf_offset, sizes in box_chunks(box, offset, rows):
            out[tuple(slice(o, o + n) for o, n in zip(hf_offset, sizes))].copy_(buffer[where])
    return out


# --- the state-dict value ------------------------------------------------------------------------


class HuggingFaceLayoutTensor(DTensor):
    """A state-dict entry in Hugging Face's layout over this rank's shard of the parameter (see the
    module docstring). Its shape is Hugging Face's; its placements are the parameter's."""

    _row_map: RowMap
    _parameter_spec: DTensorSpec

    @staticmethod
    def wrap(value: DTensor, rows: RowMap) -> "HuggingFaceLayoutTensor":
        shape = torch.Size(rows.hf_shape(value.shape))
        stride = torch.empty(shape, device="meta").stride()
        spec = DTensorSpec(
            value.device_mesh, tuple(value.placements), tensor_meta=TensorMeta(shape, stride, value.dtype)
        )
        out = HuggingFaceLayoutTensor(local_tensor(value), spec, requires_grad=False)
        out._row_map = rows
        out._parameter_spec = dtensor_spec(value)
        return out

    def parameter_value(self) -> DTensor:
        """This rank's shard as the parameter holds it (a DTensor of the parameter's layout, the same storage)."""
        return DTensor(local_tensor(self), self._parameter_spec, requires_grad=False)

    def __repr__(self) -> str:  # type: ignore[override]
        return (
            f"HuggingFaceLayoutTensor(shape={tuple(self.shape)}, local rows of the parameter's "
            f"{tuple(self._parameter_spec.placements)} over {self.device_mesh}, re-mapped on dim {self._row_map.dim})"
        )

    def _chunks(self):
        spec = self._parameter_spec
        local, offset = local_shape_and_offset(
            spec.shape, spec.mesh.mesh.shape, spec.mesh.get_coordinate(), spec.placements
        )
        return box_chunks(local, offset, self._row_map)

    # torch.distributed.checkpoint: one chunk per run of rows, at Hugging Face's offsets.
    def __create_write_items__(self, fqn: str, object: Any):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        properties = TensorProperties.create_from_tensor(local_tensor(self))
        return [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(offset)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(offset), torch.Size(sizes)),
                    properties=properties,
                    size=self.size(),
                ),
            )
            for _, offset, sizes in self._chunks()
        ]

    def __create_chunk_list__(self):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(torch.Size(offset), torch.Size(sizes)) for _, offset, sizes in self._chunks()]

    def __get_tensor_shard__(self, index):
        for where, offset, _ in self._chunks():
            if torch.Size(offset) == index.offset:
                return local_tensor(self)[where]
        raise ValueError(f"no chunk at offset {index.offset} of {index.fqn} on this rank")

    def full_tensor(self, *, grad_placements: Any = None) -> torch.Tensor:  # type: ignore[override]
        return gather_whole(self.parameter_value(), self._row_map)

    def redistribute(self, device_mesh: Any = None, placements: Any = None, **kwargs: Any) -> DTensor:  # type: ignore[override]
        mesh = device_mesh or self.device_mesh
        if mesh is not self.device_mesh or any(not p.is_replicate() for p in placements or ()):
            raise NotImplementedError(
                "a Hugging Face layout state-dict entry redistributes to Replicate() on its own mesh only"
            )
        return DTensor.from_local(self.full_tensor(), mesh, [Replicate()] * mesh.ndim, run_check=False)

    def _over(self, local: torch.Tensor) -> "HuggingFaceLayoutTensor":
        """The same layout over ``local`` (a copy or view of this entry's local shard, maybe cast)."""
        spec, p = dtensor_spec(self), self._parameter_spec
        meta = spec.tensor_meta
        out = HuggingFaceLayoutTensor(
            local,
            DTensorSpec(spec.mesh, spec.placements, tensor_meta=TensorMeta(meta.shape, meta.stride, local.dtype)),
            requires_grad=False,
        )
        out._row_map = self._row_map
        out._parameter_spec = DTensorSpec(p.mesh, p.placements, tensor_meta=TensorMeta(p.shape, p.stride, local.dtype))
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        # A cast, a move to another device (what torch's staging for an asynchronous checkpoint and
        # cpu_offload do) and a clone keep the layout over a copy of the local shard. Handled here, at
        # the Python API: torch 2.11 dispatches a DTensor subclass's aten ops in C++ without calling its
        # __torch_dispatch__, which then gave a plain DTensor over the parameter's rows (wrong offsets).
        kwargs = kwargs or {}
        if (
            func in _LOCAL_METHODS
            and args
            and isinstance(args[0], HuggingFaceLayoutTensor)
            and not any(isinstance(v, torch.Tensor) for v in (*args[1:], *kwargs.values()))
        ):
            return args[0]._over(func(local_tensor(args[0]), *args[1:], **kwargs))
        result = DISABLED_TORCH_FUNCTION(func, types, args, kwargs)
        if isinstance(result, DTensor) and not isinstance(result, HuggingFaceLayoutTensor):
            _refuse(func)  # torch 2.11 computed it on the parameter's rows as if they were Hugging Face's
        return result

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func in _LOCAL_OPS and not any(isinstance(v, torch.Tensor) for v in (*args[1:], *(kwargs or {}).values())):
            # The same layout over a copy (or view) of the local shard (see __torch_function__; this is
            # the path of ops reached below the Python API, on torch >= 2.13).
            return args[0]._over(func(local_tensor(args[0]), *args[1:], **(kwargs or {})))
        _refuse(func)


def _refuse(func) -> None:
    raise TypeError(
        f"{func}: a state-dict entry in Hugging Face's layout over a re-laid-out parameter takes no tensor ops; "
        "call .full_tensor() (one parameter gathered), save it with torch.distributed.checkpoint, load it back "
        "with load_state_dict, or stream the weights with plangen.runtime.export.iter_hf_weights"
    )


_LOCAL_OPS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default, TO_COPY, torch.ops.aten.clone.default)
_LOCAL_METHODS = (
    torch.Tensor.to,
    torch.Tensor.cpu,
    torch.Tensor.cuda,
    torch.Tensor.clone,
    torch.clone,
    torch.Tensor.detach,
    torch.detach,
    torch.Tensor.float,
    torch.Tensor.half,
    torch.Tensor.bfloat16,
    torch.Tensor.double,
)


def hugging_face_value(module: nn.Module, param_name: str, value: torch.Tensor) -> torch.Tensor:
    """``value`` (the parameter's state-dict entry) shown in Hugging Face's layout: a
    :class:`HuggingFaceLayoutTensor` over it for a DTensor (nothing gathered), the re-ordered rows
    without pad for a plain tensor; unchanged where the parameter is in Hugging Face's layout."""
    if isinstance(value, HuggingFaceLayoutTensor):
        return value
    rows = row_map(module, param_name, tuple(value.shape))
    if rows is None:
        return value
    if isinstance(value, DTensor):
        return HuggingFaceLayoutTensor.wrap(value, rows)
    return rows.to_hugging_face(value)


_UNWRAP = "_plangen_unwrap_hook"


def keep_unwrap_last(module: nn.Module) -> None:
    """A load pre-hook after every other on ``module``: a :class:`HuggingFaceLayoutTensor` entry (read
    from this model's own state dict, loaded in place by ``torch.distributed.checkpoint``) goes back
    as the parameter's own layout. Call after registering a load pre-hook; the others skip such entries."""

    def unwrap(mod: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
        for param_name, _ in mod.named_parameters(recurse=False):
            value = state_dict.get(prefix + param_name)
            if isinstance(value, HuggingFaceLayoutTensor):
                state_dict[prefix + param_name] = value.parameter_value()

    handle = getattr(module, _UNWRAP, None)
    if handle is None:
        handle = module.register_load_state_dict_pre_hook(unwrap)
        setattr(module, _UNWRAP, handle)
    module._load_state_dict_pre_hooks.move_to_end(handle.id)

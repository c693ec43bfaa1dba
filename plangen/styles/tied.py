"""Tied embeddings as a pair of styles: one weight, vocabulary-sharded once, at both ends.

A model with ``tie_word_embeddings`` has one ``nn.Parameter`` in two modules, the input embedding
and the output head. ``parallelize_module`` applies a plan's styles one module at a time, and each
of torch's styles registers a new DTensor parameter of its own: after
``RowwiseParallel`` on the embedding and ``ColwiseParallel`` on the head the model holds two
parameters, and a runtime that does not re-tie them (NeMo RL's ``_parallelize_model``) trains two
copies that drift apart. :class:`TiedEmbeddingParallel` and :class:`TiedHeadParallel` keep the tie
by themselves, whatever runs them:

* both give the weight the same layout, ``Shard(0)`` on the vocabulary (a row-parallel embedding,
  a column-parallel head), so one parameter can serve both modules;
* whichever of the two ``parallelize_module`` applies first distributes the weight and leaves it
  here, under the original parameter; the other finds it there (its module still holds that
  original parameter) and registers the very same ``nn.Parameter``. Dict order does not matter.

The hand-over is keyed by the original parameter object, held weakly on both sides, so nothing is
kept alive, a plan dict can be applied to several models (each has its own weights), and an untied
model simply gets two parameters as with torch's styles. Everything else (layouts, forward,
backward) is torch's ``RowwiseParallel`` / ``ColwiseParallel``: the embedding's partial lookups are
summed (or reduce-scattered under sequence parallel), the head's logits leave sharded on the
vocabulary (loss parallel) or gathered, as the arguments say.
"""

from __future__ import annotations

import weakref

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.overrides import TorchFunctionMode
from plangen.plan.style_facts import EMBEDDING, LINEAR, MODULE_HOOKS, PARTIAL_SUM, REPLICATE, SHARD_LAST, StyleFacts
from plangen.styles.local_tensors import LocalParameters, run_on_local_tensors
from plangen.styles.base import PlangenStyle

VOCAB = Shard(0)  # the one layout both ends give the tied weight ([vocab, hidden] in both modules)


def vocab_shard_start(rows: int, mesh: DeviceMesh) -> int:
    """The first row this rank holds of a ``Shard(0)`` weight of ``rows`` rows: Shard(0) splits as
    torch.chunk does, ceil(rows / tp) rows per rank, fewer on the last."""
    return mesh.get_local_rank() * -(-rows // mesh.size())


# id(original parameter) -> (the original, its sharded replacement), both weak: what the first end
# of a pair left for the second.
_HANDED_OVER: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def share_vocab_sharded(weight: nn.Parameter, device_mesh: DeviceMesh, src_data_rank: int | None) -> nn.Parameter:
    """The vocabulary-sharded parameter for ``weight``: made here by the first end, taken by the second."""
    for key, (original, sharded) in list(_HANDED_OVER.items()):
        if original() is None or sharded() is None:
            del _HANDED_OVER[key]
    entry = _HANDED_OVER.get(id(weight))
    if entry is not None and entry[0]() is weight:
        shared = entry[1]()
        if isinstance(shared, DTensor) and shared.device_mesh == device_mesh and tuple(shared.placements) == (VOCAB,):
            del _HANDED_OVER[id(weight)]  # both ends have it now
            return shared  # type: ignore[return-value]
    shared = nn.Parameter(
        distribute_tensor(weight, device_mesh, [VOCAB], src_data_rank=src_data_rank), requires_grad=weight.requires_grad
    )
    _HANDED_OVER[id(weight)] = (weakref.ref(weight), weakref.ref(shared))
    return shared


class TiedEmbeddingParallel(RowwiseParallel, PlangenStyle):
    """The input-embedding end of a tied pair: vocabulary-parallel ``nn.Embedding`` (``RowwiseParallel``).

    Token ids come in whole (``input_layouts`` defaults to ``Replicate()``); each rank looks up its
    vocabulary slice and the partial lookups are reduced to ``output_layouts`` (``Replicate()``:
    all-reduce; ``Shard(1)``: reduce-scatter into the sequence-parallel residual). The weight is the
    one :class:`TiedHeadParallel` uses (see the module docstring).

    ``local_lookup=True`` runs the module's own forward on this rank's partial lookup, as plain
    tensors, and reduces what it returns: for an embedding that post-processes its lookup linearly
    inside the module (Gemma3's ``Gemma3TextScaledWordEmbedding`` multiplies by ``embed_scale``),
    the scale then acts on the partial sums and the reduction is the one ``output_layouts`` asks
    for (a reduce-scatter under sequence parallel), where DTensor would all-reduce the lookup before
    the scale. Exact: each token's row lives on one rank, the others add zeros. Only for a forward
    linear in the lookup.
    """

    # A tied embedding and head: one weight, vocabulary-sharded at both ends (plangen.styles.tied).
    facts = StyleFacts(
        "rowwise",
        shard_dim={EMBEDDING: 0},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": REPLICATE},
        produces=PARTIAL_SUM,
        tied_partner="TiedHeadParallel",
        hooks=MODULE_HOOKS,
    )

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        local_lookup: bool = False,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts or Replicate(), output_layouts=output_layouts, use_local_output=use_local_output
        )
        self.local_lookup = local_lookup

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise NotImplementedError(f"{type(self).__name__} shards the input embedding (nn.Embedding) only")
        if not self.local_lookup:
            return super()._apply(module, device_mesh)
        self._partition_embedding_fn("", module, device_mesh)
        apply_local_lookup(module, device_mesh, self.output_layouts[0], self.use_local_output)
        return module

    def _partition_embedding_fn(self, name, module, device_mesh):
        module.register_parameter("weight", share_vocab_sharded(module.weight, device_mesh, self.src_data_rank))


class ScaledEmbeddingParallel(RowwiseParallel, PlangenStyle):
    """A vocabulary-parallel ``nn.Embedding`` that scales its own lookup (Gemma's
    ``ScaledWordEmbedding``) and is not tied: the module's forward runs on this rank's partial
    lookup, then one reduction to ``output_layouts`` (as :class:`TiedEmbeddingParallel` with
    ``local_lookup=True``, which :func:`plangen.plans.tied.tie_plan_entries` puts here where the
    embedding is tied to the head)."""

    # An untied embedding that scales its own lookup: vocabulary-sharded, its forward on the partial lookup.
    facts = StyleFacts(
        "rowwise",
        shard_dim={EMBEDDING: 0},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": REPLICATE},
        produces=PARTIAL_SUM,
        hooks=MODULE_HOOKS,
    )

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
    ) -> None:
        super().__init__(
            input_layouts=input_layouts or Replicate(), output_layouts=output_layouts, use_local_output=use_local_output
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise NotImplementedError(f"{type(self).__name__} shards the input embedding (nn.Embedding) only")
        self._partition_embedding_fn("", module, device_mesh)
        apply_local_lookup(module, device_mesh, self.output_layouts[0], self.use_local_output)
        return module


def apply_local_lookup(
    module: nn.Embedding, device_mesh: DeviceMesh, output_layout: Placement, use_local_output: bool
) -> None:
    """During each forward, ``module`` looks up this rank's vocabulary rows in plain tensors (ids
    outside them read row 0 and are zeroed after the forward); its output, a partial sum over TP,
    is reduced to ``output_layout``."""
    state: dict[str, Any] = {}

    def swap_in(params: LocalParameters, mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ids, *rest = args
        if isinstance(ids, DTensor):
            ids = ids.full_tensor()
        weight = mod.weight
        local = weight.to_local() if isinstance(weight, DTensor) else weight
        rows = local.shape[0]
        start = vocab_shard_start(weight.shape[0], device_mesh)
        outside = (ids < start) | (ids >= start + rows)
        state.update(outside=outside, padding_idx=mod.padding_idx)
        pad = mod.padding_idx
        mod.padding_idx = pad - start if pad is not None and start <= pad < start + rows else None
        params.replace(mod, "weight", local)
        return ((ids - start).masked_fill(outside, 0), *rest), kwargs

    def reduce(mod: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor | None) -> Any:
        mod.padding_idx = state.pop("padding_idx")
        outside = state.pop("outside")
        if output is None:  # the forward raised: the weight and padding index are back, nothing to reduce
            return output
        partial = output.masked_fill(outside.unsqueeze(-1), 0)
        out = DTensor.from_local(partial, device_mesh, (Partial(),), run_check=False)
        out = out.redistribute(device_mesh, (output_layout,))
        return out.to_local() if use_local_output else out

    run_on_local_tensors(module, swap_in, reduce)


class TiedHeadParallel(ColwiseParallel, PlangenStyle):
    """The output-head end of a tied pair: column-parallel ``nn.Linear`` over the vocabulary.

    The input comes in as ``input_layouts`` (``Replicate()``, or ``Shard(1)`` under sequence parallel,
    gathered here); the logits leave as ``output_layouts`` (``Shard(-1)``: vocabulary-parallel, for
    :func:`plangen.loss.vocab_parallel_cross_entropy`; ``Replicate()``: gathered). The weight is the
    one :class:`TiedEmbeddingParallel` uses (see the module docstring).
    """

    facts = StyleFacts(
        "colwise",
        shard_dim={LINEAR: 0},
        layout_defaults={"input_layouts": REPLICATE, "output_layouts": SHARD_LAST},
        produces=SHARD_LAST,
        tied_partner="TiedEmbeddingParallel",
        hooks=MODULE_HOOKS,
    )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{type(self).__name__} shards the output head (nn.Linear) only")
        return super()._apply(module, device_mesh)

    def _partition_linear_fn(self, name, module, device_mesh):
        module.register_parameter("weight", share_vocab_sharded(module.weight, device_mesh, self.src_data_rank))
        if module.bias is not None:  # not tied: sharded with the vocabulary as ColwiseParallel does
            module.register_parameter(
                "bias",
                nn.Parameter(
                    distribute_tensor(module.bias, device_mesh, [VOCAB], src_data_rank=self.src_data_rank),
                    requires_grad=module.bias.requires_grad,
                ),
            )


class EmbeddingRowReadParallel(PlangenStyle):
    """A module whose own forward reads rows of a vocabulary-sharded embedding's weight (Gemma 4's
    multimodal model: ``self.language_model.embed_tokens.weight[pad_token_id, :]``), applied to
    that module; ``embedding`` is the embedding's path below it.

    During the module's forward, ``weight[i, ...]`` on that embedding's (vocabulary-sharded) weight
    returns the whole row ``i`` as a plain tensor, as one device reads it: the rank holding the row
    contributes it, the others zeros, summed over TP by one all-reduce of ``hidden`` values (exact:
    one term is not zero); its gradient flows back to the holding rank's shard. Nothing else in the
    forward is touched; any other read of that weight's values fails with the module's name rather
    than meeting plain tensors as a DTensor deep inside it.

    Under sequence parallelism the module then mixes that row with the embedding's sequence-sharded
    output (``torch.where(mask[..., None], row, inputs_embeds)``, where ``mask`` marks multimodal
    placeholders): a ``torch.where`` of DTensors and plain tensors takes the plain ones, the same
    on every rank in the module's forward (the row read whole, masks of the whole input), as
    ``Replicate`` DTensors, so each rank keeps its own sequence shard (no communication).
    """

    # On a module whose own forward reads rows of a vocabulary-sharded embedding's weight (Gemma 4):
    # those rows read whole, one small all-reduce each; the weight is the embedding style's business.
    facts = StyleFacts("other")

    def __init__(self, *, embedding: str) -> None:
        super().__init__()
        self.embedding = embedding

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        table = module.get_submodule(self.embedding)
        mode = _RowReads(table, device_mesh, f"{type(module).__name__}.{self.embedding}.weight")
        entered: list[bool] = []

        def enter(mod: nn.Module, args: tuple) -> None:
            mode.__enter__()
            entered.append(True)

        def leave(mod: nn.Module, args: tuple, output: Any) -> None:
            if entered:  # always_call: also after an exception, and only what enter pushed
                entered.pop()
                mode.__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave, always_call=True)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(embedding={self.embedding!r})"


class _RowReads(TorchFunctionMode):
    """Rows of ``table.weight`` (a ``Shard(0)`` DTensor on ``mesh``) read whole; see above."""

    def __init__(self, table: nn.Module, mesh: DeviceMesh, what: str) -> None:
        super().__init__()
        self.table, self.mesh, self.what = table, mesh, what

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.where and any(isinstance(a, DTensor) for a in args):
            return func(*(self._replicated(a) for a in args), **kwargs)
        weight = self.table._parameters.get("weight")
        if func is not torch.Tensor.__getitem__ or not args or args[0] is not weight or not isinstance(weight, DTensor):
            return func(*args, **kwargs)
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        row = key[0]
        if isinstance(row, torch.Tensor) and row.dim() == 0 and not row.is_floating_point():
            row = int(row)
        if not isinstance(row, int) or tuple(weight.placements) != (VOCAB,) or weight.device_mesh != self.mesh:
            raise NotImplementedError(
                f"EmbeddingRowReadParallel: {self.what}[{args[1]!r}] on a {weight.placements} weight: only a row "
                "by an integer index of the vocabulary-sharded weight is read whole"
            )
        vocab = weight.shape[0]
        row %= vocab
        local = weight.to_local()
        start = vocab_shard_start(vocab, self.mesh)
        held = start <= row < start + local.shape[0]
        # A zero row that takes part in autograd too: every rank then runs the same backward, and a
        # collective in it (the row meeting a sequence-sharded DTensor under SP) is issued by all.
        part = local[row - start] if held else local.new_zeros(local.shape[1:]).requires_grad_(local.requires_grad)
        from plangen.styles.tp_sums import SumOverMesh  # one all-reduce forward, the gradient as it is back

        whole = SumOverMesh.apply(part, self.mesh.get_group())
        return whole[key[1:]] if len(key) > 1 else whole

    def _replicated(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            return DTensor.from_local(value, self.mesh, (Replicate(),), run_check=False)
        return value

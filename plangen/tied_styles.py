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

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

VOCAB = Shard(0)  # the one layout both ends give the tied weight ([vocab, hidden] in both modules)

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


class TiedEmbeddingParallel(RowwiseParallel):
    """The input-embedding end of a tied pair: vocabulary-parallel ``nn.Embedding`` (``RowwiseParallel``).

    Token ids come in whole (``input_layouts`` defaults to ``Replicate()``); each rank looks up its
    vocabulary slice and the partial lookups are reduced to ``output_layouts`` (``Replicate()``:
    all-reduce; ``Shard(1)``: reduce-scatter into the sequence-parallel residual). The weight is the
    one :class:`TiedHeadParallel` uses (see the module docstring).
    """

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
        return super()._apply(module, device_mesh)

    def _partition_embedding_fn(self, name, module, device_mesh):
        module.register_parameter("weight", share_vocab_sharded(module.weight, device_mesh, self.src_data_rank))


class TiedHeadParallel(ColwiseParallel):
    """The output-head end of a tied pair: column-parallel ``nn.Linear`` over the vocabulary.

    The input comes in as ``input_layouts`` (``Replicate()``, or ``Shard(1)`` under sequence parallel,
    gathered here); the logits leave as ``output_layouts`` (``Shard(-1)``: vocabulary-parallel, for
    :func:`plangen.loss.vocab_parallel_cross_entropy`; ``Replicate()``: gathered). The weight is the
    one :class:`TiedEmbeddingParallel` uses (see the module docstring).
    """

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


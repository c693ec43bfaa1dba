"""NeMo RL's per-model plan functions and its remaining helpers, answered by plangen's plans.

``nemo_rl.models.dtensor.parallelize`` exposes ``_parallelize_llama``, ``_parallelize_qwen`` and
``_parallelize_gemma3`` (``(model, sequence_parallel=False) -> dict[str, ParallelStyle]``), and,
in some releases, ``SequenceParallelAllGatherActivation`` and
``get_logprobs_from_vocab_parallel_logits``. Code (and NeMo RL's own unit tests) imports them by
name; :mod:`plangen.parallelize` re-exports them from here. Each plan function returns the plan
plangen's runtime would apply to that model (:func:`plangen.plans.choice.choose_plan`: the
hand-written plan for the five classes NeMo RL plans), not NeMo RL's dicts, which differ where those
are wrong (docs/nemo-rl.md): per-head norms (Qwen3, Gemma3 ``q_norm``/``k_norm``) get their weight
gradient summed over TP ranks, with SP on or off; q/k/v and gate/up share one gathered input (two
collectives per layer, NeMo RL's five); both ends of a tied embedding are sharded on the vocabulary.

Tied embeddings: with torch's styles at both ends ``parallelize_module`` gives the embedding and
the head a DTensor each. plangen's plans give a tied pair
:class:`~plangen.styles.tied.TiedEmbeddingParallel` / :class:`~plangen.styles.tied.TiedHeadParallel`
instead, which share one sharded weight, so these dicts keep the tie under a runtime that only calls
``parallelize_module`` (NeMo RL's). plangen's runtime also re-ties what a custom plan split apart
(:func:`plangen.runtime.tensor_parallel.apply_tp`).
"""

from __future__ import annotations

import logging
from typing import Optional, Union

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from plangen.loss import vocab_parallel_logprobs
from plangen.plans.checks import resolve_tied_styles
from plangen.plans.choice import choose_plan

logger = logging.getLogger("plangen")


def _plangen_styles(model: nn.Module, sequence_parallel: bool, nemo_name: str) -> dict[str, ParallelStyle]:
    # The same choice the runtime makes, so the NeMo RL name and parallelize_model cannot disagree.
    chosen = choose_plan(model, sequence_parallel)
    logger.info("plangen: %s: using the %s plan: %s", nemo_name, chosen.source, chosen.reason)
    return resolve_tied_styles(model, chosen.build_styles())


def _parallelize_llama(model: nn.Module, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """plangen's plan for a LlamaForCausalLM (NeMo RL's name), as ``{pattern: ParallelStyle}``.

    Any other class gets its own plan the same way (the runtime's choice), never Llama's keys.
    """
    return _plangen_styles(model, sequence_parallel, "_parallelize_llama")


def _parallelize_qwen(model: nn.Module, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """plangen's plan for a Qwen2ForCausalLM or Qwen3ForCausalLM (NeMo RL's name).

    Qwen3's per-head ``q_norm``/``k_norm`` weights get their gradient summed over TP ranks with SP
    on or off; Qwen2 has none, so its plan names none (NeMo RL's SP plan names them for Qwen2 too).
    """
    return _plangen_styles(model, sequence_parallel, "_parallelize_qwen")


def _parallelize_gemma3(model: nn.Module, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """plangen's plan for a Gemma3ForCausalLM or the text tower of a Gemma3ForConditionalGeneration.

    Per-head ``q_norm``/``k_norm`` as for Qwen3; the tied embedding and head one vocabulary-sharded
    parameter (the tied pair of styles).
    """
    return _plangen_styles(model, sequence_parallel, "_parallelize_gemma3")


class SequenceParallelAllGatherActivation(SequenceParallel):
    """NeMo RL's sequence-parallel norm whose output is all-gathered along the sequence.

    Parameters replicated and the input taken as sequence-sharded, as :class:`SequenceParallel`;
    the output, if sharded, is redistributed to ``Replicate()`` before it is handed on (local with
    ``use_local_output=True``). plangen's plans do not use it: they gather inside the column-parallel
    projections that follow the norm (one all-gather per block, the Megatron minimum).
    """

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):  # type: ignore[override]
        if not isinstance(outputs, DTensor):
            raise ValueError(f"{type(mod).__name__}: expected a DTensor output, got {type(outputs).__name__}")
        if any(isinstance(p, Shard) for p in outputs.placements):
            outputs = outputs.redistribute(device_mesh=device_mesh, placements=[Replicate()])
        return outputs.to_local() if use_local_output else outputs


def get_logprobs_from_vocab_parallel_logits(
    vocab_parallel_logits: DTensor,
    input_ids: Union[torch.Tensor, DTensor],
    seq_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Log-probability of each next token, ``[batch, seq - 1]``, from vocabulary-sharded logits.

    NeMo RL 0.3's name: ``logprobs[:, t] = log softmax(logits[:, t])[input_ids[:, t + 1]]``, computed
    on each rank's vocabulary slice in chunks of tokens with two small all-reduces
    (:func:`plangen.loss.vocab_parallel_logprobs`), the vocabulary never gathered. Plain (unsharded)
    logits work too. Context-parallel logits (``seq_index``) are not supported.
    """
    if seq_index is not None:
        raise NotImplementedError(
            "get_logprobs_from_vocab_parallel_logits: context parallel (seq_index) is not supported"
        )
    if isinstance(input_ids, DTensor):
        input_ids = input_ids.full_tensor()
    targets = input_ids[:, 1:]
    return vocab_parallel_logprobs(vocab_parallel_logits[:, :-1], targets)


__all__ = [
    "SequenceParallelAllGatherActivation",
    "_parallelize_gemma3",
    "_parallelize_llama",
    "_parallelize_qwen",
    "get_logprobs_from_vocab_parallel_logits",
]

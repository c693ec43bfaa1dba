"""The shrunk model that level 2's run-time checks work on (PG214, PG215), built once per model and
TP size in a process, and the plan's keys that select a module of it (a shrunk model has fewer
layers than the one the keys were checked against).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


@dataclass(frozen=True)
class ShrunkModel:
    """A shrunk model (:func:`plangen.model.shrink.build_tiny_model`), a batch for it, and the plan on it:
    ``written`` as the file wrote it (what the runtime takes), ``styles`` after the runtime's
    tied-embedding resolution (what it applies). Never changed by the checks that read it."""

    model: "nn.Module"
    input_ids: Any
    written: Mapping[str, "ParallelStyle"]
    styles: Mapping[str, "ParallelStyle"]


_SHRUNK: dict[tuple[int, int], Any] = {}


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the shrunk model: its ops are too small to share, and sharing them
    costs several times their CPU time (a fake-group run: 1.1 s CPU on two threads, 0.2 s on one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def build_shrunk_model(source: Any, tp_size: int, written: Mapping[str, "ParallelStyle"]) -> ShrunkModel | None:
    """The shrunk model of ``source`` (built once per spec and TP size in a process) with the keys of
    ``written`` that select one of its modules (a shrunk model has fewer layers)."""
    import warnings

    from plangen.plans.checks import resolve_tied_styles
    from plangen.model.shrink import build_tiny_model

    cache = (id(source), tp_size)
    if cache not in _SHRUNK:
        try:
            with warnings.catch_warnings(), one_thread():
                warnings.simplefilter("ignore")
                model = build_tiny_model(source, tp_size=tp_size, seed=0)
            _SHRUNK[cache] = (source, model, sample_batch(model, tp_size))
        except Exception:  # noqa: BLE001 - an architecture that cannot be shrunk: nothing to run
            _SHRUNK[cache] = (source, None, None)
    _, model, ids = _SHRUNK[cache]
    if model is None:
        return None
    matching = matching_styles(model, written)
    return ShrunkModel(model, ids, matching, resolve_tied_styles(model, matching))


def matching_styles(model: "nn.Module", styles: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that select a module of this model: a shrunk model has fewer layers, so a key
    naming layer 31 selects nothing in it (level 2 checked every key against the real model)."""
    from plangen.model.module_tree import find_unmatched_keys

    unmatched = set(find_unmatched_keys(model, styles))
    return {key: style for key, style in styles.items() if key not in unmatched}


SAMPLE_BATCH = 2  # sequences in the batch of :func:`sample_batch`


def sample_batch(model: "nn.Module", tp_size: int, seed: int = 1) -> "torch.Tensor":
    """Token ids below the special tokens (image placeholders) of a tiny model, a sequence length
    every TP size divides (sequence parallel needs it); the same on every process."""
    import torch

    from plangen.model.resolve import text_config
    from plangen.model.shrink import SPECIAL_TOKEN_SPAN

    vocab = text_config(model.config).vocab_size
    seq = tp_size * max(1, -(-8 // tp_size))
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, max(2, vocab - SPECIAL_TOKEN_SPAN), (SAMPLE_BATCH, seq), generator=generator)

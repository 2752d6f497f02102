"""What answers the local server's requests: the batch scheduler over the generator
(:mod:`ngram_trie_rag.serving.scheduler`) where it takes the model, else the generator
itself (one request at a time, in turn on the model's lock: a model the batched engine
does not serve). The banner says which one answers (:func:`describe`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .defaults import MAX_BATCH, MAX_QUEUE, PREFILL_CHUNK


@dataclass(frozen=True)
class Choice:
    """The backend and what the banner says of it."""

    backend: Any
    name: str  # "BatchScheduler" or "SpeculativeGenerator"
    max_batch: int  # requests decoded together (1: the generator's turn-taking)
    capacity: int | None  # cache positions reserved per request; None: grows as it goes
    why: str = ""  # why the generator answers alone (the scheduler refused the model)


def choose_backend(generator: Any, *, max_batch: int = MAX_BATCH, max_queue: int = MAX_QUEUE,
                   prefill_chunk: int | None = PREFILL_CHUNK) -> Choice:
    """The scheduler over ``generator`` (``max_batch`` decoded together, ``max_queue``
    waiting at most, prompts joining ``prefill_chunk`` tokens per step of the others), or
    the generator where the scheduler refuses the model."""
    from .scheduler import BatchScheduler

    if max_batch < 1 or max_queue < 1:
        raise ValueError(f"max_batch and max_queue must be >= 1, got {max_batch} and "
                         f"{max_queue}")
    alone = Choice(generator, "SpeculativeGenerator", 1,
                   getattr(generator.engine, "capacity", None))
    try:
        backend = BatchScheduler(generator, max_batch=max_batch, max_queue=max_queue,
                                 prefill_chunk=prefill_chunk)
    except (ValueError, TypeError, NotImplementedError) as exc:  # a model it cannot batch
        return replace(alone, why=f"the batch scheduler refused this model: {exc}")
    return Choice(backend, "BatchScheduler", backend.max_batch, backend.capacity)


def describe(choice: Choice) -> str:
    """The banner's words for the backend."""
    capacity = ("grows as it goes" if choice.capacity is None
                else f"{choice.capacity} positions")
    if choice.name == "SpeculativeGenerator":
        return (f"backend SpeculativeGenerator (one request at a time: {choice.why}), "
                f"batch 1, cache {capacity}")
    chunk = getattr(choice.backend, "prefill_chunk", None)
    chunks = f", prompts join in chunks of {chunk} tokens" if chunk else ""
    engine = choice.backend.engine
    steps = ("steps compiled in the background (eager until then)" if engine.compiles
             else f"eager steps: {engine.why_eager}")
    return (f"backend {choice.name}, batch {choice.max_batch}, cache {capacity}{chunks}, "
            f"{steps}")

"""Continuous batching for the local engine: many requests decoded in one forward per step.

:class:`BatchScheduler` takes requests as :class:`~ngram_trie_rag.generator.SpeculativeGenerator`
does (same arguments, checks and errors, the same :class:`GenerationStream`), but ONE
scheduler thread runs them all over a :class:`~ngram_trie_rag.engine.batched.BatchedEngine`:

    loop:
        drop rows whose stream was closed (their cache rows go back)
        admit one waiting request: prefill it alone, a chunk per turn while others
        decode (all at once when none do), into a free row (joins the batch)
        step every runnable row together: per row its own draft (grammar closing,
        forced tokens, the trie; trees cut to what pays in the batch), ONE forward for all rows,
        per row its own acceptance, cut, stats, constraint; compaction for all rows
        rows that finished leave (the last row moves into the freed one)

A long prompt joining never holds the rows already decoding for its whole prefill: it is
cached ``prefill_chunk`` tokens per turn of the loop, each chunk followed by one step of
the others (:mod:`~ngram_trie_rag.engine.batched.prefill_chunks`).

A row is runnable while its stream holds fewer than ``buffer_steps`` undelivered steps:
a reader that stops reading pauses its own row only. Requests wait in a queue of at most
``max_queue``; a request beyond that is refused at once (:class:`QueueFull`). The thread
holds the model's lock (``generator.engine.lock``) around each prefill and each batched
forward only, so other users of the same model interleave with it, and a stream never
holds the lock while its reader is away.

Draft budget under batching: where a step of n rows goes unpadded (an fp32 model on a
CPU, :attr:`~ngram_trie_rag.engine.batched.BatchedEngine.unpadded`), each row keeps the
nodes of its tree that pay in this batch, by the steps' fitted cost and each node's
acceptance chance (:mod:`~ngram_trie_rag.drafting.batch_trees`). Where steps are padded
to their largest tree (compiled, a GPU), one cap for all rows
(:mod:`~ngram_trie_rag.engine.batched.cap_chooser`): first as the latency curve prices it
(:mod:`~ngram_trie_rag.engine.batched.draft_cap`), then at the cap whose steps emitted
the most tokens per second at that batch size, as measured.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..decoding.options import GenerationOptions
from ..decoding.result import GenerationResult
from ..decoding.stream import GenerationStream, Step
from ..decoding.text_stream import TextStream
from ..drafting.batch_trees import TreeShares
from ..engine.batched import BatchedEngine, CapChooser
from ..engine.batched.prefill_chunks import PendingPrefill
from ..engine.cpu import openmp_team
from ..generator import SpeculativeGenerator, _Start
from ..inputs import DraftDocument, Prompt
from .defaults import MAX_BATCH, MAX_QUEUE, PREFILL_CHUNK

__all__ = ["BatchScheduler", "QueueFull", "SchedulerClosed"]


class QueueFull(RuntimeError):
    """More requests wait than the scheduler's ``max_queue`` allows."""


class SchedulerClosed(RuntimeError):
    """The scheduler was closed before the request finished."""


@dataclass(eq=False)
class _Ticket:
    """One request between its stream (the reader) and the scheduler thread.

    The thread appends steps, the reader pops them; ``error`` ends the stream with an
    exception; ``cancelled``: the reader closed the stream (the row is freed);
    ``done``: the final step (or the error) has been handed over."""

    start: _Start
    prefill: PendingPrefill | None = None  # its prompt, cached so far (while admitted)
    steps: deque[Step] = field(default_factory=deque)
    error: BaseException | None = None
    cancelled: bool = False
    done: bool = False


class _Reader:
    """A stream's steps as the scheduler thread hands them over (the stream's ``steps``
    iterator). Closing it (the stream's ``close``, also when the stream is dropped),
    before or after any step was read, cancels the request and frees its row."""

    def __init__(self, scheduler: BatchScheduler, ticket: _Ticket) -> None:
        self._scheduler = scheduler
        self._ticket = ticket
        self._finished = False  # the final step was read

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> Step:
        if self._finished:
            raise StopIteration
        ticket, cond = self._ticket, self._scheduler._cond
        with cond:
            while not ticket.steps and ticket.error is None:
                cond.wait()
            if ticket.error is not None:
                raise ticket.error
            step = ticket.steps.popleft()
            if len(ticket.steps) + 1 >= self._scheduler.buffer_steps:
                cond.notify_all()  # its row was paused: it may run again
        self._finished = step[1] is not None
        return step

    def close(self) -> None:
        """Cancel the request unless it has finished. Idempotent."""
        with self._scheduler._cond:
            if not self._ticket.done:
                self._ticket.cancelled = True
                self._scheduler._cond.notify_all()


class BatchScheduler:
    """Serves ``generator``'s requests concurrently, in one batch of at most ``max_batch``.

    ``capacity``: cache positions per request (prompt + ``max_new_tokens``); None: the
    model's context window, at most 2,048. The cache for ``max_batch`` rows of that size
    is allocated here. ``buffer_steps``: steps a request runs ahead of its reader before
    it is paused. ``prefill_chunk``: prompt tokens a joining request caches per turn
    while other rows decode (None: its whole prompt at once). ``compiled``: whether the
    batched steps compile, in the background from the start (None: where
    ``engine="auto"`` would, on CUDA; see :class:`~ngram_trie_rag.engine.batched.BatchedEngine`);
    :meth:`warm_up` waits for them. Call :meth:`close` (or use ``with``) to stop the thread.
    Llama-style models only (see :mod:`~ngram_trie_rag.engine.batched`).
    """

    def __init__(self, generator: SpeculativeGenerator, *, max_batch: int = MAX_BATCH,
                 max_queue: int = MAX_QUEUE, capacity: int | None = None,
                 buffer_steps: int = 64, prefill_chunk: int | None = PREFILL_CHUNK,
                 compiled: bool | None = None) -> None:
        counts = {"max_batch": max_batch, "max_queue": max_queue, "buffer_steps": buffer_steps}
        if prefill_chunk is not None:  # None: whole prompts
            counts["prefill_chunk"] = prefill_chunk
        for name, value in counts.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.generator = generator
        self.engine = BatchedEngine(generator.model, max_batch=max_batch, capacity=capacity,
                                    base=generator.engine, lock=generator.engine.lock,
                                    compiled=compiled)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.capacity = self.engine.capacity
        self.buffer_steps = buffer_steps
        self.prefill_chunk = prefill_chunk
        self.steps_run = 0  # batched steps so far (a prefill chunk runs between two)
        # each row's share of an unpadded step, and a padded step's cap, as steps measure
        self.shares = TreeShares()
        self.caps = CapChooser(self.engine.buckets)
        self._cond = threading.Condition()  # guards everything below and the tickets
        self._waiting: deque[_Ticket] = deque()
        self._running: list[_Ticket] = []  # in the engine's rows (order: arrival)
        self._admitting: _Ticket | None = None  # being prefilled (over turns), in neither list
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="ngram-trie-rag-batch",
                                        daemon=True)
        self._thread.start()
        openmp_team.release()  # the starting thread's: every forward now runs on _thread

    # ---- the public API ----------------------------------------------------------------
    def warm_up(self, timeout: float | None = None) -> float:
        """Wait until the batched steps run compiled (a server at start-up, a benchmark
        before it times); seconds spent, 0.0 where they do not compile. RuntimeError
        when they could not be compiled in time."""
        return self.engine.warm_up(timeout)

    def stream(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
               options: GenerationOptions | None = None, **changes: Any) -> GenerationStream:
        """As :meth:`SpeculativeGenerator.stream`, run by the scheduler's thread. Raises
        :class:`QueueFull` when ``max_queue`` requests already wait, ValueError when the
        prompt plus ``max_new_tokens`` does not fit a row of the cache."""
        with self._cond:
            self._check_room()  # before the work of encoding
        start = self.generator._start(prompt, documents, options, changes, engine=self.engine)
        ticket = _Ticket(start)
        with self._cond:
            self._check_room()
            self._waiting.append(ticket)
            self._cond.notify_all()
        return GenerationStream(threading.Lock(), self.generator.tokenizer, len(start.ids),
                                _Reader(self, ticket), TextStream(self.generator.tokenizer,
                                                               start.stop),
                                on_result=start.keep)

    def generate(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
                 options: GenerationOptions | None = None, **changes: Any) -> GenerationResult:
        """A full answer; arguments as for :meth:`stream`."""
        return self.stream(prompt, documents, options, **changes).read_all()

    async def agenerate(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
                        options: GenerationOptions | None = None,
                        **changes: Any) -> GenerationResult:
        """:meth:`generate` on a worker thread."""
        return await asyncio.to_thread(self.generate, prompt, documents, options, **changes)

    async def astream(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
                      options: GenerationOptions | None = None,
                      **changes: Any) -> AsyncIterator[str]:
        """Text deltas as :meth:`stream` gives them, each awaited on a worker thread;
        leaving the loop early cancels the request."""
        stream = self.stream(prompt, documents, options, **changes)
        try:
            while True:
                delta = await asyncio.to_thread(next, stream, None)
                if delta is None:
                    return
                yield delta
        finally:
            stream.close()

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the thread; requests still waiting or running end with an error
        (:class:`SchedulerClosed`). Idempotent."""
        with self._cond:
            if not self._closed:
                self._closed = True
                for ticket in self._pending():
                    self._fail(ticket, SchedulerClosed("the batch scheduler was closed "
                                                       "before this request finished"))
                self._waiting.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in the batch."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests in the batch (paused ones included)."""
        return len(self._running)

    # ---- the reader's side --------------------------------------------------------------
    def _check_room(self) -> None:
        """Raise unless a request may join the queue now (under the condition)."""
        self._drop_cancelled()
        if self._closed:
            raise SchedulerClosed("the batch scheduler is closed")
        if len(self._waiting) >= self.max_queue:
            raise QueueFull(f"{len(self._waiting)} requests are waiting, the most this "
                            f"scheduler queues (max_queue={self.max_queue}); retry later, or "
                            "build BatchScheduler with a larger max_queue (or max_batch)")

    # ---- the scheduler thread -----------------------------------------------------------
    def _drop_cancelled(self) -> None:
        """Forget waiting requests whose streams were closed (under the condition)."""
        if any(t.cancelled for t in self._waiting):
            self._waiting = deque(t for t in self._waiting if not t.cancelled)

    def _pending(self) -> list[_Ticket]:
        """Every request not yet handed its end (under the condition)."""
        admitting = [self._admitting] if self._admitting is not None else []
        return [*self._waiting, *admitting, *self._running]

    def _fail(self, ticket: _Ticket, error: BaseException) -> None:
        """End ``ticket`` with ``error`` (under the condition)."""
        if not ticket.done:
            ticket.error = error
            ticket.done = True
            self._cond.notify_all()

    def _runnable(self, ticket: _Ticket) -> bool:
        return not ticket.done and len(ticket.steps) < self.buffer_steps

    def _has_work(self) -> bool:
        if self._admitting is not None:
            return True
        if self._waiting and len(self._running) < self.max_batch:
            return True
        return any(t.cancelled or t.done or self._runnable(t) for t in self._running)

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._closed and not self._has_work():
                        openmp_team.release()  # idle: forwards may run on other threads
                    while not self._closed and not self._has_work():
                        self._cond.wait()
                    if self._closed:
                        return
                    leaving = [t for t in self._running if t.cancelled or t.done]
                    self._running = [t for t in self._running if t not in leaving]
                    self._drop_cancelled()
                    if (self._admitting is None and self._waiting
                            and len(self._running) < self.max_batch):
                        self._admitting = self._waiting.popleft()
                    admitting = self._admitting
                    runnable = [t for t in self._running if self._runnable(t)]
                for ticket in leaving:
                    self.engine.release(ticket.start.request.kv)
                if admitting is not None:  # a chunk while others decode, else all of it
                    self._admit(admitting, self.prefill_chunk if runnable else None)
                if runnable:
                    self._step(runnable)
        except BaseException as error:  # noqa: BLE001 - every waiting reader must hear of it
            with self._cond:
                self._closed = True
                for ticket in self._pending():
                    self._fail(ticket, RuntimeError(f"the batch scheduler stopped: {error!r}"))
            raise

    @torch.inference_mode()
    def _admit(self, ticket: _Ticket, chunk: int | None) -> None:
        """Cache the next ``chunk`` tokens of the joining request's prompt (None: the rest),
        alone; once it is all cached the request takes a free row and joins the next
        step. A request cancelled meanwhile is dropped."""
        start = ticket.start
        if ticket.cancelled:
            with self._cond:
                self._admitting = ticket.prefill = None
            return
        try:
            with self.engine.lock:
                if ticket.prefill is None:
                    ticket.prefill = self.engine.begin_prefill(start.ids, start.request.limit)
                if not ticket.prefill.advance(chunk):
                    return  # more chunks at the next turns
                kv, logits = ticket.prefill.finish()
                step = self.generator._prefilled(start.request, kv, logits,
                                                 ticket.prefill.started)
        except Exception as error:  # noqa: BLE001 - it fails this request only
            with self._cond:
                self._admitting = ticket.prefill = None
                self._fail(ticket, error)
            if start.request.kv is not None:
                self.engine.release(start.request.kv)
            return
        with self._cond:  # (closed meanwhile: close() failed it, the row leaves unused)
            self._admitting = ticket.prefill = None
            self._running.append(ticket)
            self._deliver(ticket, step)

    @torch.inference_mode()
    def _step(self, tickets: list[_Ticket]) -> None:
        """One batched step of ``tickets``' rows."""
        reqs = [t.start.request for t in tickets]
        most = max(r.drafter.num_draft for r in reqs)
        # an unpadded step costs its rows' own nodes: each row keeps the nodes that pay;
        # a padded one costs its largest tree: one cap for all, as measured
        shares = self.shares if self.engine.unpadded else None
        if shares is not None:
            cap = min(most, max(self.engine.buckets))
        else:
            cap = self.caps.choose(len(reqs), most, self.engine.curve.predict)
        start = time.perf_counter()
        try:
            steps = self.generator._batch_step(reqs, self.engine, cap, self.engine.lock,
                                               shares)
        except Exception as error:  # noqa: BLE001 - it fails this step's requests
            with self._cond:
                for ticket in tickets:
                    self._fail(ticket, error)
            return
        self.steps_run += 1
        self.caps.observe(len(reqs), cap, sum(len(tokens) for tokens, _, _ in steps),
                          time.perf_counter() - start)
        with self._cond:
            for ticket, step in zip(tickets, steps, strict=True):
                self._deliver(ticket, step)

    def _deliver(self, ticket: _Ticket, step: Step) -> None:
        """Hand ``step`` to the reader (under the condition); a final step marks the
        request done (its row leaves at the next turn of the loop)."""
        if ticket.done:
            return
        ticket.steps.append(step)
        if step[1] is not None:
            ticket.done = True
        self._cond.notify_all()

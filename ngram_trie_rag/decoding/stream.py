"""A generation as an iterator of text deltas, holding the model's lock while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from .result import FinishReason, GenerationResult, GenerationStats
from .text_stream import TextStream

Step = tuple[list[int], FinishReason | None, GenerationStats]


class GenerationStream:
    """Iterator of text deltas; holds the model's lock from the first ``next`` on.

    ``result`` is set once the stream is exhausted. ``close()`` (or leaving a ``with``
    block) stops generation early and releases the lock and the KV cache.
    ``on_result`` is called once with the result of a stream that finished (not one
    closed early), e.g. to keep the answer for later requests.
    """

    def __init__(self, lock: threading.Lock, tokenizer: Any, prompt_tokens: int,
                 steps: Iterator[Step], text: TextStream,
                 on_result: Callable[[GenerationResult], None] | None = None) -> None:
        self._lock = lock
        self._tokenizer = tokenizer
        self._prompt_tokens = prompt_tokens
        self._steps = steps
        self._text = text
        self._tokens: list[int] = []
        self._locked = False
        self._done = False
        self._on_result = on_result
        self.result: GenerationResult | None = None

    def __iter__(self) -> GenerationStream:
        return self

    def __del__(self) -> None:
        # An abandoned stream must not keep the model locked until interpreter exit.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_all(self) -> GenerationResult:
        """Read the stream to its end: its result (a whole answer)."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        if not self._locked:
            self._lock.acquire()
            self._locked = True
        try:
            return self._advance()
        except BaseException:
            self.close()
            raise

    def _advance(self) -> str:
        while True:
            tokens, finish, stats = next(self._steps)
            before = len(self._tokens)
            self._tokens.extend(tokens)
            delta = self._text.push(self._tokens)
            if self._text.stopped:
                self._tokens = self._trim_to_stop(before)
                finish = "stop"
            if finish is not None:
                delta += self._text.finish()
                self.result = GenerationResult(self._text.text, self._tokens, finish,
                                               self._prompt_tokens, stats)
                self.close()
                if self._on_result is not None:
                    self._on_result(self.result)
                return delta
            if delta:
                return delta

    def _trim_to_stop(self, before: int) -> list[int]:
        """Token ids up to the one that completed the stop string."""
        for end in range(before + 1, len(self._tokens) + 1):
            text = self._tokenizer.decode(self._tokens[:end], skip_special_tokens=True)
            if any(s in text for s in self._text.stops):
                return self._tokens[:end]
        return self._tokens

    def close(self) -> None:
        """Stop early; frees the KV cache and releases the lock. Idempotent."""
        if self._done:
            return
        self._done = True
        self._steps.close()
        if self._locked:
            self._locked = False
            self._lock.release()

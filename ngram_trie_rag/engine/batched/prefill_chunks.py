"""A prompt cached a chunk at a time, so a long prompt joining the batch does not hold
the rows already decoding for the whole of its prefill.

A scheduler alternates: one chunk of the joining prompt, one batched step of the others.
Each chunk is the model's own forward over the next ``chunk`` prompt tokens after those
cached so far (a ``DynamicCache``, positions continuing), which is what ``generate`` would
compute for those positions; in fp32 the keys and values round as in the last bits of a
differently sized product (as a tree's verification rows do), and where the products are
row-independent (the quantized kernels, a quantized model's attention) they are the same
(bitwise with the row-wise attention kernel).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .engine import BatchedEngine, SlotKV


class PendingPrefill:
    """One prompt being cached: :meth:`advance` runs the next chunk, :meth:`finish`
    copies the cached prompt into a free row of the engine (see
    :meth:`BatchedEngine.begin_prefill`). ``started``: when its first chunk began
    (``perf_counter``), what its time to first token counts from."""

    def __init__(self, engine: BatchedEngine, ids: list[int]) -> None:
        from transformers import DynamicCache

        self.engine = engine
        self.ids = ids
        self.done = 0  # prompt tokens cached so far
        self.started: float | None = None
        self._cache = DynamicCache(config=engine.model.config)
        self._logits: torch.Tensor | None = None  # (V,) after the last cached token

    @property
    def complete(self) -> bool:
        return self.done == len(self.ids)

    @torch.inference_mode()
    def advance(self, chunk: int | None = None) -> bool:
        """Cache the next ``chunk`` prompt tokens (None: all that remain); True once the
        whole prompt is cached."""
        if self.started is None:
            self.started = time.perf_counter()
        end = len(self.ids) if chunk is None else min(len(self.ids), self.done + chunk)
        if end > self.done:
            model = self.engine.model
            piece = torch.tensor([self.ids[self.done:end]], device=model.device)
            out = model(input_ids=piece, **{self.engine.cache_keyword: self._cache},
                        use_cache=True, logits_to_keep=1)
            self._logits = out.logits[0, -1]
            self.done = end
        return self.complete

    @torch.inference_mode()
    def finish(self) -> tuple[SlotKV, torch.Tensor]:
        """The cached prompt in a free row: its :class:`SlotKV` and the logits (V,) after
        the prompt's last token."""
        if not self.complete:
            raise RuntimeError(f"the prompt is cached up to token {self.done} of "
                               f"{len(self.ids)}; advance it to the end first")
        kv = self.engine.take_row(self.ids, [layer.keys for layer in self._cache.layers],
                                  [layer.values for layer in self._cache.layers])
        self._cache = None  # the row holds it now
        return kv, self._logits

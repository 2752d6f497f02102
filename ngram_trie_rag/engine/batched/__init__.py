"""Continuous batching: many requests' verification steps in one forward.

:class:`~.engine.BatchedEngine` (one cache row per request, one forward per step for
all rows), :func:`~.draft_cap.draft_cap` (how large each row's tree may be as the
batch grows, on the latency curve) and :class:`~.cap_chooser.CapChooser` (the cap the
steps' measured throughput favours).
:class:`~ngram_trie_rag.serving.scheduler.BatchScheduler` drives them."""

from __future__ import annotations

from .cap_chooser import CapChooser
from .draft_cap import draft_cap
from .engine import BatchedEngine, RowStep, SlotKV

__all__ = ["BatchedEngine", "CapChooser", "RowStep", "SlotKV", "draft_cap"]

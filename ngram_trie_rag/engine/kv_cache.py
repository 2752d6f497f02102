"""The generator's KV cache: preallocated buffers, and compaction after a tree step.

Transformers' ``DynamicCache`` grows by concatenation, so every forward copies the
whole cache of every layer (for the default model after 1,000 tokens: 46 MB per step,
a quarter of a one-token forward on a CPU). Here each layer writes into a buffer that
doubles when full, and exposes the live prefix as a view: a step writes only its own
rows (the gpt-fast layout, without fixing the length up front).

A verification pass appends the keys/values of all Q = 1 + N tree tokens. Only the
committed token (query 0) and the accepted path survive: we move those rows to the
front of the new block and shorten the view, so the cache again holds exactly the
committed sequence. Cost: one gather of ``len(keep)`` rows per layer.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_SLACK = 256  # free positions allocated past the prompt, before the first doubling


class BufferLayer(DynamicLayer):
    """A full-attention layer cache over a buffer (B, H, capacity, D).

    Invariant: ``keys``/``values`` are views of the buffers' first ``length`` positions;
    whatever shortens those views (compaction, cropping) frees the positions after them.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buf = key_states.new_empty(0)
        self._value_buf = value_states.new_empty(0)
        self.keys, self.values = self._key_buf, self._value_buf
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if self._key_buf.dim() != 4 or end > self._key_buf.shape[-2]:
            self._grow(key_states, value_states, start, end)
        self._key_buf[:, :, start:end] = key_states
        self._value_buf[:, :, start:end] = value_states
        self.keys = self._key_buf[:, :, :end]
        self.values = self._value_buf[:, :, :end]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, start: int,
              end: int) -> None:
        capacity = max(2 * end, end + MIN_SLACK)
        b, h, _, d = key_states.shape
        keys = key_states.new_empty(b, h, capacity, d)
        values = value_states.new_empty(b, h, capacity, value_states.shape[-1])
        if start:
            keys[:, :, :start] = self.keys[:, :, :start]
            values[:, :, :start] = self.values[:, :, :start]
        self._key_buf, self._value_buf = keys, values


class Fp64BufferLayer(BufferLayer):
    """A :class:`BufferLayer` holding fp64 keys and values, for a model whose attention
    runs in fp64 (a quantized one, :mod:`~ngram_trie_rag.engine.quant.attention`): the
    cache is widened once per written row instead of once per step and layer. fp32 ->
    fp64 is exact, so attention reads the same values."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states.double(), value_states.double())


def new_cache(fp64: bool = False) -> DynamicCache:
    """A cache of :class:`BufferLayer` full layers (:class:`Fp64BufferLayer` with ``fp64``).

    Models with sliding-window or chunked layers still get full layers here, where
    ``generate`` uses ``DynamicSlidingWindowLayer`` (the last ``window - 1`` keys): the
    window is applied by position in the attention mask instead (see
    :mod:`~ngram_trie_rag.engine.models.attention_windows`), which gives the same attention
    and keeps compaction uniform.
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = Fp64BufferLayer if fp64 else BufferLayer
    return cache


def compact(cache: DynamicCache, block_start: int, keep: list[int]) -> None:
    """Keep block rows ``keep`` (ascending, relative to ``block_start``), drop the rest.

    Invariant: after the call every layer holds ``block_start + len(keep)`` positions.
    The committed prefix is never copied: rows move inside the new block only.
    """
    m = len(keep)
    contiguous = keep == list(range(m))
    index: dict[torch.device, torch.Tensor] = {}  # one per device (layers split by device_map)
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if not contiguous:
            rows = index.get(keys.device)
            if rows is None:
                rows = index[keys.device] = torch.tensor(keep, device=keys.device) + block_start
            # Gather first (a copy), then write: source and target rows may overlap.
            keys[:, :, block_start : block_start + m] = keys[:, :, rows]
            values[:, :, block_start : block_start + m] = values[:, :, rows]
        layer.keys = keys[:, :, : block_start + m]
        layer.values = values[:, :, : block_start + m]


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (views: the buffers stay)."""
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


def cache_kwargs(model: torch.nn.Module, kv: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword a model's forward takes its KV cache under: ``cache`` from
    Transformers 5.24 on (where ``past_key_values`` still works but is deprecated, to
    be removed), ``past_key_values`` before."""
    return {_cache_keyword(type(model)): kv}


@cache
def _cache_keyword(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"

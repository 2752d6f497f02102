"""How far back each layer of a model attends, read from its config as ``generate`` reads it.

Transformers configs spell local attention three ways: one ``sliding_window`` for every
layer (Mistral, Phi-3, Starcoder2), ``layer_types`` naming each layer's kind (Gemma 2
and 3, Qwen2 and Qwen3 derive theirs from ``use_sliding_window`` and
``max_window_layers``, Cohere2, GPT-OSS), and ``attention_chunk_size`` (Llama 4's chunked
layers). ``generate`` builds its cache from the same reading
(``transformers.cache_utils.get_layer_types_and_kwargs``): a sliding layer keeps only
the last ``window - 1`` keys, and its mask lets the query at position ``p`` see key
positions ``k`` with ``p - window < k <= p``; a chunked layer lets ``p`` see ``k`` in its
own chunk, ``k // chunk == p // chunk``.

The generator's cache keeps every key of every layer and applies these rules by
position in its tree mask instead (see :mod:`~ngram_trie_rag.engine.trees.tree_attention`):
a draft node at depth ``d`` sits at position ``past + d``, so its window starts at its
own place, not at the block's. Masking by position gives the attention ``generate``
computes over its shorter cache, and keeps compaction the same for every layer.

How a model takes the mask follows from its forward: models without ``layer_types``
apply the one mask they are given to every layer; models with ``layer_types`` accept a
dict keyed by layer type and, given a single mask, apply it to every layer as well. So
one mask goes in where every layer attends alike, a dict where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["full", "sliding", "chunked"]
ATTENTION_TYPES = {"full_attention": "full", "sliding_attention": "sliding",
                   "chunked_attention": "chunked"}
WINDOWED = ("sliding_attention", "chunked_attention")  # layer types with a window size
# Layer types that fold every token into one state: Mamba's layers in Transformers 5.x
# (which no longer marks the model ``_is_stateful``), Qwen3-Next's gated delta-net.
RECURRENT_TYPES = ("linear_attention",)


@dataclass(frozen=True)
class Window:
    """One layer type's reach: ``kind`` and its ``size`` (None for full attention)."""

    kind: Kind = "full"
    size: int | None = None

    def visible(self, query_pos: np.ndarray, key_pos: np.ndarray) -> np.ndarray:
        """(Q, S) bool: which key positions each query position may see by distance
        alone (causality and the tree's ancestry are applied separately)."""
        q, k = query_pos[:, None], key_pos[None, :]
        if self.kind == "sliding":
            return q - k < self.size  # the last `size` positions, itself included
        if self.kind == "chunked":
            return q // self.size == k // self.size
        return np.ones((query_pos.size, key_pos.size), dtype=bool)


FULL = Window()


@dataclass(frozen=True)
class AttentionWindows:
    """The window of every attention layer type of a model, in layer order of first use.

    ``by_type``: ``((layer type, Window), ...)``, e.g. Gemma 3's
    ``(("sliding_attention", Window("sliding", 512)), ("full_attention", FULL))``.
    """

    by_type: tuple[tuple[str, Window], ...] = (("full_attention", FULL),)

    @property
    def uniform(self) -> bool:
        """True when every layer attends alike: one mask serves them all."""
        return len({w for _, w in self.by_type}) == 1

    @property
    def sliding_window(self) -> int | None:
        """The smallest sliding window of any layer, or None (for reports)."""
        sizes = [w.size for _, w in self.by_type if w.kind == "sliding"]
        return min(sizes) if sizes else None


def attention_windows(config) -> AttentionWindows:
    """The windows ``generate`` applies for ``config``.

    Raises ValueError for a layer type that is not attention over a KV cache (a
    recurrent or convolutional layer): see :mod:`~ngram_trie_rag.engine.models.support`.
    """
    types, sizes = _layer_types(config.get_text_config(decoder=True))
    by_type: dict[str, Window] = {}
    for layer_type, size in zip(types, sizes, strict=True):
        if layer_type == "dummy":  # a layer without attention (an MLP-only block)
            continue
        kind = ATTENTION_TYPES.get(layer_type)
        if kind is None:
            why = (" (it keeps a recurrent state that cannot be rolled back)"
                   if layer_type in RECURRENT_TYPES else "")
            raise ValueError(f"layer type {layer_type!r} is not attention over a KV "
                             f"cache{why}")
        window = FULL if kind == "full" else Window(kind, int(size))
        if by_type.setdefault(layer_type, window) != window:
            raise ValueError(f"layers of type {layer_type!r} have different windows")
    return AttentionWindows(tuple(by_type.items()) or AttentionWindows().by_type)


def _layer_types(config) -> tuple[list[str], list[int | None]]:
    """Per layer: its type and window size, as ``generate``'s cache reads them."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # before per-layer configs: the same rules, read directly
        return _layer_types_directly(config)
    types, kwargs = get_layer_types_and_kwargs(config)
    return list(types), window_sizes(list(types), kwargs)


def window_sizes(types: list[str], kwargs: list[dict] | dict) -> list[int | None]:
    """Per layer, its window from ``get_layer_types_and_kwargs``'s second value: one
    dict per layer (Transformers 5.2x on), or before that one dict whose
    ``sliding_window`` holds for every windowed layer."""
    if isinstance(kwargs, dict):
        return [kwargs.get("sliding_window") if t in WINDOWED else None for t in types]
    return [kw.get("sliding_window") for kw in kwargs]


def _layer_types_directly(config) -> tuple[list[str], list[int | None]]:
    n = int(config.num_hidden_layers)
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if types is None:
        kind = ("sliding_attention" if window is not None else
                "chunked_attention" if chunk is not None else "full_attention")
        types = [kind] * n
    sizes = [window if t == "sliding_attention" else chunk if t == "chunked_attention"
             else None for t in types]
    return list(types), sizes

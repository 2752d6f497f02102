"""Masked grouped-query attention on a CPU without repeating the KV cache.

Transformers' SDPA path hands grouped-query attention (GQA: fewer key/value heads than
query heads) to the kernel only when no mask is passed; with a mask it first copies
every key and value head ``heads / kv_heads`` times (``repeat_kv``), because CUDA
kernels fall back to the slow math kernel on GQA + mask. PyTorch's own ``enable_gqa``
does not help on a CPU either: with a mask it too takes the math kernel, which repeats
the heads. A tree verification always passes a mask, so every verification forward
would copy the whole cache of every layer.

Instead the query heads that share a key/value head are packed into the query length
(:func:`sdpa_masked_gqa`): one plain masked attention over the cache as stored, which
the fused CPU kernel runs directly. Its logits are bitwise identical to the
repeated-KV path (checked in ``tests/test_gqa_attention.py``).

A single unmasked query (a plain decode step) can be packed the same way. There the
stock path passes ``enable_gqa``, which in bf16 on this CPU costs 0.73 ms per layer
after 1,000 cached tokens against 0.14 ms packed (a 64 ms forward becomes about
47 ms), while in fp32 it is the faster of the two. So single-query packing
(:func:`sdpa_packed_gqa`) is a measured choice: the latency curve times a plain step
both ways and the generator packs only where that measured faster.

Only the generator's own forwards switch. :func:`install` (called when a generator is
built over a model whose modules it runs) registers one attention function and points
the model at it once; that function is Transformers' SDPA unchanged unless the forward
runs inside :func:`masked_gqa` in the same thread or task (a ContextVar), or passes
``gqa_packing="masked"`` down to the attention as a keyword (:data:`PACKING_KEYWORD`,
what a compiled step does: a keyword is traced where a ContextVar is not), so anything
else running the same model -- Hugging Face ``generate``, prompt lookup, another
thread -- runs exactly as shipped, and no forward mutates the model.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ngram_trie_rag_sdpa"  # SDPA, packed where masked_gqa is active
PACKING_KEYWORD = "gqa_packing"  # a forward's keyword: "masked" packs masked GQA
_PACKING: ContextVar[str | None] = ContextVar("ngram_trie_rag_gqa", default=None)
_INSTALL = threading.Lock()
_INSTALLED: weakref.WeakSet = weakref.WeakSet()  # models install() has set up


def sdpa_masked_gqa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """Transformers' SDPA attention, except masked GQA on a CPU runs without repeat_kv.

    query (B, H, Q, D); key, value (B, H_kv, S, D); attention_mask additive
    (B, 1, Q, S). Returns (B, Q, H, D) like every Transformers attention function.

    The G = H / H_kv query heads that share a key/value head are packed into the query
    length: (B, H, Q, D) -> (B, H_kv, G * Q, D), row g * Q + q, with the mask tiled G
    times to match. That is one plain multi-head attention over the cache as stored,
    which the fused CPU kernel runs as is (with ``enable_gqa`` and a mask it falls
    back to a kernel that copies every key/value head G times).
    """
    return _packed(module, query, key, value, attention_mask, dropout, scaling, False,
                   **kwargs)


def sdpa_packed_gqa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """:func:`sdpa_masked_gqa`, and a single unmasked query packed as well:
    (B, H, 1, D) -> (B, H_kv, G, D), G rows at the same position attending to every
    cached key (there is no causality to keep within one position)."""
    return _packed(module, query, key, value, attention_mask, dropout, scaling, True,
                   **kwargs)


def _packed(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
            value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float,
            scaling: float | None, single: bool, **kwargs) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    plain = not any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "cache"))
    b, heads, q_len, dim = query.shape
    masked = attention_mask is not None and attention_mask.shape[1] == 1
    lone = single and attention_mask is None and q_len == 1
    if (groups > 1 and query.device.type == "cpu" and dropout == 0.0 and plain
            and dim == value.shape[-1] and (masked or lone)):
        packed = query.reshape(b, heads // groups, groups * q_len, dim)
        mask = None
        if masked:  # a compiled graph tiles it once itself (and must not read a global)
            mask = (attention_mask.repeat(1, 1, groups, 1) if torch.compiler.is_compiling()
                    else tiled_mask(attention_mask, groups))
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value,
                                                               attn_mask=mask, scale=scaling)
        return out.view(b, heads, q_len, dim).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask,
                                  dropout=dropout, scaling=scaling, **kwargs)


_TILED: list[tuple[torch.Tensor, int, torch.Tensor]] = []  # the last mask tiled


def tiled_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, 1, Q, S) -> (B, 1, G * Q, S), row g * Q + q = mask row q. Every layer of one
    forward gets the same mask object, so the last tiling is kept and reused."""
    last = _TILED[0] if _TILED else None  # one read: other threads may replace it
    if last is not None and last[0] is mask and last[1] == groups:
        return last[2]
    tiled = mask.repeat(1, 1, groups, 1)
    _TILED[:] = [(mask, groups, tiled)]
    return tiled


def _gated(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
           value: torch.Tensor, attention_mask: torch.Tensor | None,
           **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention :func:`install` registers: stock SDPA, packed inside
    :func:`masked_gqa` ("masked": masked GQA; "single": single queries too)."""
    mode = kwargs.pop(PACKING_KEYWORD, None) or _PACKING.get()
    if mode is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    fn = sdpa_packed_gqa if mode == "single" else sdpa_masked_gqa
    return fn(module, query, key, value, attention_mask, **kwargs)


def applies(model: torch.nn.Module) -> bool:
    """True for a model on a CPU using SDPA with fewer KV heads than query heads."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return model.device.type == "cpu" and heads is not None and kv_heads < heads


def install(model: torch.nn.Module) -> None:
    """Point an :func:`applies` model's attention at the gated SDPA function. Idempotent;
    its masks are built as for SDPA and, outside :func:`masked_gqa`, every attention
    call is Transformers' SDPA function itself."""
    with _INSTALL:
        AttentionInterface.register(NAME, _gated)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        model.config._attn_implementation = NAME
        _INSTALLED.add(model)


def installed(model: torch.nn.Module) -> bool:
    return model in _INSTALLED


@contextmanager
def masked_gqa(enabled: bool, single: bool = False) -> Iterator[None]:
    """Forwards inside, in this thread or task, run :func:`sdpa_masked_gqa` when
    ``enabled`` (:func:`sdpa_packed_gqa` when ``single`` too) on installed models."""
    if not enabled:
        yield
        return
    token = _PACKING.set("single" if single else "masked")
    try:
        yield
    finally:
        _PACKING.reset(token)

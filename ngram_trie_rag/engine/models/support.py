"""Which models the engine can verify drafts for, decided when a generator is built.

Verification appends every draft node's keys and values to the cache in one forward,
then keeps the accepted path and drops the rest (:mod:`~ngram_trie_rag.engine.kv_cache`).
That needs a cache with one entry per position, which attention layers have and these
do not:

- state-space and recurrent layers (Mamba, Mamba-2, RWKV, xLSTM, RecurrentGemma, and
  hybrids that mix them with attention: Jamba, Zamba, Bamba, Falcon-H1, Nemotron-H,
  Qwen3-Next, ...) fold every token into one state that cannot be cut back to a
  prefix. Transformers marks these models ``_is_stateful`` and refuses its own
  assisted generation for them for the same reason; convolutional and linear-attention
  layer types are caught by their ``layer_types``.
- encoder-decoder models (T5, BART, Whisper, ...) decode against an encoder output the
  engine does not compute.

Verification also needs attention that takes the tree's 4-D additive mask (each node
sees the prefix and its own ancestors only). Transformers' ``eager`` and ``sdpa`` do;
``flash_attention_2``/``_3`` read a mask as 2-D padding, and ``flex_attention`` wants a
``BlockMask``: with them a tree step would attend across branches. Such a model is
refused with the fix (load it with ``attn_implementation="sdpa"``).

Such a model is refused with a ValueError naming its family, before any forward runs:
an answer that is not ``generate``'s is worse than none.
"""

from __future__ import annotations

import torch

from ..cpu import gqa_attention
from ..quant import attention as quant_attention
from .attention_windows import attention_windows
from .rope_limits import rope_limit

# Attention implementations that apply a 4-D additive mask as given (None: the default;
# the engine's own measured SDPA variant, installed on models it runs, is SDPA).
TREE_MASK_ATTENTION = (None, "eager", "sdpa", gqa_attention.NAME, quant_attention.NAME)


def check_supported(model: torch.nn.Module) -> None:
    """Raise ValueError unless every decoder layer is attention over a KV cache."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no Transformers config")
    family = f"{type(model).__name__} (model_type {getattr(config, 'model_type', '?')!r})"
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{family} is an encoder-decoder model; speculative decoding "
                         "here needs a decoder-only causal LM. Use model.generate().")
    if getattr(model, "_is_stateful", False):
        raise ValueError(f"{family} keeps a recurrent (state-space) state that cannot be "
                         "rolled back to the accepted tokens, so draft trees cannot be "
                         "verified. Use model.generate().")
    attention = getattr(config, "_attn_implementation", None)
    if attention not in TREE_MASK_ATTENTION:
        raise ValueError(f"{family} runs attn_implementation={attention!r}, which cannot take "
                         "a draft tree's attention mask; load it with "
                         "attn_implementation='sdpa' (or 'eager'), or call "
                         "model.set_attn_implementation('sdpa')")
    try:
        attention_windows(config)
    except ValueError as error:
        raise ValueError(f"{family}: {error}; draft trees need attention layers whose "
                         "cache can be cut back. Use model.generate().") from error


def check_preallocated(model: torch.nn.Module, engine: str) -> None:
    """Raise ValueError naming the reason unless an engine that preallocates its cache
    and places every token itself (``engine``: its name, for the message) can serve a
    model :func:`check_supported` accepted: a rotary embedding whose angles depend on
    the position alone (else the cache would be recomputed as the sequence grows), and
    the whole model on one device."""
    config = model.config
    family = f"{type(model).__name__} (model_type {getattr(config, 'model_type', '?')!r})"
    if rope_limit(model) is not None:
        raise ValueError(f"{family} uses a rotary embedding that changes with the sequence "
                         f"length (the cache would be recomputed); the {engine} cannot "
                         "serve it. Use the eager engine.")
    devices = set((getattr(model, "hf_device_map", None) or {}).values())
    if len(devices) > 1:
        raise ValueError(f"{family} is split over devices {sorted(map(str, devices))}; "
                         f"the {engine} needs the model on one device")

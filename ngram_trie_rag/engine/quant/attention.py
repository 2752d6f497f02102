"""Attention for a quantized model, accumulated in fp64 so every query's output is the
same whatever else shares its forward.

Installed where a quantized model's products round their rows (bf16 for W8A16 and
W4A16, int8 for w8a8); an fp32 model's W8A32 layers (:mod:`.w8a32`) keep fp32 rows and
the model's own attention, as the float model does.

Why: the weight-only kernels take bf16 activations (:mod:`.kernels`). A hidden state
that differs from ``generate``'s by one fp32 ulp -- as attention over a tree (more
queries, masked keys between a node's ancestors) gives, where fp32 kernels sum in
another order -- can round to another bf16 value at the next product, and the change
grows from there; 2 of 3 Spec-Bench RAG answers of the int8 default model left its own
``generate`` within 128 tokens with fp32 attention. Every other operation of the step
is row-wise (the kernels compute each row alone, bitwise; norms, RoPE, the MLP), so
attention is the one place rows meet. Computed in fp64 and rounded once to fp32, its
output is the exact value rounded, unless that value lies within ~1e-16 of a rounding
boundary: the summation order no longer shows, and a node's output equals the one
``generate`` computes for that position.

The model points its ``_attn_implementation`` at this function, so ``generate``, the
modules and the engines' own steps all run it: the model is one model, decoded one way.
The cost is fp64 products over the cache (about 2x fp32's on a CPU). SDPA computes it,
except where the scores are softcapped (Gemma-2), which SDPA cannot do: that is written
out as ``eager`` attention does.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ngram_trie_rag_fp64"
_INSTALL = threading.Lock()


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: torch.Tensor | None, scale: float | None, causal: bool = False,
           softcap: float | None = None) -> torch.Tensor:
    """Attention in fp64, rounded to the query's dtype. query (B, H, Q, D); key, value
    (B, H_kv, S, D), H a multiple of H_kv; ``mask`` additive or boolean (True: attend),
    broadcastable to (B, H, Q, S), or None; ``causal``: query i sees keys 0 .. i (SDPA's
    ``is_causal``, which Transformers passes for a prompt without a mask); ``softcap``:
    Gemma-2's ``tanh(s / cap) * cap`` on the scores. Returns (B, H, Q, D)."""
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    if softcap is None:  # SDPA's blocked kernel: a long prompt never holds Q x S scores
        out = F.scaled_dot_product_attention(
            query.double(), key.double(), value.double(), attn_mask=mask, scale=scale,
            is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
        return out.to(query.dtype)
    return _softcapped(query, key, value, mask, scale, causal, softcap)


def _softcapped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, scale: float | None, causal: bool,
                softcap: float) -> torch.Tensor:
    """:func:`attend` written out, for the scores SDPA cannot cap (as ``eager`` does)."""
    b, heads, q_len, dim = query.shape
    kv_heads, s_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # the query heads of one KV head side by side: (B, H_kv, groups * Q, D), no KV copy
    q = query.double().reshape(b, kv_heads, groups * q_len, dim)
    scores = q @ key.double().transpose(-1, -2)  # (B, H_kv, groups * Q, S)
    scores = scores.view(b, kv_heads, groups, q_len, s_len) * (
        scale if scale is not None else dim ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        seen = torch.ones(q_len, s_len, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~seen, float("-inf"))
    if mask is not None:
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        # (B, 1 or H, Q, S) -> (B, 1 or H_kv, 1 or groups, Q, S), as the scores are laid out
        per_head = mask.shape[1] == heads and heads > 1
        mask = mask.reshape(mask.shape[0], kv_heads if per_head else 1,
                            groups if per_head else 1, *mask.shape[-2:])
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool \
            else scores + mask
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, groups * q_len, s_len)
    out = probs @ value.double()  # (B, H_kv, groups * Q, D)
    return out.view(b, heads, q_len, dim).to(query.dtype)


def fp64_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, attention_mask: torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, softcap: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """A Transformers attention function (inference only; what ``sdpa`` and ``eager``
    take, softcapping included): returns (B, Q, H, D)."""
    if kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("the fp64 attention of a quantized model takes no position bias "
                         "or attention sinks")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    out = attend(query, key, value, attention_mask, scaling, causal, softcap)
    return out.transpose(1, 2).contiguous(), None


def install(model: torch.nn.Module) -> None:
    """Point the model's attention at :func:`fp64_attention` (masks built as for SDPA)."""
    with _INSTALL:
        AttentionInterface.register(NAME, fp64_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    text = model.config.get_text_config()
    for config in {id(model.config): model.config, id(text): text}.values():
        config._attn_implementation = NAME


def installed(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME

"""Attention for a quantized model, computed so every query's output is the same
whatever else shares its forward: row by row in fp32 (:mod:`.rowwise_attention`) where
that kernel runs (an fp32 model on an AVX-512 CPU), else accumulated in fp64.

Installed on every quantized model where the row-wise kernel runs, and wherever the
products round their rows (bf16 for W8A16 and W4A16, int8 for w8a8). An fp32 model's
W8A32 / W4A32 layers (:mod:`.w8a32`, :mod:`.w4a32`) where the row-wise kernel does not
run (softcapped scores, a failed build) keep the model's own attention, as the float
model does: their rows are not rounded, so a last-bit difference stays one.

Why: the weight-only kernels take bf16 activations (:mod:`.kernels`). A hidden state
that differs from ``generate``'s by one fp32 ulp -- as attention over a tree (more
queries, masked keys between a node's ancestors) gives, where SDPA sums in another
order -- can round to another bf16 value at the next product, and the change grows
from there; 2 of 3 Spec-Bench RAG answers of the int8 default model left its own
``generate`` within 128 tokens with fp32 SDPA. Every other operation of the step is
row-wise (the kernels compute each row alone, bitwise; norms, RoPE, the MLP), so
attention is the one place rows meet.

- Row-wise fp32: each row is summed in one fixed order over the keys it sees, so a
  node's output is bitwise ``generate``'s for that position; cheaper than SDPA's fp32
  kernel at a step's rows, and 4-7x cheaper than fp64.
- fp64 (a bf16 model, no AVX-512, softcapped scores, a GPU): computed in fp64 and
  rounded once to fp32, the output is the exact value rounded, unless that value lies
  within ~1e-16 of a rounding boundary, so the summation order no longer shows. SDPA
  computes it, except where the scores are softcapped (Gemma-2), which SDPA cannot do:
  that is written out as ``eager`` attention does.

The model points its ``_attn_implementation`` at :func:`quantized_attention`, so
``generate``, the modules and the engines' own steps all run the same one: the model is
one model, decoded one way.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import rowwise_attention

NAME = "ngram_trie_rag_quantized"
_INSTALL = threading.Lock()
_LAST_ALLOWED = threading.local()  # (mask, shape, allowed) of the thread's last forward


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


def quantized_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, softcap: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """A Transformers attention function (inference only; what ``sdpa`` and ``eager``
    take, softcapping included): returns (B, Q, H, D)."""
    if kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("the attention of a quantized model takes no position bias "
                         "or attention sinks")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    b, _, q_len, dim = query.shape
    scale = scaling if scaling is not None else dim ** -0.5
    if key.dtype == torch.float32 and rowwise_attention.applies(
            query.dtype, query.device, dim, softcap):
        allowed = _allowed_keys(module, attention_mask, b, q_len, key.shape[2])
        return rowwise_attention.attend(query, key, value, allowed, causal, scale), None
    out = attend(query, key, value, attention_mask, scale, causal, softcap)
    return out.transpose(1, 2).contiguous(), None


def _allowed_keys(module: torch.nn.Module, mask: torch.Tensor | None, batch: int,
                  q_len: int, s_len: int) -> torch.Tensor | None:
    """:func:`~.rowwise_attention.allowed_keys` of ``mask``, converted once per forward:
    the layers of a forward share their mask object, so the table of the thread's last
    one is reused until the next forward's first layer (``layer_idx`` 0, or a module
    without one) or another mask object. A mask written in place between forwards is
    therefore read again; within a forward none is."""
    last = getattr(_LAST_ALLOWED, "value", None)
    if (mask is not None and last is not None and last[0] is mask
            and last[1] == (batch, q_len, s_len) and getattr(module, "layer_idx", 0)):
        return last[2]
    allowed = rowwise_attention.allowed_keys(mask, batch, q_len, s_len)
    _LAST_ALLOWED.value = None if mask is None else (mask, (batch, q_len, s_len), allowed)
    return allowed


def rowwise_fits(model: torch.nn.Module) -> bool:
    """True where the row-wise fp32 kernel can be the model's attention: decided by the
    model's dtype, device, head size and softcapping, so every call agrees."""
    text = model.config.get_text_config()
    dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return rowwise_attention.applies(model.dtype, model.device, dim,
                                     getattr(text, "attn_logit_softcapping", None))


def rowwise(model: torch.nn.Module) -> bool:
    """True where the model's installed attention is the row-wise fp32 kernel."""
    return installed(model) and rowwise_fits(model)


def reads_fp64(model: torch.nn.Module) -> bool:
    """True where the model attends in fp64: an engine's cache then holds fp64 keys and
    values (widened once per row, not per step)."""
    return installed(model) and not rowwise(model)


def install(model: torch.nn.Module) -> None:
    """Point the model's attention at :func:`quantized_attention` (masks built as for
    SDPA)."""
    with _INSTALL:
        AttentionInterface.register(NAME, quantized_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    text = model.config.get_text_config()
    for config in {id(model.config): model.config, id(text): text}.values():
        config._attn_implementation = NAME


def installed(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME

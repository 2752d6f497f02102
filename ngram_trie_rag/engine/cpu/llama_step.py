"""The generator's forward for Llama-family models: the modules' operations, called directly.

A decode step of a small model on a CPU is short enough for dispatch to matter.
Through Transformers' modules a one-token forward of the default model (30 layers,
two cores, 1,000 cached tokens) takes 38-40 ms in bf16 and 61-63 ms in fp32 (stock
linear layout); the same operations on the same weights called here take 33-35 ms and
55 ms. The matrix products and attention are unchanged; what goes is the per-module
call machinery, keyword plumbing and mask preparation around them, some 150 module
calls per forward.

Nothing is re-derived: RMSNorm upcasts to fp32 as ``LlamaRMSNorm`` does, RoPE is
rotate-half with the model's own rotary embedding (so scaled RoPE variants come
along), keys and values go through the cache's ``update``, and attention is SDPA as
:mod:`ngram_trie_rag.engine.cpu.gqa_attention` runs it (a quantized model's own:
:mod:`ngram_trie_rag.engine.quant.attention`). The operations run in the modules' order
on the modules' weights (no copies), so the logits are bitwise those of the module
forward (``tests/test_llama_step.py``) in every variant the modules also run: the stock
or transposed linear layout, packed or stock single-query attention, tree masks. Two
layouts only the step runs: oneDNN-prepacked weights, and fp32 products in this
package's own kernel (:mod:`ngram_trie_rag.engine.cpu.rowwise_linear`).

Only the generator's own steps run here; prefill, ``generate`` and anything else keep
the modules. :func:`applies` checks the structure it relies on and anything else --
another architecture, biases, hooked layers, weights quantized by another library
(tensor subclasses), another attention implementation, a GPU (where this has not been
measured) -- runs the modules. Layers quantized by :mod:`ngram_trie_rag.engine.quant`
run here, called as they are (stock layout only: the other layouts pack float weights);
where the model's layers are fused (:mod:`ngram_trie_rag.engine.quant.fused_layer`), a
layer is those two C++ calls around the cache update and row-wise attention, as the
layers' own forward runs them.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..protocol import Layout
from ..quant import attention as quant_attention
from ..quant import fused_layer, rowwise_attention
from ..quant.embedding import Int8Embedding
from ..quant.fused_layer import FusedLayer
from ..quant.linear import QuantizedLinear
from . import gqa_attention, rowwise_linear
from .linear_layout import dense, prepacked, prepacked_product, transposed_product
from .ragged_attention import RaggedAttention
from .rowwise_linear import rowwise_product

_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# A layer's matrix: the module's own weight, or a quantized layer (called as it is).
Matrix = torch.Tensor | QuantizedLinear


class LayerWeights(NamedTuple):
    """One decoder layer as the step reads it: the modules' own tensors (no copies) and
    constants, gathered once so a step does no module attribute lookups."""

    input_norm: torch.Tensor  # input_layernorm.weight
    input_eps: float
    q_proj: Matrix
    k_proj: Matrix
    v_proj: Matrix
    o_proj: Matrix
    head_dim: int
    scaling: float  # attention's softmax scale
    post_norm: torch.Tensor  # post_attention_layernorm.weight
    post_eps: float
    gate_proj: Matrix
    up_proj: Matrix
    down_proj: Matrix
    qkv: QuantizedLinear | None = None  # q/k/v stacked (a quantized model's), else None
    gate_up: QuantizedLinear | None = None  # gate/up stacked, likewise
    fused: FusedLayer | None = None  # the layer's two C++ calls (see quant.fused_layer)


# The linear weights of a layer: the tensors a linear layout may replace by packed copies.
_MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def applies(model: torch.nn.Module) -> bool:
    """True for an eval-mode ``LlamaForCausalLM`` on a CPU with SDPA attention, plain
    bias-free linear layers, SiLU MLPs and no module hooks."""
    cfg = getattr(model, "config", None)
    if (cfg is None or type(model).__name__ != "LlamaForCausalLM" or model.training
            or model.device.type != "cpu"
            # SDPA, or the gated SDPA of gqa_attention.install (an Engine over the
            # modules): the step runs attention itself either way
            or getattr(cfg, "_attn_implementation", None) not in (
                "sdpa", gqa_attention.NAME, quant_attention.NAME)
            or getattr(cfg, "hidden_act", None) != "silu"
            or getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False)
            or getattr(cfg, "pretraining_tp", 1) != 1):
        return False
    if hooked(model.modules()):
        return False
    for module in model.modules():
        if hasattr(module, "_hf_hook"):  # accelerate offloading, adapters
            return False
        if isinstance(module, torch.nn.Linear) and (
                type(module) is not torch.nn.Linear or module.bias is not None
                or not dense(module.weight)):
            return False
        if isinstance(module, QuantizedLinear) and module.bias is not None:
            return False
    embed = model.get_input_embeddings()
    if type(embed) is torch.nn.Embedding and not dense(embed.weight):
        return False
    return (type(embed) in (torch.nn.Embedding, Int8Embedding) and hasattr(model, "model")
            and hasattr(model.model, "rotary_emb"))


def hooked(modules) -> bool:
    """True when a forward hook (on one of ``modules``, or a global one) would run in
    the module forward: the step would bypass it, so the modules must run."""
    from torch.nn.modules import module as nn_module

    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks for m in modules))


def for_model(model: torch.nn.Module) -> LlamaStep:
    """The model's step, one per model: generators over the same model share it and
    with it the prepacked weight copies."""
    step = _STEPS.get(model)
    if step is None:
        step = _STEPS[model] = LlamaStep(model)
    return step


class LlamaStep:
    """``step(input_ids, position_ids, mask, cache, layout, packed) -> logits (Q, V)``;
    :meth:`batch` for B sequences at once (the batched engine's step)."""

    def __init__(self, model: torch.nn.Module) -> None:
        base = model.model
        cfg = model.config
        self.rotary = base.rotary_emb
        embed = base.embed_tokens
        # (V, d) table, or a quantized embedding (looked up by calling it)
        self.embed = embed if isinstance(embed, Int8Embedding) else embed.weight
        self.norm = (base.norm.weight, base.norm.variance_epsilon)
        self.quantized = isinstance(model.lm_head, QuantizedLinear)  # all layers, or none
        # a quantized model's attention (see quant.attention): row-wise fp32, or fp64
        self.rowwise = quant_attention.rowwise(model)
        self.fp64_attention = quant_attention.installed(model) and not self.rowwise
        self.head = _matrix(model.lm_head)  # (V, d)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or self.heads
        head_dim = base.layers[0].self_attn.head_dim if len(base.layers) else 0
        self.qkv_sizes = (self.heads * head_dim, self.kv_heads * head_dim,
                          self.kv_heads * head_dim)
        self.layers: list[LayerWeights] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(LayerWeights(
                input_norm=layer.input_layernorm.weight,
                input_eps=layer.input_layernorm.variance_epsilon,
                q_proj=_matrix(attn.q_proj), k_proj=_matrix(attn.k_proj),
                v_proj=_matrix(attn.v_proj), o_proj=_matrix(attn.o_proj),
                head_dim=attn.head_dim, scaling=attn.scaling,
                post_norm=layer.post_attention_layernorm.weight,
                post_eps=layer.post_attention_layernorm.variance_epsilon,
                gate_proj=_matrix(mlp.gate_proj), up_proj=_matrix(mlp.up_proj),
                down_proj=_matrix(mlp.down_proj),
                qkv=getattr(attn, "quantized_qkv", None),
                gate_up=getattr(mlp, "quantized_gate_up", None),
                fused=fused_layer.of(layer)))
        self.decoder_layers = list(base.layers)
        # a fused quantized model's own layers; an fp32 model's in the rowwise layout
        # (built on first use)
        self._model_fused = ([w.fused for w in self.layers]
                             if self.layers and self.layers[0].fused is not None else None)
        self._rowwise_fused: list[FusedLayer] | None = None
        self.modules = tuple(model.modules())  # checked for hooks before every step
        self._prepacked: tuple[list[LayerWeights], torch.Tensor] | None = None
        self._versions: list[int] = []  # the weights' in-place versions when packed

    def _weights(self, layout: Layout) -> tuple[list[LayerWeights], torch.Tensor]:
        """The layers' weights and lm_head in ``layout``: the modules' own tensors, or
        for "prepacked" oneDNN copies of the matrices, made on first use and again after
        a weight changed in place."""
        if layout != "prepacked":
            return self.layers, self.head
        originals = [getattr(layer, name) for layer in self.layers for name in _MATRICES]
        versions = [t._version for t in [*originals, self.head]]
        if self._prepacked is None or versions != self._versions:
            layers = [layer._replace(**{name: prepacked(getattr(layer, name))
                                        for name in _MATRICES})
                      for layer in self.layers]
            self._prepacked = (layers, prepacked(self.head))
            self._versions = versions
        return self._prepacked

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 mask: torch.Tensor | None, cache, layout: Layout = "stock",
                 packed: bool = False) -> torch.Tensor:
        """One forward over ``input_ids`` (1, Q) at ``position_ids`` (1, Q), appending
        their keys and values to ``cache``. ``mask`` is the additive (1, 1, Q, S) tree
        mask, or None for a single query. ``layout``: see
        :mod:`ngram_trie_rag.engine.cpu.linear_layout`; ``packed``: a single query's GQA
        packed as in :func:`ngram_trie_rag.engine.cpu.gqa_attention.sdpa_packed_gqa`
        (masked GQA always is)."""
        return self.batch(input_ids, position_ids, mask, cache, layout, packed)[0]

    @torch.inference_mode()
    def batch(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
              mask: torch.Tensor | None, cache, layout: Layout = "stock",
              packed: bool = False, ragged: RaggedAttention | None = None) -> torch.Tensor:
        """:meth:`__call__` over B sequences: ``input_ids`` and ``position_ids`` (B, Q),
        ``mask`` (B, 1, Q, S), ``cache.update`` taking and returning B rows (the batched
        engine's :class:`~ngram_trie_rag.engine.batched.slot_cache.StepCache`); logits
        (B, Q, V). With ``ragged``, the B sequences' queries end to end instead:
        ``input_ids`` and ``position_ids`` (1, T), no mask, attention through
        ``ragged`` (:mod:`~ngram_trie_rag.engine.cpu.ragged_attention`, which knows the
        rows), the cache's update taking (1, H, T, D); logits (1, T, V)."""
        b, q_len = input_ids.shape
        if ragged is not None:
            if b != 1 or mask is not None:
                raise ValueError("a ragged forward takes (1, T) queries and no mask")
        elif mask is None and q_len != 1:
            raise ValueError("an unmasked forward must be a single query")
        if self.quantized and layout != "stock":
            raise ValueError(f"the {layout} layout packs float weights; this model's are "
                             "quantized (stock layout only)")
        linear = {"stock": _quantized_product if self.quantized else F.linear,
                  "transposed": transposed_product, "prepacked": prepacked_product,
                  "rowwise": rowwise_product}[layout]
        layers, head = self._weights(layout)
        groups = self.heads // self.kv_heads
        embed = self.embed
        h = embed(input_ids) if isinstance(embed, Int8Embedding) else F.embedding(input_ids, embed)
        cos, sin = self.rotary(h, position_ids)  # (B, Q, D) each
        fused = self._fused(layout)
        if fused and fused[0].takes(h):  # each layer two C++ calls, attention row-wise
            allowed = (rowwise_attention.allowed_keys(mask, b, q_len, mask.shape[-1])
                       if mask is not None else None)  # (B, Q, S) uint8
            for i, layer in enumerate(fused):  # what a fused model's own layers run
                q, k, v = layer.attention_inputs(h, cos, sin)
                k, v = cache.update(k, v, i)
                a = (ragged.attend(q, k, v, layer.attn.scaling) if ragged is not None
                     else fused_layer.attend(layer, q, k, v, allowed))
                h = layer.rest(h, a)
            h = _rms_norm(h, *self.norm)
            return linear(h, head)  # (B, Q, V)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        tiled = (gqa_attention.tiled_mask(mask, groups)
                 if mask is not None and groups > 1 and not self.rowwise else mask)
        allowed = (rowwise_attention.allowed_keys(mask, b, q_len, mask.shape[-1])
                   if self.rowwise and mask is not None else None)  # (B, Q, S) uint8
        for i, w in enumerate(layers):
            dim, scale = w.head_dim, w.scaling
            x = _rms_norm(h, w.input_norm, w.input_eps)
            if w.qkv is not None:  # one product, the parts' bits
                q, k, v = w.qkv(x).split(self.qkv_sizes, dim=-1)
            else:
                q, k, v = linear(x, w.q_proj), linear(x, w.k_proj), linear(x, w.v_proj)
            q = q.view(b, q_len, -1, dim).transpose(1, 2)  # (B, H, Q, D)
            k = k.view(b, q_len, -1, dim).transpose(1, 2)  # (B, H_kv, Q, D)
            v = v.view(b, q_len, -1, dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k, v = cache.update(k, v, i)  # (B, H_kv, S, D): the committed prefix + these
            if ragged is not None:  # (1, T, H D)
                h = h + linear(ragged.attend(q, k, v, scale), w.o_proj)
            elif self.rowwise:  # (B, Q, H, D), each row alone
                a = rowwise_attention.attend(q, k, v, allowed, False, scale)
                h = h + linear(a.view(b, q_len, -1), w.o_proj)
            else:
                h = h + linear(self._attention(q, k, v, mask, tiled, scale, packed), w.o_proj)
            x = _rms_norm(h, w.post_norm, w.post_eps)
            if w.gate_up is not None:
                gate, up = w.gate_up(x).chunk(2, dim=-1)
            else:
                gate, up = linear(x, w.gate_proj), linear(x, w.up_proj)
            h = h + linear(F.silu(gate) * up, w.down_proj)
        h = _rms_norm(h, *self.norm)
        return linear(h, head)  # (B, Q, V)

    def _fused(self, layout: Layout) -> list[FusedLayer] | None:
        """The layers as :class:`FusedLayer` calls: a fused quantized model's own, or in
        the rowwise layout an fp32 model's over its weights (built on first use, where
        the fused layer's and the row-wise attention's kernels are built); else None."""
        if self._model_fused is not None:
            return self._model_fused
        if layout != "rowwise":
            return None
        if self._rowwise_fused is None:
            self._rowwise_fused = self._fp32_fused()
        return self._rowwise_fused or None

    def _fp32_fused(self) -> list[FusedLayer]:
        layers = self.decoder_layers
        if not layers or fused_layer.kernel() is None:
            return []
        attn = layers[0].self_attn
        cfg = attn.config
        if (getattr(cfg, "partial_rotary_factor", 1.0) != 1.0
                or not rowwise_attention.applies(torch.float32, torch.device("cpu"),
                                                 attn.head_dim, None)):
            return []
        product = rowwise_linear.address()
        return [FusedLayer(layer, fp32_product=product) for layer in layers]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None, tiled: torch.Tensor | None, scale: float,
                   packed: bool) -> torch.Tensor:
        """SDPA (fp64 for a quantized model without the row-wise kernel) of q (B, H, Q, D)
        over k, v (B, H_kv, S, D): (B, Q, H * D)."""
        b, heads, q_len, dim = q.shape
        groups = heads // self.kv_heads
        if self.fp64_attention:  # a quantized model's (see quant.attention)
            a = quant_attention.attend(q, k, v, mask, scale)
        elif groups == 1:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        elif mask is not None or packed:  # query heads sharing a KV head, packed
            a = F.scaled_dot_product_attention(
                q.reshape(b, self.kv_heads, groups * q_len, dim), k, v, attn_mask=tiled,
                scale=scale)
        else:
            a = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        return a.view(b, heads, q_len, dim).transpose(1, 2).reshape(b, q_len, -1)


def _matrix(linear: torch.nn.Module) -> Matrix:
    """What the step multiplies by: a plain layer's weight, a quantized layer itself."""
    return linear if isinstance(linear, QuantizedLinear) else linear.weight


def _quantized_product(x: torch.Tensor, layer: QuantizedLinear) -> torch.Tensor:
    """``layer(x)``: the quantized layer's own product (bias-free here, see ``applies``)."""
    return layer(x)


def _rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm``: statistics in fp32, scaled in the input's dtype."""
    dtype = h.dtype
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

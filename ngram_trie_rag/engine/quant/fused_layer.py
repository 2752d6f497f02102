"""A quantized fp32 decoder layer of the Llama kind in two C++ calls around its attention.

Why: once the products are W8A32 / W4A32 kernels and attention is row-wise, a decode
step of a small model is mostly dispatch. Each of the default model's 30 layers runs
some forty tensor operations (two RMSNorms, RoPE on q and k, SiLU, the residual adds,
views, casts), each a Python call and an ATen dispatch: with the products and attention
taken out, 8-16 ms of a 28-30 ms int8 step at one row (2 cores). Here a layer is
:file:`decoder_layer_avx512.cpp`'s ``attention_inputs`` (RMSNorm, the stacked q/k/v
product, its bias, RoPE), the cache's ``update``, the row-wise attention, and ``rest``
(o_proj, residual, RMSNorm, the stacked gate/up product, SiLU, down_proj, residual).

Every operation in the two calls computes each row alone in one fixed order (see the
source), so rows stay apart as the products and attention already keep them: a tree's
rows are bitwise ``generate``'s one-row steps. The model's layers are pointed at these
calls (:func:`install`), so its ``generate``, the modules and the engines' own step
(:mod:`~ngram_trie_rag.engine.cpu.llama_step`) all run them: one model, decoded one
way. Forwards of more rows than the products' kernels take (a long prompt's) run the
layer's own modules, in ``generate`` and the engines alike.

It applies to Llama, Mistral and Qwen2 decoder layers (RMSNorm, rotate-half RoPE over
the whole head, a SiLU-gated MLP, optional biases) whose products all take fp32 rows
(int8 / int4 of an fp32 model on an AVX-512 CPU) and whose model attends row-wise.
Elsewhere the layers stay as they are.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
import threading
import types
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import attention, native, rowwise_attention, w4a32, w8a32
from .linear import Int4Fp32Linear, Int8Fp32Linear, QuantizedLinear

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decoder_layer_avx512.cpp")
FLAGS = ("-O2", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-shared", "-fPIC")
MAX_ROWS = min(w8a32.MAX_ROWS, w4a32.MAX_ROWS)  # more rows: the modules (BLAS products)
LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")

_LOCK = threading.Lock()
_KERNEL: list[Any] = []  # [] until tried; then [(attention_inputs, rest)] or [None]
# A layer's FusedLayer, outside the module: its ctypes structure holds pointers, which
# neither pickle nor deep-copy (a copied layer builds its own from its own tensors).
_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILD = threading.Lock()  # builds a FusedLayer once


class _Matrix(ctypes.Structure):
    _fields_ = [("product", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("scales", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("intermediate", ctypes.c_int64), ("input_norm", ctypes.c_void_p),
                ("post_norm", ctypes.c_void_p), ("input_eps", ctypes.c_float),
                ("post_eps", ctypes.c_float),
                # the whole in the first part (the others zero), or one part each
                ("qkv", _Matrix * 3), ("o", _Matrix), ("gate_up", _Matrix * 2),
                ("down", _Matrix)]


def kernel() -> Any:
    """The built pair of functions, or None where the CPU lacks AVX-512 or the build
    failed (warned once); thread-safe."""
    return native.once(_KERNEL, _LOCK, lambda: _build() if w8a32.supported_cpu() else None)


def _build() -> Any:
    try:
        inputs = native.load(SOURCE, FLAGS, "ntr_layer_attention_inputs", log)
        rest = native.load(SOURCE, FLAGS, "ntr_layer_rest", log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the fused decoder layer is not available (%s); quantized layers run "
                    "their modules instead", native.why(error))
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    inputs.restype = rest.restype = None
    inputs.argtypes = [ptr, ptr, i64, ptr, ptr, ptr, ctypes.c_int]
    rest.argtypes = [ptr, ptr, ptr, i64, ptr, ctypes.c_int]
    return inputs, rest


@functools.cache
def kernel_address(kernels_of: ModuleType, symbol: str | None = None) -> int:
    """The C address of a product kernel (``symbol``, by default the module's
    ``SYMBOL``) in :mod:`.w8a32`'s or :mod:`.w4a32`'s source, looked up once per process
    (built already: a layer of its kind exists)."""
    function = native.load(kernels_of.SOURCE, kernels_of.FLAGS, symbol or kernels_of.SYMBOL,
                           log)
    return ctypes.cast(function, ctypes.c_void_p).value


def _product_address(layer: QuantizedLinear) -> int:
    """The C address of the kernel that multiplies by ``layer``'s weights."""
    return kernel_address(w4a32 if isinstance(layer, Int4Fp32Linear) else w8a32)


class FusedLayer:
    """One decoder layer's two calls: :meth:`attention_inputs` and :meth:`rest`. Holds the
    tensors it points at, so they live as long as it does.

    ``fp32_product``: the C address of the W32A32 kernel, for a float32 layer whose
    products are plain ``nn.Linear`` weights (the engines' rowwise layout,
    :mod:`ngram_trie_rag.engine.cpu.rowwise_linear`): the layer's own weights, q/k/v
    and gate/up as parts (no copies). Without it, a quantized layer's stacked products."""

    def __init__(self, layer: torch.nn.Module, fp32_product: int | None = None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        cfg = attn.config
        self.attn = attn
        self.head_dim = attn.head_dim
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or self.heads
        self.sizes = (self.heads * self.head_dim, self.kv_heads * self.head_dim,
                      self.kv_heads * self.head_dim)
        self._keep: list[torch.Tensor] = []
        if fp32_product is not None:
            def part(linear: torch.nn.Linear) -> _Matrix:
                return _Matrix(product=fp32_product, weights=self._ptr(linear.weight),
                               scales=None, bias=self._ptr(linear.bias),
                               n=linear.out_features, k=linear.in_features)

            qkv = [part(attn.q_proj), part(attn.k_proj), part(attn.v_proj)]
            gate_up = [part(mlp.gate_proj), part(mlp.up_proj)]
            o, down = part(attn.o_proj), part(mlp.down_proj)
        else:
            qkv_bias = _stacked_bias([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up_bias = _stacked_bias([mlp.gate_proj, mlp.up_proj])
            qkv = [self._matrix(attn.quantized_qkv, qkv_bias), _Matrix(), _Matrix()]
            gate_up = [self._matrix(mlp.quantized_gate_up, gate_up_bias), _Matrix()]
            o = self._matrix(attn.o_proj, attn.o_proj.bias)
            down = self._matrix(mlp.down_proj, mlp.down_proj.bias)
        self._layer = _Layer(
            hidden=layer.input_layernorm.weight.shape[0], heads=self.heads,
            kv_heads=self.kv_heads, head_dim=self.head_dim,
            intermediate=mlp.gate_proj.out_features,
            input_norm=self._ptr(layer.input_layernorm.weight),
            post_norm=self._ptr(layer.post_attention_layernorm.weight),
            input_eps=layer.input_layernorm.variance_epsilon,
            post_eps=layer.post_attention_layernorm.variance_epsilon,
            qkv=(_Matrix * 3)(*qkv), o=o, gate_up=(_Matrix * 2)(*gate_up), down=down)
        self._address = ctypes.addressof(self._layer)
        self._inputs, self._rest = kernel()

    def _ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        t = t.detach().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _matrix(self, layer: QuantizedLinear, bias: torch.Tensor | None) -> _Matrix:
        scales = layer.pairs if isinstance(layer, Int4Fp32Linear) else layer.scale
        return _Matrix(product=_product_address(layer), weights=self._ptr(layer.qweight),
                       scales=self._ptr(scales), bias=self._ptr(bias),
                       n=layer.out_features, k=layer.in_features)

    def takes(self, hidden: torch.Tensor) -> bool:
        """True for fp32 CPU rows few enough for the kernels (the rule ``generate`` and
        the engines share, so both take the same path)."""
        return (hidden.dtype == torch.float32 and hidden.device.type == "cpu"
                and hidden.numel() // hidden.shape[-1] <= MAX_ROWS)

    def attention_inputs(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, Q, D), k and v (B, H_kv, Q, D) of hidden rows h (B, Q, hidden), q and
        k rotated by cos, sin (B, Q, D)."""
        b, q_len, _ = h.shape
        # (B, Q, D) row for row with h: a batch's shared positions come as (1, Q, D)
        cos = cos.expand(b, q_len, self.head_dim).contiguous()
        sin = sin.expand(b, q_len, self.head_dim).contiguous()
        h = h.contiguous()
        qkv = h.new_empty((b, q_len, sum(self.sizes)))
        self._inputs(self._address, h.data_ptr(), b * q_len, cos.data_ptr(), sin.data_ptr(),
                     qkv.data_ptr(), torch.get_num_threads())
        q, k, v = qkv.split(self.sizes, dim=-1)
        return (q.view(b, q_len, -1, self.head_dim).transpose(1, 2),
                k.view(b, q_len, -1, self.head_dim).transpose(1, 2),
                v.view(b, q_len, -1, self.head_dim).transpose(1, 2))

    def rest(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The layer's output (B, Q, hidden) from its input h and attention a (B, Q, H D)."""
        h, a = h.contiguous(), a.contiguous()
        out = torch.empty_like(h)
        self._rest(self._address, h.data_ptr(), a.data_ptr(), h.numel() // h.shape[-1],
                   out.data_ptr(), torch.get_num_threads())
        return out


def _stacked_bias(parts: list[QuantizedLinear]) -> torch.Tensor | None:
    """The parts' biases side by side (zeros for a part without one), or None for none."""
    if all(p.bias is None for p in parts):
        return None
    return torch.cat([p.bias.float() if p.bias is not None else torch.zeros(p.out_features)
                      for p in parts])


def fits(layer: torch.nn.Module) -> bool:
    """True for a decoder layer this module computes: a Llama / Mistral / Qwen2 layer
    with standard RMSNorms, full-head rotate-half RoPE, a SiLU MLP, no q/k norms, and
    every product on fp32 rows with its q/k/v and gate/up stacked."""
    if type(layer).__name__ not in LAYERS or layer._forward_hooks or layer._forward_pre_hooks:
        return False
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return False
    norms = (getattr(layer, "input_layernorm", None),
             getattr(layer, "post_attention_layernorm", None))
    if not all(type(n).__name__ in NORMS and n.weight.dtype == torch.float32 for n in norms):
        return False
    cfg = attn.config
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    matrices = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    matrices += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    matrices += [getattr(attn, "quantized_qkv", None), getattr(mlp, "quantized_gate_up", None)]
    return all(isinstance(m, Int8Fp32Linear | Int4Fp32Linear) for m in matrices)


def install(model: torch.nn.Module) -> int:
    """Point every decoder layer that :func:`fits` at its :class:`FusedLayer`, where the
    model attends row-wise and the kernel builds; returns how many layers."""
    if not attention.rowwise(model) or kernel() is None:
        return 0
    layers = [m for m in model.modules() if fits(m)]
    for layer in layers:
        layer.forward = types.MethodType(_forward, layer)  # a deep copy rebinds it
        of(layer)  # built now, not in the first answer
    return len(layers)


def of(layer: torch.nn.Module) -> FusedLayer | None:
    """The layer's :class:`FusedLayer` (built on first use: a copied model's layer gets
    its own), or None where the layer runs its modules."""
    bound = layer.__dict__.get("forward")
    if getattr(bound, "__func__", None) is not _forward:
        return None
    fused = _FUSED.get(layer)
    if fused is None:
        with _BUILD:
            fused = _FUSED.get(layer)
            if fused is None:
                fused = _FUSED[layer] = FusedLayer(layer)
    return fused


def _forward(layer: torch.nn.Module, hidden_states: torch.Tensor,
             attention_mask: torch.Tensor | None = None, position_ids: Any = None,
             cache: Any = None, use_cache: bool | None = False,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
             past_key_values: Any = None, **kwargs: Any) -> torch.Tensor:
    """The decoder layer's forward (Transformers' arguments), through its FusedLayer for
    few fp32 CPU rows, else its own modules."""
    cache = cache if cache is not None else past_key_values
    # Compiled, the layer runs its modules, which compile (their kernels are custom ops):
    # the engines refuse compiled steps over these models, so only a measurement of the
    # compiled step (bench.static_step) takes this path, and it promises no bits.
    fused = None if torch.compiler.is_compiling() else of(layer)
    if (fused is None or position_embeddings is None or not fused.takes(hidden_states)
            or position_embeddings[0].shape[-1] != fused.head_dim):  # partial RoPE
        return type(layer).forward(layer, hidden_states, attention_mask=attention_mask,
                                   position_ids=position_ids, cache=cache,
                                   use_cache=use_cache,
                                   position_embeddings=position_embeddings, **kwargs)
    b, q_len, _ = hidden_states.shape
    attn = fused.attn
    q, k, v = fused.attention_inputs(hidden_states, *position_embeddings)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
    a, _ = attention.quantized_attention(attn, q, k, v, attention_mask, scaling=attn.scaling,
                                         **kwargs)
    return fused.rest(hidden_states, a.reshape(b, q_len, -1))


def attend(fused: FusedLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           allowed: torch.Tensor | None) -> torch.Tensor:
    """The row-wise attention of an engine's step (mask already as ``allowed``), as
    :func:`_forward` computes it through the model's attention: (B, Q, H D)."""
    b, _, q_len, _ = q.shape
    out = rowwise_attention.attend(q, k, v, allowed, False, fused.attn.scaling)
    return out.view(b, q_len, -1)

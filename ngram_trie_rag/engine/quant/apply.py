"""Quantizing a loaded model's weights in place, and refusing what cannot run.

``quantize_model(model, "int8" | "int4" | "w8a8")`` replaces every ``nn.Linear``
(lm_head included; GPT-2's ``Conv1D`` too) by :class:`~.linear.Int8Linear` /
:class:`~.linear.Int4Linear` (or, for an fp32 model on an AVX-512 CPU,
:class:`~.linear.Int8Fp32Linear` / :class:`~.linear.Int4Fp32Linear`) /
:class:`~.linear.Int8DynamicLinear` and the input embedding by
:class:`~.embedding.Int8Embedding`, layer by layer (so the float copy of
one layer at a time is the peak). The model then holds no float copy of its matrices: a
tied lm_head gets its own quantized table. Norms, biases and the residual stream keep
the model's float dtype. Attention is :mod:`.attention`'s: each row alone, in fp32
on an AVX-512 CPU, else in fp64 where the products round their rows (to bf16, or to
int8 for w8a8); an fp32 model's W8A32 / W4A32 layers where the row-wise kernel does
not run keep the model's own. The summary's ``"attention"`` says which (``rowwise``,
``fp64``, ``model``).

An int4 layer whose input width is not a whole number of groups (toy models) takes
int8; the model's ``ngram_trie_rag_quantization`` summary counts the layers of each kind.

Layers that read one input are also stacked into one product (:func:`~.linear.fuse`),
which the engine's own step runs; the model's modules keep calling the parts, which
give the same bits. Where every product takes fp32 rows and attention is row-wise,
Llama, Mistral and Qwen2 decoder layers run as two C++ calls around their attention
(:mod:`.fused_layer`; the summary's ``"fused_layers"`` counts them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from . import attention, fused_layer, kernels, vnni, w4a32, w8a32
from .embedding import Int8Embedding
from .linear import (
    Int4Fp32Linear,
    Int4Linear,
    Int8DynamicLinear,
    Int8Fp32Linear,
    Int8Linear,
    QuantizedLinear,
    fusable,
    fuse,
)
from .names import check_scheme

SUMMARY = "ngram_trie_rag_quantization"  # attribute set on a model quantized here
# Stacked products a step may run instead of their parts: name -> the parts' names.
FUSED = {"quantized_qkv": ("q_proj", "k_proj", "v_proj"),
         "quantized_gate_up": ("gate_proj", "up_proj")}


def check_loader_quantization(scheme: str | None, model_kwargs: dict[str, Any],
                              device: torch.device | None) -> None:
    """Refuse, before loading, a quantization the user's loader keywords cannot run with:
    two quantizations at once, or bitsandbytes on a CPU (its 4/8-bit kernels are CUDA's)."""
    config = model_kwargs.get("quantization_config")
    bnb = any(model_kwargs.get(k) for k in ("load_in_8bit", "load_in_4bit"))
    if config is not None:
        method = _quant_method(config)
        bnb = bnb or method == "bitsandbytes"
        if scheme is not None:
            raise ValueError(f"quantization={scheme!r} and model_kwargs['quantization_config']"
                             f" ({method}) both quantize the weights: give one")
    if bnb and device is not None and device.type == "cpu":
        raise ValueError("a bitsandbytes quantization runs on CUDA GPUs; on a CPU use "
                         "quantization='int8' or 'int4' (this package's CPU kernels)")


def _quant_method(config: Any) -> str:
    method = (config.get("quant_method") if isinstance(config, dict)
              else getattr(config, "quant_method", None))
    return str(getattr(method, "value", method) or type(config).__name__)


def quantize_model(model: nn.Module, scheme: str) -> nn.Module:
    """Quantize ``model``'s weights in place (see the module docstring); returns it."""
    device = next(model.parameters()).device
    check_scheme(scheme, device)
    if quantization_of(model) is not None:
        raise ValueError(f"the model is already quantized ({quantization_of(model)})")
    if scheme == "w8a8":
        vnni.kernel()  # built (or loaded) now, not inside the first answer
    activations = _activations(model, scheme, device)
    embedding = model.get_input_embeddings()
    parameters = sum(p.numel() for p in model.parameters())
    counts: Counter[str] = Counter()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear or type(child) is Conv1D:
                layer = _quantized_linear(_as_linear(child), scheme, activations)
                setattr(parent, name, layer)
                counts[layer.scheme] += 1
            elif child is embedding and type(child) is nn.Embedding:
                setattr(parent, name, Int8Embedding(child))
                counts["int8 embedding"] += 1
    fused = _fuse_inputs(model)
    if activations != torch.float32 or attention.rowwise_fits(model):
        attention.install(model)  # rows rounded (bf16, int8), or row-wise: see .attention
    fused_layers = fused_layer.install(model) if activations == torch.float32 else 0
    if hasattr(model.config, "tie_word_embeddings"):
        model.config.tie_word_embeddings = False  # two tables now; never re-tie them
    setattr(model, SUMMARY, {"scheme": scheme, "layers": dict(counts), "fused": fused,
                             "parameters": parameters, "activations": str(activations),
                             "attention": _attention_kind(model),
                             "fused_layers": fused_layers})
    return model


def _attention_kind(model: nn.Module) -> str:
    """How the quantized model attends: ``"rowwise"`` (fp32, each row alone), ``"fp64"``,
    or ``"model"`` (its own)."""
    if attention.rowwise(model):
        return "rowwise"
    return "fp64" if attention.installed(model) else "model"


def _as_linear(layer: nn.Module) -> nn.Linear:
    """A linear layer's weight as (out, in): its own, or a GPT-2 ``Conv1D``'s transposed."""
    if type(layer) is nn.Linear:
        return layer
    weight = layer.weight.detach()  # Conv1D: (in, out), y = x @ W + b
    linear = nn.Linear(weight.shape[0], weight.shape[1], bias=layer.bias is not None,
                       device="meta")
    linear.weight = nn.Parameter(weight.t(), requires_grad=False)
    if layer.bias is not None:
        linear.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)
    return linear


def _activations(model: nn.Module, scheme: str, device: torch.device) -> torch.dtype:
    """The dtype rows enter the weight products in: int8 for w8a8 (each row rounded);
    for int8 and int4, an fp32 model's own on a CPU where :mod:`.w8a32`'s (and for int4
    :mod:`.w4a32`'s, whose narrow layers take int8) kernels are built (built now, not
    inside the first answer); else bf16 (aten's weight-only kernels)."""
    if scheme == "w8a8":
        return torch.int8
    dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype
    if (device.type == "cpu" and dtype == torch.float32 and w8a32.kernel() is not None
            and (scheme == "int8" or w4a32.kernel() is not None)):
        return torch.float32
    return kernels.ACT_DTYPE


def _quantized_linear(linear: nn.Linear, scheme: str,
                      activations: torch.dtype) -> QuantizedLinear:
    fp32_rows = activations == torch.float32
    if scheme == "int4" and kernels.int4_fits(linear.in_features):
        return Int4Fp32Linear.quantize(linear) if fp32_rows else Int4Linear.quantize(linear)
    if scheme == "w8a8":
        return Int8DynamicLinear.quantize(linear)
    return Int8Fp32Linear.quantize(linear) if fp32_rows else Int8Linear.quantize(linear)


def _fuse_inputs(model: nn.Module) -> int:
    """Stack the layers that read one input (attention's q/k/v, a gated MLP's gate/up)
    into one product, registered beside them as :data:`FUSED`; returns how many."""
    count = 0
    for module in list(model.modules()):
        for name, parts in FUSED.items():
            layers = [getattr(module, part, None) for part in parts]
            if all(isinstance(layer, QuantizedLinear) for layer in layers) and fusable(layers):
                module.add_module(name, fuse(layers))
                count += 1
    return count


def quantization_of(model: nn.Module) -> str | None:
    """How the model's weights are quantized: ``"int8"`` / ``"int4"`` when quantized
    here, the ``quant_method`` of a model loaded with a ``quantization_config``
    (``"torchao"``, ``"bitsandbytes"``, ``"gptq"``...), else ``None``."""
    summary = getattr(model, SUMMARY, None)
    if summary is not None:
        return summary["scheme"]
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    if config is not None:
        return _quant_method(config)
    if any(isinstance(m, QuantizedLinear) for m in model.modules()):
        return "custom"
    return None

"""Linear layers over int8 / int4 weights, replacing ``nn.Linear`` in a loaded model.

int8: one symmetric scale per output channel (``absmax / 127``). int4: an asymmetric
scale and zero per group of ``INT4_GROUP`` inputs (the value range of the group over 15
steps; llama.cpp's Q4_1 block). Activations enter those kernels in bf16 and the product
returns in the layer input's dtype (see :mod:`.kernels`); a bias is added in that dtype.
An fp32 model's int8 and int4 layers on an AVX-512 CPU keep fp32 activations instead
(W8A32, :mod:`.w8a32`; W4A32, :mod:`.w4a32`, with an fp32 scale and offset per group).
w8a8: the int8 weights, and each row of activations rounded to int8 on its own scale;
an integer product, fp32 out.

All kernels compute every output column alone too, so layers that read the same input
(q/k/v, gate/up) can run as one product over their stacked weights (:func:`fuse`) with
the same bits; the parts keep views of the stacked weights, so nothing is stored twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
from torch import nn

from . import kernels, w4a32, w8a32


class QuantizedLinear(nn.Module):
    """What the int8 and int4 layers share: shapes, bias, the float dtype out."""

    scheme = ""
    act_dtype = kernels.ACT_DTYPE  # the dtype the rows enter the product in

    def __init__(self, in_features: int, out_features: int,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.act_dtype)
        y = self._product(rows.contiguous())  # (M, N or N padded)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scheme={self.scheme}")


class Int8Linear(QuantizedLinear):
    """W8A16: int8 weights (N, K), one bf16 scale per output channel."""

    scheme = "int8"
    scale_dtype = kernels.ACT_DTYPE  # what the kernel reads the scales in

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__(qweight.shape[1], qweight.shape[0], bias)
        self.register_buffer("qweight", qweight)  # (N, K) int8
        self.register_buffer("scale", scale)  # (N,) scale_dtype

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach().float().contiguous()  # (N, K)
        # rounded as the kernel reads it, so the integers are chosen against that scale
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(cls.scale_dtype)
        q = (w / scale.float()[:, None]).round().clamp(-128, 127).to(torch.int8)
        return cls(q, scale, _bias(linear))

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.int8_product(rows, self.qweight, self.scale)


class Int8Fp32Linear(Int8Linear):
    """W8A32: int8 weights (N, K) with one fp32 scale per output channel, fp32 activations:
    ``x @ (qweight * scale)^T`` summed in fp32, in :mod:`.w8a32`'s kernel (an fp32 model's
    int8 layers on a CPU where it is built). Each row's output is its output alone,
    bitwise, for up to :data:`~.w8a32.MAX_ROWS` rows, so every tree verification's rows
    are ``generate``'s one-row steps; a prompt's longer products multiply by the weights
    dequantized to fp32 (BLAS's fp32 product, as the float model's prompt). With no
    rounding of the rows, the model keeps its own fp32 attention (see :mod:`.attention`)."""

    act_dtype = torch.float32
    scale_dtype = torch.float32

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] > w8a32.MAX_ROWS:
            return kernels.dequantized_product(rows, self.qweight, self.scale)
        return _fp32_rows(w8a32, rows, self.qweight, self.scale)


class Int8DynamicLinear(Int8Linear):
    """W8A8: int8 weights (N, K) with one fp32 scale per output channel, and activations
    quantized to int8 on the fly, one symmetric scale per row (per token).

    The product is integer (``int8 x int8 -> int32``, exact in any summation order), and
    the scales are row-local, so each row's output is the same bits whatever rows share
    the call: a tree verification's rows equal ``generate``'s one-row steps by
    construction. On a CPU with VNNI / AMX the integer product costs about the same for
    1 to 17 rows, where the W8A16 kernel grows with every row (see :mod:`.kernels`)."""

    scheme = "w8a8"
    act_dtype = torch.float32  # rounded to int8 inside the product, row by row
    scale_dtype = torch.float32

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__(qweight, scale, bias)
        # 128 * row sums, for the unsigned activations of the VNNI kernel (see .vnni)
        self.register_buffer("comp", 128 * qweight.sum(dim=1, dtype=torch.int32),
                             persistent=False)

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.int8_dynamic_product(rows, self.qweight, self.scale, self.comp)


class Int4Linear(QuantizedLinear):
    """W4A16: 4-bit weights in aten's packed layout (rows padded to a multiple of 16),
    a bf16 (scale, zero) per group of ``group`` inputs."""

    scheme = "int4"

    def __init__(self, in_features: int, out_features: int, packed: torch.Tensor,
                 scales_and_zeros: torch.Tensor, group: int,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__(in_features, out_features, bias)
        self.group = group
        self.register_buffer("packed", packed)  # (N padded, K / 2) uint8, aten's layout
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # (K / group, N padded, 2)

    @classmethod
    def quantize(cls, linear: nn.Linear, group: int = kernels.INT4_GROUP) -> Int4Linear:
        w = linear.weight.detach().float().contiguous()  # (N, K)
        pad = -w.shape[0] % kernels.INT4_N_MULTIPLE  # zero rows, cut from the product
        if pad:
            w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
        n, k = w.shape
        groups = w.reshape(n, k // group, group)
        low, high = groups.amin(dim=2), groups.amax(dim=2)  # (N, K / group)
        # W = (q - 8) * scale + zero, with scale and zero as the kernel reads them (bf16)
        scale = ((high - low) / 15).clamp(min=1e-6).to(kernels.ACT_DTYPE).float()
        zero = (low + 8 * scale).to(kernels.ACT_DTYPE).float()
        q = ((groups - (zero - 8 * scale)[..., None]) / scale[..., None]).round().clamp(0, 15)
        packed = kernels.pack_int4(q.reshape(n, k).to(torch.int32))
        pairs = torch.stack([scale, zero], dim=-1).transpose(0, 1)  # (K / group, N, 2)
        return cls(linear.in_features, linear.out_features, packed,
                   pairs.to(kernels.ACT_DTYPE).contiguous(), group, _bias(linear))

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.int4_product(rows, self.packed, self.group, self.scales_and_zeros)


class Int4Fp32Linear(QuantizedLinear):
    """W4A32: 4-bit weights with an fp32 scale and offset per group of 32 inputs
    (llama.cpp's Q4_1: ``w = q * s + b``, q in 0..15) and fp32 activations, in
    :mod:`.w4a32`'s kernel (an fp32 model's int4 layers on a CPU where it is built). Each
    row's output is its output alone, bitwise, for up to :data:`~.w4a32.MAX_ROWS` rows;
    a prompt's longer products multiply by the same weights dequantized to fp32."""

    scheme = "int4"
    act_dtype = torch.float32

    def __init__(self, qweight: torch.Tensor, pairs: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__(qweight.shape[1] * 2, qweight.shape[0], bias)
        self.register_buffer("qweight", qweight)  # (N, K / 2) uint8, w4a32.pack's layout
        self.register_buffer("pairs", pairs)  # (N, K / 32, 2) fp32: (s, b) per group

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Int4Fp32Linear:
        w = linear.weight.detach().float().contiguous()  # (N, K)
        n, k = w.shape
        groups = w.reshape(n, k // w4a32.GROUP, w4a32.GROUP)
        low, high = groups.amin(dim=2), groups.amax(dim=2)  # (N, K / 32)
        scale = ((high - low) / 15).clamp(min=1e-6)
        q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
        pairs = torch.stack([scale, low], dim=-1).contiguous()
        return cls(w4a32.pack(q.reshape(n, k)), pairs, _bias(linear))

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] > w4a32.MAX_ROWS:
            return w4a32.dequantized_product(rows, self.qweight, self.pairs)
        return _fp32_rows(w4a32, rows, self.qweight, self.pairs)


def _fp32_rows(kernels_of: ModuleType, rows: torch.Tensor, weights: torch.Tensor,
               scales: torch.Tensor) -> torch.Tensor:
    """A W8A32 / W4A32 product of at most ``MAX_ROWS`` rows in the kernel of
    ``kernels_of`` (:mod:`.w8a32` or :mod:`.w4a32`): its custom operator under
    ``torch.compile``, else the ctypes call (which saves the operator's dispatch)."""
    if torch.compiler.is_compiling():
        return kernels_of.traced_product(rows, weights, scales)
    product = kernels_of.kernel()
    if product is None or rows.device.type != "cpu":
        raise RuntimeError(f"this layer takes fp32 activations through the AVX-512 kernel "
                           f"of {kernels_of.__name__}, which this machine or device does "
                           "not run: quantize the model here")
    return product(rows, weights, scales)


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach().clone()


def fusable(parts: Sequence[nn.Module]) -> bool:
    """True when ``parts`` can run as one product: quantized alike, the same input width,
    and (int4) no padded rows. The stacked product is bias-free; the parts keep theirs."""
    first = parts[0]
    return (isinstance(first, Int8Linear | Int4Linear | Int4Fp32Linear)
            and all(type(p) is type(first) and p.in_features == first.in_features
                    for p in parts)
            and (not isinstance(first, Int4Linear)
                 or (all(p.group == first.group and p.packed.shape[0] == p.out_features
                         for p in parts) and int4_rows_separable(parts))))


def fuse(parts: Sequence[QuantizedLinear]) -> QuantizedLinear:
    """One layer whose product is the ``parts``' products side by side, bitwise; the
    parts are rebound to views of its weights (their scales are small copies: the int4
    kernel reads a strided scale tensor as if it were contiguous)."""
    sizes = [p.out_features for p in parts]
    if isinstance(parts[0], Int4Fp32Linear):  # whole rows per output: stacked as they are
        fused4 = Int4Fp32Linear(torch.cat([p.qweight for p in parts]),
                                torch.cat([p.pairs for p in parts]))
        for part, rows, pairs in zip(parts, fused4.qweight.split(sizes),
                                     fused4.pairs.split(sizes), strict=True):
            part.qweight, part.pairs = rows, pairs
        return fused4
    if isinstance(parts[0], Int8Linear):  # and its W8A8 kind
        fused: QuantizedLinear = type(parts[0])(torch.cat([p.qweight for p in parts]),
                                                torch.cat([p.scale for p in parts]))
        for part, rows in zip(parts, fused.qweight.split(sizes), strict=True):
            part.qweight = rows
        for part, scale in zip(parts, fused.scale.split(sizes), strict=True):
            part.scale = scale
        if isinstance(fused, Int8DynamicLinear):
            for part, comp in zip(parts, fused.comp.split(sizes), strict=True):
                part.comp = comp
        return fused
    first = parts[0]
    fused = Int4Linear(first.in_features, sum(sizes), torch.cat([p.packed for p in parts]),
                       torch.cat([p.scales_and_zeros for p in parts], dim=1), first.group)
    for part, rows in zip(parts, fused.packed.split(sizes), strict=True):
        part.packed = rows
    return fused


def int4_rows_separable(parts: Sequence[Int4Linear]) -> bool:
    """True when the int4 packer lays ``parts``' rows out alone, so that their packed
    weights stacked are the stacked weights packed: on a CPU the packer works in blocks
    of rows (64 with AVX-512), and a part of another height would straddle one."""
    q = [torch.randint(0, 16, (p.out_features, p.in_features), dtype=torch.int32,
                       device=p.packed.device) for p in parts]
    alone = torch.cat([kernels.pack_int4(part) for part in q])
    return torch.equal(alone, kernels.pack_int4(torch.cat(q)))

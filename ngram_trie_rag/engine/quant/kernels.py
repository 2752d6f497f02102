"""The quantized products: which aten kernel multiplies by packed int8 / int4 weights,
and in which activation dtype.

Measured on a 2-core x86 CPU (torch 2.13), ``(rows, 576) @ (49152, 576)^T`` (the default
model's lm_head): fp32 dense 4.8 ms at one row; ``_weight_int8pack_mm`` 1.9 ms with bf16
activations but 22 ms with fp32 ones (a scalar fallback); ``_weight_int4pack_mm_for_cpu``
1.4 ms bf16, 42 ms fp32. So the products take bf16 activations and cast back: a model
quantized here keeps its float dtype everywhere else (norms, attention, the residual
stream), and its linear layers are W8A16 / W4A16. The exception is an fp32 model's
int8 and int4 on an AVX-512 CPU, whose rows stay fp32 in this package's own kernels
(W8A32, :mod:`.w8a32`; W4A32, :mod:`.w4a32`).

Both CPU kernels compute each row of the product independently of the others (checked
bitwise over 1-17 rows), so a tree verification's rows equal the one-row steps of
``generate``: the exactness of the float model carries over.

Both weight-only kernels' cost grows with the rows: (9, 576) @ (49152, 576)^T takes
6.5 ms against 1.7 ms at one row, and a 300-row prefill 7-8x fp32's. W8A8 rounds each
activation row to int8 on its own absmax and multiplies integers (``torch._int_mm``, on
oneDNN's VNNI / AMX kernels): 2.4 ms at 9 rows, 2.9 at 17, 47 ms at 300 (fp32 113 ms).
An integer sum is exact in any order, so its rows are independent by construction, and
a product of a few rows may run in :mod:`.vnni`'s kernel instead, with the same bits.
"""

from __future__ import annotations

import torch

from . import vnni

ACT_DTYPE = torch.bfloat16  # the kernels' activation (and scale) dtype
INT4_GROUP = 32  # weights per int4 scale / zero pair (llama.cpp's Q4_1 block)
INT4_N_MULTIPLE = 16  # the int4 packers want out_features in multiples of this
INT4_GROUPS = (32, 64, 128, 256)  # the group sizes the int4 kernels take


def int8_product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x (M, K) @ (qweight (N, K) * scale (N,))^T`` in ``ACT_DTYPE``: (M, N)."""
    return torch.ops.aten._weight_int8pack_mm(x, qweight, scale)


def int8_dynamic_product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                         comp: torch.Tensor | None = None) -> torch.Tensor:
    """``x (M, K) @ (qweight (N, K) * scale (N,))^T`` in fp32, with ``x`` rounded to int8
    first: one symmetric scale per row (``absmax / 127``), an exact integer product
    (``torch._int_mm``: oneDNN's VNNI / AMX kernels on a CPU), then both scales. Every
    step is row-local, so a row's output does not depend on the rows beside it.

    ``comp`` (N,) int32, ``128 * qweight.sum(1)``: given, a CPU product of at most
    :data:`~.vnni.MAX_ROWS` rows runs in :mod:`.vnni`'s kernel where it is built, with
    the same bits."""
    if (comp is not None and x.shape[0] <= vnni.MAX_ROWS and x.device.type == "cpu"
            and not torch.compiler.is_compiling()):
        product = vnni.kernel()
        if product is not None:
            y = product(x, qweight, scale, comp)
            if y.numel():  # empty: a row that is not finite, left to the operations below
                return y
    step = x.abs().amax(dim=1, keepdim=True).div_(127).clamp_(min=1e-12)  # (M, 1)
    q = torch.round(x / step).to(torch.int8)  # |x / step| <= 127
    return torch.mul(torch._int_mm(q, qweight.t()), scale).mul_(step)  # (M, N) fp32


def dequantized_product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                        slab: int = 4096) -> torch.Tensor:
    """``x (M, K) @ (qweight (N, K) * scale (N,))^T`` in ``x``'s dtype, the weights
    dequantized ``slab`` output rows at a time (at most ``slab * K`` floats held at once)
    and multiplied by the BLAS's dense product: (M, N)."""
    parts = [x @ (qweight[n:n + slab].to(x.dtype) * scale[n:n + slab, None]).t()
             for n in range(0, qweight.shape[0], slab)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """aten's packed layout of 4-bit values ``q`` (N, K) int32 in [0, 15], for the
    weight's device."""
    if q.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    nibbles = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # (N, K / 2), two per byte
    # tinygemm tiles K by 16 * inner_k_tiles: the widest tiling that divides K
    inner = next(t for t in (8, 4, 2) if q.shape[1] % (16 * t) == 0)
    return torch.ops.aten._convert_weight_to_int4pack(nibbles, inner)


def int4_product(x: torch.Tensor, packed: torch.Tensor, group: int,
                 scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """``x (M, K) @ W^T`` where ``W[n, k] = (q - 8) * scale + zero`` per group of ``group``
    inputs; ``scales_and_zeros`` (K / group, N, 2). In ``ACT_DTYPE``: (M, N)."""
    if x.device.type == "cpu":
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm(x, packed, group, scales_and_zeros)


def int4_fits(in_features: int) -> bool:
    """True when the int4 kernels take a layer with ``in_features`` inputs (a whole number
    of ``INT4_GROUP`` groups)."""
    return in_features % INT4_GROUP == 0 and in_features >= INT4_GROUP

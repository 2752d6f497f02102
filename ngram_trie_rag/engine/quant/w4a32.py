"""The int4 weight-only product with fp32 activations on an AVX-512 CPU, built once
per machine: an fp32 model's int4 layers keep their fp32 rows (W4A32), as its int8
layers do in :mod:`.w8a32`.

Why: aten's ``_weight_int4pack_mm_for_cpu`` takes bf16 rows (fp32 ones through a
scalar path, 42 ms against 1.4 ms for the default model's lm_head), so without this
kernel int4 layers round their rows to bf16 (W4A16), the model's attention has to make
up for it (:mod:`.attention`), and a prompt's rows cost the bf16 kernel's per-row price.
:file:`w4a32_avx512.cpp` multiplies fp32 rows by 4-bit weights in a layout of its own
(16 bytes per group of 32 inputs, two nibbles a byte) with an fp32 scale and offset per
group, widened in registers; every output is summed in one fixed order, so each row's
output is bitwise its output alone (``tests/test_w4a32.py``). Products of more than
:data:`MAX_ROWS` rows (a prompt's) multiply by the same weights dequantized to fp32,
through the BLAS, as the float model's prompt does.

Built the first time an fp32 model is quantized to int4 on such a CPU (:mod:`.native`);
where the CPU has no AVX-512 or the build fails (a warning says why), int4 layers are
W4A16 as before.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from . import native, w8a32

log = logging.getLogger(__name__)

GROUP = 32  # inputs per (scale, offset) pair and per 16 bytes of weights
MAX_ROWS = 128  # the most rows a product sends to the kernel (BLAS's fp32 product beyond)
SOURCE = Path(__file__).with_name("w4a32_avx512.cpp")
SYMBOL = "ntr_w4a32_product"
# -ffp-contract=off: a weight is q * s + b rounded twice, as the dense fallback computes it
FLAGS = ("-O2", "-fno-tree-pre", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw",
         "-mavx512vl", "-shared", "-fPIC")

Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Product | None] = []  # [] until tried; then [the kernel] or [None]


def kernel() -> Product | None:
    """The built kernel (``product(x, qweight, pairs)``), or None where the CPU lacks
    AVX-512 or the build failed (warned once); thread-safe."""
    return native.once(_KERNEL, _LOCK,
                       lambda: _build() if w8a32.supported_cpu() else None)


def _build() -> Product | None:
    try:
        function = native.load(SOURCE, FLAGS, SYMBOL, log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the int4 fp32-activation kernel is not available (%s); int4 layers "
                    "take bf16 activations (W4A16) instead", native.why(error))
        return None
    return native.weight_product(function)  # product(x, qweight, pairs)


def pack(q: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of 4-bit values ``q`` (N, K) in 0..15: (N, K / 2) uint8, byte
    i of group g holding q[:, 32 g + i] (low nibble) and q[:, 32 g + 16 + i] (high)."""
    n, k = q.shape
    grouped = q.to(torch.uint8).reshape(n, k // GROUP, 2, GROUP // 2)
    return (grouped[:, :, 0] | grouped[:, :, 1] << 4).reshape(n, k // 2)


def unpack(qweight: torch.Tensor) -> torch.Tensor:
    """:func:`pack`'s inverse: (N, K) uint8 values in 0..15."""
    n = qweight.shape[0]
    grouped = qweight.reshape(n, -1, 1, GROUP // 2)
    return torch.cat([grouped & 15, grouped >> 4], dim=2).reshape(n, -1)


def dequantized_product(x: torch.Tensor, qweight: torch.Tensor, pairs: torch.Tensor,
                        slab: int = 4096) -> torch.Tensor:
    """``x (M, K)`` times the weights the kernel reads, dequantized ``slab`` output rows
    at a time to fp32 (``q * s + b``, each rounded, as the kernel computes them) and
    multiplied by the BLAS's product: (M, N)."""
    parts = []
    for n in range(0, qweight.shape[0], slab):
        q = unpack(qweight[n:n + slab]).float()  # (slab, K)
        s, b = pairs[n:n + slab, :, 0], pairs[n:n + slab, :, 1]  # (slab, K / 32)
        w = (q.view(q.shape[0], -1, GROUP) * s[..., None] + b[..., None]).view_as(q)
        parts.append(x @ w.t())
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


@torch.library.custom_op("ngram_trie_rag::w4a32_product", mutates_args=())
def traced_product(x: torch.Tensor, qweight: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The kernel as an operator ``torch.compile`` keeps whole in its graph (a ctypes call
    would break the graph): the same bits."""
    product = kernel()
    if product is None:
        raise RuntimeError("the int4 fp32-activation kernel is not built on this machine")
    return product(x.contiguous(), qweight.contiguous(), pairs.contiguous())


@traced_product.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))

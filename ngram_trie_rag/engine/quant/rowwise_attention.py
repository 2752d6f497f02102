"""fp32 attention whose every query row is computed alone, in one fixed order, on an
AVX-512 CPU: a quantized fp32 model's attention, built once per machine.

Why: attention is the one place a step's rows meet (the quantized products compute each
row alone, bitwise; norms, RoPE and the MLP are row-wise). A tree node sees the prefix
and its ancestors, with its siblings' keys masked between them; SDPA sums such a row in
another order than ``generate``'s one-row step over the same keys, and the last-bit
difference can grow where the next product rounds its rows (W8A16, int4, w8a8). fp64
attention (:mod:`.attention`) hid the order; :file:`attention_avx512.cpp` removes it:
each row's output depends on its query and the keys it sees, in key order, and nothing
else (not the other rows, heads, masked keys, threads or how a prompt is split). So a
tree verification's rows are bitwise ``generate``'s steps, and for W8A32, whose fp32
rows made SDPA's order differences merely unlikely to matter, they are now bitwise too.

It is also cheaper than either: each block of keys and values is read once for all of
a step's rows and up to four heads that share it. For the default model's 30 layers
over 660 cached keys, 2.2 ms a step at one row and 6.6 ms at eight, against 3.5 and
7.1 ms for fp32 SDPA and about 16 ms for fp64 (2 cores).

The model's own ``generate`` and modules run it too (installed by :mod:`.attention`):
the quantized model is one model, decoded one way. It takes fp32 query, keys and values
on a CPU with AVX-512 F/BW/VL, head dimension up to 256, masks shared by the heads, no
softcapping; elsewhere :mod:`.attention` runs fp64 as before.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from . import native, w8a32

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attention_avx512.cpp")
FLAGS = ("-O2", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-shared", "-fPIC")
MAX_HEAD_DIM = 256

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool, float],
                  torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Attend | None] = []  # [] until tried; then [the kernel] or [None]


def kernel() -> Attend | None:
    """The built kernel (``attend(query, key, value, allowed, causal, scale)``), or None
    where the CPU lacks AVX-512 or the build failed (warned once); thread-safe."""
    return native.once(_KERNEL, _LOCK,
                       lambda: _build() if w8a32.supported_cpu() else None)


def applies(dtype: torch.dtype, device: torch.device, head_dim: int,
            softcap: float | None) -> bool:
    """True where this attention runs: fp32 on a CPU whose kernel is built, head
    dimension up to 256, no softcapped scores. A fixed property of a model, so its
    ``generate`` and the engines' steps always take the same attention."""
    return (dtype == torch.float32 and device.type == "cpu" and head_dim <= MAX_HEAD_DIM
            and softcap is None and kernel() is not None)


def _build() -> Attend | None:
    try:
        function = native.load(SOURCE, FLAGS, "ntr_attention", log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the row-wise attention kernel is not available (%s); quantized models "
                    "attend in fp64 instead", native.why(error))
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    function.restype = ctypes.c_int
    function.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64, ptr,
                         ctypes.c_int, i64, i64, i64, i64, i64, i64, ctypes.c_float, ptr,
                         ctypes.c_int]

    def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               allowed: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
        """query (B, H, Q, D), key and value (B, H_kv, S, D), fp32 on the CPU, last
        dimension contiguous; ``allowed`` (B, Q, S) uint8 contiguous or None: then row i
        sees keys 0 .. i with ``causal`` (SDPA's ``is_causal``), else every key. Out
        (B, Q, H, D)."""
        b, heads, q_len, dim = query.shape
        kv_heads, s_len = key.shape[1], key.shape[2]
        out = query.new_empty((b, q_len, heads, dim))
        function(query.data_ptr(), *_strides(query), key.data_ptr(), *_strides(key),
                 value.data_ptr(), *_strides(value),
                 None if allowed is None else allowed.data_ptr(), int(causal), b, heads,
                 kv_heads, q_len, s_len, dim, scale, out.data_ptr(), torch.get_num_threads())
        return out

    return attend


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) element strides of a (B, H, N, D) tensor; a batch of one
    may have any batch stride."""
    return t.stride(0), t.stride(1), t.stride(2)


def allowed_keys(mask: torch.Tensor | None, batch: int, q_len: int,
                 s_len: int) -> torch.Tensor | None:
    """The (B, Q, S) uint8 "row sees key" table of a mask as attention takes it: boolean
    (True: attend) or additive (0: attend; masked entries at the dtype's minimum or
    -inf), broadcastable to (B, 1, Q, S); None stays None. Masks that differ by head, or
    additive values other than 0 and masked, are refused: they are not masks of keys."""
    if mask is None:
        return None
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.shape[1] != 1:
        raise ValueError("the row-wise attention takes masks shared by the heads "
                         f"(got {tuple(mask.shape)})")
    if mask.shape[-2] not in (1, q_len) or mask.shape[-1] != s_len:
        raise ValueError(f"a mask of shape {tuple(mask.shape)} for {q_len} queries over "
                         f"{s_len} keys")
    mask = mask[:, 0]
    if mask.dtype == torch.bool:
        seen = mask
    else:
        seen = mask == 0
        if not bool((seen | (mask <= torch.finfo(mask.dtype).min)).all()):
            raise ValueError("the row-wise attention takes masks of 0 and -inf (or the "
                             "dtype's minimum), not additive biases")
    return seen.expand(batch, q_len, s_len).to(torch.uint8).contiguous()


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           allowed: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
    """Attention (B, Q, H, D) of query (B, H, Q, D) over key, value (B, H_kv, S, D);
    ``allowed`` from :func:`allowed_keys`. Under ``torch.compile`` it is one operator of
    the graph (:func:`traced_attend`), the same bits."""
    if torch.compiler.is_compiling():
        return traced_attend(query, key, value, allowed, causal, scale)
    run = kernel()
    if run is None:
        raise RuntimeError("the row-wise attention kernel is not built on this machine")
    return run(_rows_contiguous(query), _rows_contiguous(key), _rows_contiguous(value),
               allowed, causal, scale)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("ngram_trie_rag::rowwise_attention", mutates_args=())
def traced_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  allowed: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
    """:func:`attend` as an operator ``torch.compile`` keeps whole (a ctypes call would
    break the graph)."""
    run = kernel()
    if run is None:
        raise RuntimeError("the row-wise attention kernel is not built on this machine")
    return run(query.contiguous(), key.contiguous(), value.contiguous(),
               None if allowed is None else allowed.contiguous(), causal, scale)


@traced_attend.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
      allowed: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
    b, heads, q_len, dim = query.shape
    return query.new_empty((b, q_len, heads, dim))

"""The row-wise fp32 attention of quantized models: each query row's output depends on
its query and the keys it sees, in key order, and on nothing else, bitwise; and it is
attention (fp64's within fp32 rounding).

Greedy exactness of the quantized models that run it is checked end to end in
``test_quantization.py`` (every family, the packaged model, the engines); this file
checks the kernel and where it is installed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ngram_trie_rag.engine.quant import attention, quantize_model, rowwise_attention
from ngram_trie_rag.engine.quant.apply import SUMMARY

if rowwise_attention.kernel() is None:
    pytest.skip("no AVX-512 (or no compiler): quantized models attend in fp64",
                allow_module_level=True)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               seen: torch.Tensor, scale: float) -> torch.Tensor:
    """fp64 attention, (B, Q, H, D); ``seen`` (B, Q, S) bool."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~seen[:, None], -torch.inf)
    return (torch.softmax(scores, -1) @ v).transpose(1, 2).float()


def _inputs(b: int, heads: int, kv_heads: int, q_len: int, s_len: int, dim: int,
            seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, dim, generator=g)
                 for h, n in ((heads, q_len), (kv_heads, s_len), (kv_heads, s_len)))


# (B, H, H_kv, Q, S, D): the default model's decode and tree steps, a prompt, other
# group sizes, and head sizes with a partial 16-wide chunk or many chunks
SHAPES = [(1, 9, 3, 1, 660, 64), (1, 9, 3, 8, 668, 64), (1, 14, 2, 5, 100, 64),
          (2, 4, 4, 6, 40, 80), (1, 6, 2, 40, 40, 64), (1, 2, 1, 3, 50, 7),
          (1, 4, 2, 17, 90, 128), (1, 2, 2, 2, 30, 256)]


@pytest.mark.parametrize(("b", "heads", "kv_heads", "q_len", "s_len", "dim"), SHAPES)
def test_it_is_attention_over_the_keys_each_row_sees(b, heads, kv_heads, q_len, s_len,
                                                     dim) -> None:
    q, k, v = _inputs(b, heads, kv_heads, q_len, s_len, dim, seed=q_len * dim)
    scale = dim ** -0.5
    tree = torch.rand(b, q_len, s_len, generator=torch.Generator().manual_seed(1)) > 0.4
    tree[..., 0] = True
    # is_causal as SDPA aligns it: row i sees keys 0 .. i (a prompt in a larger cache)
    causal = torch.ones(q_len, s_len, dtype=torch.bool).tril().expand(b, -1, -1)
    for allowed, is_causal, seen in ((tree.to(torch.uint8), False, tree),
                                     (None, True, causal),
                                     (None, False, torch.ones_like(tree))):
        out = rowwise_attention.attend(q, k, v, allowed, is_causal, scale)
        assert out.shape == (b, q_len, heads, dim)
        assert torch.allclose(out, _reference(q, k, v, seen, scale), rtol=1e-5, atol=1e-5)


def test_a_tree_row_is_bitwise_the_row_alone_over_its_keys() -> None:
    """What makes a verification step exact: a node's row, seeing the prefix and its
    ancestors with other nodes' keys masked between them, equals ``generate``'s one-row
    step over the same keys laid out contiguously."""
    q, k, v = _inputs(1, 9, 3, 12, 300, 64, seed=0)
    seen = torch.rand(1, 12, 300, generator=torch.Generator().manual_seed(2)) > 0.5
    out = rowwise_attention.attend(q, k, v, seen.to(torch.uint8), False, 0.125)
    for i in range(12):
        keys = seen[0, i].nonzero()[:, 0]
        alone = rowwise_attention.attend(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys], None,
                                         False, 0.125)
        assert torch.equal(alone[0, 0], out[0, i]), i


def test_a_prompt_split_in_chunks_gives_the_same_bits() -> None:
    """A prompt's rows do not depend on how it is split (a kept prefix, chunked prefill)."""
    q, k, v = _inputs(1, 6, 2, 70, 70, 64, seed=3)
    whole = rowwise_attention.attend(q, k, v, None, True, 0.125)
    first = rowwise_attention.attend(q[:, :, :25], k[:, :, :25], v[:, :, :25], None, True, 0.125)
    # the rest after a kept prefix: its mask, as Transformers passes it with a past
    seen = torch.ones(70, 70, dtype=torch.bool).tril()[25:][None].to(torch.uint8)
    rest = rowwise_attention.attend(q[:, :, 25:], k, v, seen, False, 0.125)
    assert torch.equal(torch.cat([first, rest], dim=1), whole)


def test_threads_and_strided_caches_do_not_change_the_bits() -> None:
    q, k, v = _inputs(1, 9, 3, 8, 200, 64, seed=4)
    seen = (torch.rand(1, 8, 200, generator=torch.Generator().manual_seed(5)) > 0.3)
    allowed = seen.to(torch.uint8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rowwise_attention.attend(q, k, v, allowed, False, 0.125)
        torch.set_num_threads(2)
        two = rowwise_attention.attend(q, k, v, allowed, False, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    # a preallocated cache's view: (B, H_kv, capacity, D)[:, :, :S], and a transposed query
    buffer = torch.randn(1, 3, 512, 64)
    buffer[:, :, :200] = k
    values = torch.randn(1, 3, 512, 64)
    values[:, :, :200] = v
    query = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, Q, D), rows strided
    out = rowwise_attention.attend(query, buffer[:, :, :200], values[:, :, :200], allowed,
                                   False, 0.125)
    assert torch.equal(out, one)


def test_masks_as_transformers_and_the_engines_give_them() -> None:
    seen = torch.rand(1, 1, 4, 30, generator=torch.Generator().manual_seed(6)) > 0.5
    seen[..., 0] = True
    additive = torch.zeros(1, 1, 4, 30).masked_fill(~seen, torch.finfo(torch.float32).min)
    infinite = torch.zeros(1, 1, 4, 30).masked_fill(~seen, -torch.inf)
    expected = seen[:, 0].to(torch.uint8)
    for mask in (seen, additive, infinite):
        assert torch.equal(rowwise_attention.allowed_keys(mask, 1, 4, 30), expected)
    assert rowwise_attention.allowed_keys(None, 1, 4, 30) is None
    with pytest.raises(ValueError, match="shared by the heads"):
        rowwise_attention.allowed_keys(seen.expand(1, 3, 4, 30), 1, 4, 30)
    with pytest.raises(ValueError, match="not additive biases"):
        rowwise_attention.allowed_keys(additive + 0.5, 1, 4, 30)
    with pytest.raises(ValueError, match="for 4 queries over 31 keys"):
        rowwise_attention.allowed_keys(seen, 1, 4, 31)


def test_a_row_that_sees_no_key_is_zeros_and_nan_propagates() -> None:
    q, k, v = _inputs(1, 2, 1, 2, 10, 64, seed=7)
    allowed = torch.ones(1, 2, 10, dtype=torch.uint8)
    allowed[0, 1] = 0
    out = rowwise_attention.attend(q, k, v, allowed, False, 0.125)
    assert torch.equal(out[0, 1], torch.zeros(2, 64)) and out[0, 0].isfinite().all()
    q[0, 0, 0, 3] = torch.nan
    assert out.isfinite().all() and rowwise_attention.attend(
        q, k, v, None, False, 0.125)[0, 0, 0].isnan().all()


def test_a_compiled_graph_keeps_the_kernel_whole() -> None:
    q, k, v = _inputs(1, 9, 3, 4, 50, 64, seed=8)
    allowed = torch.ones(1, 4, 50, dtype=torch.uint8)

    def step(q: torch.Tensor) -> torch.Tensor:
        return rowwise_attention.attend(q * 1.0, k, v, allowed, False, 0.125)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q), step(q))


def _family(name: str) -> nn.Module:
    from model_families import FAMILIES, build

    return build(FAMILIES[name])


def test_quantized_fp32_models_attend_row_wise_and_others_in_fp64() -> None:
    for scheme in ("int8", "int4", "w8a8"):
        model = quantize_model(_family("llama-rope-llama3"), scheme)
        assert attention.rowwise(model) and not attention.reads_fp64(model), scheme
        assert getattr(model, SUMMARY)["attention"] == "rowwise"
    bf16 = quantize_model(_family("llama-rope-llama3").to(torch.bfloat16), "int8")
    assert attention.reads_fp64(bf16) and getattr(bf16, SUMMARY)["attention"] == "fp64"
    # softcapped scores (Gemma-2) are not the kernel's: fp64 where the rows are rounded
    # (w8a8), else (W8A32's and W4A32's fp32 rows) the model's own attention
    gemma = quantize_model(_family("gemma2"), "w8a8")
    assert attention.reads_fp64(gemma) and getattr(gemma, SUMMARY)["attention"] == "fp64"
    for scheme in ("int8", "int4"):
        gemma = quantize_model(_family("gemma2"), scheme)
        assert not attention.installed(gemma), scheme
        assert getattr(gemma, SUMMARY)["attention"] == "model"


def test_without_the_kernel_rounded_rows_attend_in_fp64(no_compiler) -> None:
    no_compiler(rowwise_attention)  # the products' kernels built: the layers keep fp32 rows
    model = quantize_model(_family("llama-rope-llama3"), "w8a8")
    assert getattr(model, SUMMARY)["attention"] == "fp64" and attention.reads_fp64(model)
    # fp32 rows (the W8A32 / W4A32 kernels, built before): the model's own attention
    model = quantize_model(_family("llama-rope-llama3"), "int4")
    assert getattr(model, SUMMARY)["attention"] == "model" and not attention.installed(model)


def test_a_forward_converts_its_mask_once_and_the_next_forward_again() -> None:
    """The layers of one forward share the mask's key table; a mask written in place
    before the next forward (whose first layer has ``layer_idx`` 0) is read again."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 3, 16, generator=gen) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    first, later = nn.Module(), nn.Module()
    first.layer_idx, later.layer_idx = 0, 1

    def attend(module: nn.Module) -> torch.Tensor:
        return attention.quantized_attention(module, q, k, v, mask, scaling=0.25)[0]

    seen_all = attend(first)
    assert torch.equal(attend(later), seen_all)
    mask[..., 0] = False  # the next forward's mask, in the same tensor
    moved = attend(first)
    expected = rowwise_attention.attend(q, k, v, rowwise_attention.allowed_keys(
        mask, 1, 3, 3), False, 0.25)
    assert torch.equal(moved, expected) and not torch.equal(moved, seen_all)
    assert torch.equal(attend(later), moved)

"""The rowwise layout: fp32 products in the package's AVX-512 kernel, each decoder layer
in the fused layer's two calls around row-wise attention. Each row's product is its
output alone, bitwise, for any number of rows and threads, and it is the product of
the weights; the Llama step runs it and stays close to the stock layout.

Greedy exactness against ``generate`` with every forward in this layout is checked in
``test_exactness.py`` (and per batched row in ``test_batched_engine.py``)."""

from __future__ import annotations

import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag.engine.costs.curve_cache import curve_key
from ngram_trie_rag.engine.cpu import rowwise_linear
from ngram_trie_rag.engine.cpu.forward import forward
from ngram_trie_rag.engine.cpu.llama_step import LlamaStep
from ngram_trie_rag.engine.kv_cache import cache_kwargs, new_cache
from ngram_trie_rag.engine.quant import fused_layer, w8a32

if not w8a32.supported_cpu():
    pytest.skip("the CPU has no AVX-512: the rowwise layout is not offered",
                allow_module_level=True)

# (out, in): the default model's q, k/v, gate, down projections and lm_head, widths that
# leave a partial 16-wide chunk, and fewer outputs than one block of them
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (100, 200),
          (7, 70), (3, 5)]


@pytest.fixture(scope="module")
def product() -> rowwise_linear.Product:
    kernel = rowwise_linear.kernel()
    assert kernel is not None, "the CPU has AVX-512 but the kernel did not build"
    return kernel


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_each_row_is_its_output_alone_for_any_row_count(product, out_features: int,
                                                        in_features: int) -> None:
    torch.manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features) / in_features ** 0.5
    x = torch.randn(40, in_features)
    alone = torch.cat([product(x[i:i + 1], weight) for i in range(40)])
    for rows in (*range(1, 18), 24, 33, 40):  # every block size, and more than one block
        assert torch.equal(product(x[:rows], weight), alone[:rows]), rows
    exact = x.double() @ weight.double().t()  # fp64's, within the fp32 sum's error
    assert torch.allclose(alone.double(), exact, rtol=1e-5, atol=1e-5)


def test_threads_do_not_change_the_bits(product) -> None:
    weight = torch.randn(1536, 576)
    x = torch.randn(5, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, weight)
        torch.set_num_threads(2)
        two = product(x, weight)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_the_layouts_product_takes_any_leading_shape_and_strides() -> None:
    weight = torch.randn(96, 80)
    x = torch.randn(2, 3, 160)[..., ::2]  # (B, Q, in), not contiguous
    got = rowwise_linear.rowwise_product(x, weight)
    assert got.shape == (2, 3, 96)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight), rtol=1e-5,
                               atol=1e-5)


def test_offered_for_fp32_models_only() -> None:
    model, _ = tiny_llama(seed=1)
    assert rowwise_linear.applies(model)
    assert not rowwise_linear.applies(model.to(torch.bfloat16))


def test_not_offered_without_the_kernel(no_compiler, caplog) -> None:
    """Nor is a curve that names it: a process without the kernel has its own curves."""
    model, _ = tiny_llama(seed=1)
    step = LlamaStep(model)
    assert curve_key(model, step)[-1] == "rowwise-layout"
    no_compiler(rowwise_linear)
    with caplog.at_level("WARNING"):
        assert not rowwise_linear.applies(model)
    assert "fp32 few-row product kernel is not available" in caplog.text
    assert "no-such-c++" in caplog.text
    assert curve_key(model, step)[-1] is None


@pytest.mark.parametrize("q", [1, 4, 9, fused_layer.MAX_ROWS + 2])
def test_the_llama_step_in_this_layout_is_close_to_stock(q: int) -> None:
    """Up to the fused layer's rows each layer is its two C++ calls around row-wise
    attention; past them the modules' operations with this layout's products."""
    model, _ = tiny_llama(seed=2)
    step = LlamaStep(model)
    assert step._fused("rowwise") and not step._fused("stock")
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, 40 + q), generator=torch.Generator().manual_seed(q))
    logits = {}
    for layout in ("stock", "rowwise"):
        cache = new_cache()
        with torch.inference_mode():
            model(input_ids=ids[:, :40], **cache_kwargs(model, cache), use_cache=True)
            if q == 1:
                pos, mask = torch.tensor([[40]]), None
            else:  # a chain over the q new tokens, as a causal mask after the prefix
                pos = torch.arange(40, 40 + q)[None]
                mask = torch.zeros(1, 1, q, 40 + q)
                mask[..., 40:] = torch.triu(torch.full((q, q), float("-inf")), 1)
            logits[layout] = forward(model, step, ids[:, 40:], pos, mask, cache, layout,
                                     False)
    torch.testing.assert_close(logits["rowwise"], logits["stock"], rtol=1e-4, atol=1e-4)
    assert torch.equal(logits["rowwise"].argmax(-1), logits["stock"].argmax(-1))


def test_a_fused_fp32_layers_rows_are_apart_and_close_to_its_modules() -> None:
    """The layer over its own q/k/v and gate/up weights as parts (each a few tasks of
    the parts' loop): every row bitwise its output alone, and the modules' output within
    fp32 rounding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=640,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    layer = LlamaStep(model)._fused("rowwise")[0]
    rows = 7
    h = torch.randn(1, rows, 256)
    cos, sin = model.model.rotary_emb(h, torch.arange(rows)[None])
    q, k, v = layer.attention_inputs(h, cos, sin)  # (1, H, Q, D), (1, H_kv, Q, D) x 2
    a = torch.randn(1, rows, 256)
    out = layer.rest(h, a)
    for i in range(rows):
        alone = layer.attention_inputs(h[:, i:i + 1], cos[:, i:i + 1], sin[:, i:i + 1])
        for both, one in zip((q, k, v), alone, strict=True):
            assert torch.equal(both[:, :, i:i + 1], one)
        assert torch.equal(out[:, i:i + 1], layer.rest(h[:, i:i + 1], a[:, i:i + 1]))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    x = model.model.layers[0].input_layernorm(h)
    want_k = attn.k_proj(x).view(1, rows, 2, 64).transpose(1, 2)
    rotated = torch.cat((-want_k[..., 32:], want_k[..., :32]), -1)  # rotate-half
    want_k = want_k * cos[:, None] + rotated * sin[:, None]
    torch.testing.assert_close(k, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, attn.v_proj(x).view(1, rows, 2, 64).transpose(1, 2),
                               rtol=1e-5, atol=1e-5)
    mid = h + attn.o_proj(a)
    want = mid + mlp(model.model.layers[0].post_attention_layernorm(mid))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

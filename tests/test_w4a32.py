"""The int4 fp32-activation kernel: each row's output is its output alone, bitwise, for
any number of rows and threads, and it is the product of the weights it holds.

Greedy exactness of int4 fp32 models, whose int4 layers run in this kernel where it is
built, is checked end to end in ``test_quantization.py``; this file checks the kernel.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ngram_trie_rag.engine import static_engine
from ngram_trie_rag.engine.costs.curve_cache import curve_key
from ngram_trie_rag.engine.quant import quantize_model, w4a32
from ngram_trie_rag.engine.quant.apply import SUMMARY
from ngram_trie_rag.engine.quant.linear import Int4Fp32Linear, Int4Linear, fuse

if w4a32.kernel() is None:
    pytest.skip("no AVX-512 (or no compiler): int4 layers take bf16 activations",
                allow_module_level=True)

# (out, in): the default model's stacked q/k/v, gate/up and down projections, and fewer
# outputs than one block of them
SHAPES = [(960, 576), (3072, 576), (576, 1536), (100, 64), (7, 32), (3, 96)]


@pytest.fixture(scope="module")
def product() -> w4a32.Product:
    kernel = w4a32.kernel()
    assert kernel is not None
    return kernel


def _layer(out_features: int, in_features: int, seed: int) -> Int4Fp32Linear:
    torch.manual_seed(seed)
    return Int4Fp32Linear.quantize(nn.Linear(in_features, out_features, bias=False))


def _weights(layer: Int4Fp32Linear) -> torch.Tensor:
    """The (N, K) weights the layer holds, in fp64: q * s + b."""
    q = w4a32.unpack(layer.qweight).double()
    n, k = q.shape
    s, b = layer.pairs[..., 0].double(), layer.pairs[..., 1].double()
    return (q.view(n, -1, w4a32.GROUP) * s[..., None] + b[..., None]).view(n, k)


def test_the_layout_round_trips_and_the_weights_are_near_the_float_ones() -> None:
    q = torch.randint(0, 16, (5, 96), dtype=torch.uint8)
    assert torch.equal(w4a32.unpack(w4a32.pack(q)), q)
    torch.manual_seed(0)
    linear = nn.Linear(128, 16, bias=False)
    layer = Int4Fp32Linear.quantize(linear)
    step = layer.pairs[..., 0].repeat_interleave(w4a32.GROUP, dim=1)  # (N, K) scales
    error = (_weights(layer) - linear.weight.double()).abs()
    assert (error <= step.double() / 2 + 1e-6).all()  # rounded to the nearest of 16 levels


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_each_row_is_its_output_alone_for_any_row_count(product, out_features: int,
                                                        in_features: int) -> None:
    layer = _layer(out_features, in_features, seed=out_features)
    x = torch.randn(40, in_features)
    alone = torch.cat([product(x[i:i + 1], layer.qweight, layer.pairs) for i in range(40)])
    for rows in (*range(1, 18), 24, 40):  # every block size, and more than one block
        assert torch.equal(product(x[:rows], layer.qweight, layer.pairs), alone[:rows]), rows
    exact = x.double() @ _weights(layer).t()
    assert torch.allclose(alone.double(), exact, rtol=1e-5, atol=1e-4)


def test_a_prompts_longer_products_take_the_dense_fp32_product(product) -> None:
    layer = _layer(5000, 96, seed=3)  # more outputs than one dequantized slab
    x = torch.randn(w4a32.MAX_ROWS + 40, 96)
    dense = layer(x)
    assert torch.allclose(dense, product(x, layer.qweight, layer.pairs), rtol=1e-5, atol=1e-4)
    few = x[:w4a32.MAX_ROWS]
    assert torch.equal(layer(few), product(few, layer.qweight, layer.pairs))


@pytest.mark.skipif(static_engine.cpp_compiler() is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_a_compiled_graph_keeps_the_kernel_whole() -> None:
    layer = _layer(96, 64, seed=4)
    x = torch.randn(3, 64)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), layer(x))


def test_threads_do_not_change_the_bits(product) -> None:
    layer = _layer(3072, 576, seed=1)
    x = torch.randn(5, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, layer.qweight, layer.pairs)
        torch.set_num_threads(2)
        two = product(x, layer.qweight, layer.pairs)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_stacked_layers_give_the_parts_bits() -> None:
    parts = [_layer(n, 576, seed=n) for n in (576, 192, 192)]
    x = torch.randn(9, 576)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse(parts)
    assert type(fused) is Int4Fp32Linear
    assert torch.equal(fused(x), separate)
    assert torch.equal(torch.cat([p(x) for p in parts], dim=-1), separate)  # views


def test_an_fp32_model_takes_it_and_a_bf16_model_does_not() -> None:
    def model() -> nn.Module:
        from model_families import FAMILIES, build

        return build(FAMILIES["llama-rope-llama3"])

    fp32 = quantize_model(model(), "int4")
    assert any(type(m) is Int4Fp32Linear for m in fp32.modules())
    assert not any(type(m) is Int4Linear for m in fp32.modules())
    assert getattr(fp32, SUMMARY)["activations"] == "torch.float32"
    assert curve_key(fp32, None)[-1] == "int4+w4a32+rowwise+fused"
    bf16 = quantize_model(model().to(torch.bfloat16), "int4")
    assert not any(type(m) is Int4Fp32Linear for m in bf16.modules())
    assert curve_key(bf16, None)[-1] == "int4"


def test_a_missing_compiler_warns_and_leaves_bf16_activations(no_compiler, caplog) -> None:
    from model_families import FAMILIES, build

    no_compiler(w4a32)
    with caplog.at_level("WARNING", logger=w4a32.__name__):
        model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int4")
    assert "no C++ compiler 'no-such-c++' on PATH" in caplog.text
    assert not any(type(m) is Int4Fp32Linear for m in model.modules())
    assert getattr(model, SUMMARY)["activations"] == "torch.bfloat16"

"""The int8 fp32-activation kernel: each row's output is its output alone, bitwise, for
any number of rows and threads, and it is the product of the quantized weights.

Greedy exactness of int8 fp32 models, whose layers all run in this kernel where it is
built, is checked end to end in ``test_quantization.py``; this file checks the kernel.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ngram_trie_rag.engine import static_engine
from ngram_trie_rag.engine.costs.curve_cache import curve_key
from ngram_trie_rag.engine.quant import attention, quantize_model, w8a32
from ngram_trie_rag.engine.quant.apply import SUMMARY
from ngram_trie_rag.engine.quant.linear import Int8Fp32Linear, Int8Linear, fuse

if not w8a32.supported_cpu():
    pytest.skip("the CPU has no AVX-512: int8 layers take bf16 activations",
                allow_module_level=True)

# (out, in): the default model's stacked q/k/v, gate/up and down projections, widths
# that leave a partial 16-wide chunk, and fewer outputs than one block of them
SHAPES = [(960, 576), (3072, 576), (576, 1536), (100, 200), (7, 70), (3, 5)]


@pytest.fixture(scope="module")
def product() -> w8a32.Product:
    kernel = w8a32.kernel()
    assert kernel is not None, "the CPU has AVX-512 but the kernel did not build"
    return kernel


def _layer(out_features: int, in_features: int, seed: int) -> Int8Fp32Linear:
    torch.manual_seed(seed)
    return Int8Fp32Linear.quantize(nn.Linear(in_features, out_features, bias=False))


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_each_row_is_its_output_alone_for_any_row_count(product, out_features: int,
                                                        in_features: int) -> None:
    layer = _layer(out_features, in_features, seed=out_features)
    x = torch.randn(40, in_features)
    alone = torch.cat([product(x[i:i + 1], layer.qweight, layer.scale) for i in range(40)])
    for rows in (*range(1, 18), 24, 40):  # every block size, and more than one block
        assert torch.equal(product(x[:rows], layer.qweight, layer.scale), alone[:rows]), rows
    # the product of the weights it holds, in fp32 (fp64's within the fp32 sum's error)
    exact = x.double() @ (layer.qweight.double() * layer.scale.double()[:, None]).t()
    assert torch.allclose(alone.double(), exact, rtol=1e-5, atol=1e-5)


def test_a_prompts_longer_products_take_the_dense_fp32_product(product) -> None:
    """Past MAX_ROWS rows the layer multiplies by its weights dequantized (BLAS's fp32
    product, faster for a prompt): the same product within fp32's rounding, and the
    kernel's bits up to MAX_ROWS."""
    layer = _layer(5000, 96, seed=3)  # more outputs than one dequantized slab
    x = torch.randn(w8a32.MAX_ROWS + 40, 96)
    dense = layer(x)
    assert torch.allclose(dense, product(x, layer.qweight, layer.scale), rtol=1e-5, atol=1e-5)
    few = x[:w8a32.MAX_ROWS]
    assert torch.equal(layer(few), product(few, layer.qweight, layer.scale))


@pytest.mark.skipif(static_engine.cpp_compiler() is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_a_compiled_graph_keeps_the_kernel_whole() -> None:
    """Under torch.compile (fullgraph) the layer runs the kernel as one operator, with
    the eager layer's bits."""
    layer = _layer(96, 80, seed=4)
    x = torch.randn(3, 80)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), layer(x))


def test_threads_do_not_change_the_bits(product) -> None:
    layer = _layer(3072, 576, seed=1)
    x = torch.randn(5, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, layer.qweight, layer.scale)
        torch.set_num_threads(2)
        two = product(x, layer.qweight, layer.scale)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_not_finite_inputs_give_what_fp32_gives(product) -> None:
    layer = _layer(48, 64, seed=2)
    x = torch.randn(3, 64)
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    y = product(x, layer.qweight, layer.scale)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()
    # inf times the column's weights: +-inf where the weight is nonzero, nan where it is 0
    column = layer.qweight[:, 7]
    assert torch.equal(torch.isinf(y[2]), column != 0)


def test_stacked_layers_give_the_parts_bits() -> None:
    parts = [_layer(n, 576, seed=n) for n in (576, 192, 192)]
    x = torch.randn(9, 576)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse(parts)
    assert type(fused) is Int8Fp32Linear
    assert torch.equal(fused(x), separate)
    assert torch.equal(torch.cat([p(x) for p in parts], dim=-1), separate)  # views


def test_an_fp32_model_takes_it_and_a_bf16_model_does_not() -> None:
    def model() -> nn.Module:
        from model_families import FAMILIES, build

        return build(FAMILIES["llama-rope-llama3"])

    fp32 = quantize_model(model(), "int8")
    layers = [m for m in fp32.modules() if isinstance(m, Int8Linear)]
    assert layers and all(type(m) is Int8Fp32Linear for m in layers)
    assert getattr(fp32, SUMMARY)["activations"] == "torch.float32"
    bf16 = quantize_model(model().to(torch.bfloat16), "int8")
    assert all(type(m) is Int8Linear for m in bf16.modules() if isinstance(m, Int8Linear))
    assert getattr(bf16, SUMMARY)["activations"] == "torch.bfloat16"
    # each prices its own steps: the latency curves are kept apart
    assert curve_key(fp32, None)[-1] == "int8+w8a32+rowwise+fused"
    assert curve_key(bf16, None)[-1] == "int8"
    # the fp32 model attends row-wise in fp32 (test_rowwise_attention.py), the bf16 one
    # in fp64
    assert attention.rowwise(fp32) and attention.reads_fp64(bf16)


def test_a_missing_compiler_warns_and_leaves_bf16_activations(no_compiler, caplog) -> None:
    from model_families import FAMILIES, build

    no_compiler(w8a32)
    with caplog.at_level("WARNING", logger=w8a32.__name__):
        model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int8")
    assert "no C++ compiler 'no-such-c++' on PATH" in caplog.text
    assert all(type(m) is Int8Linear for m in model.modules() if isinstance(m, Int8Linear))


def test_it_compiles_once_into_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(w8a32, "_KERNEL", [])
    assert w8a32.kernel() is not None
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].name.startswith("w8a32_avx512_")
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(w8a32, "_KERNEL", [])
    assert w8a32.kernel() is not None  # a second process: loaded, not compiled again
    assert built[0].stat().st_mtime_ns == stamp

"""The w8a8 VNNI kernel gives the bits of the Python w8a8 product, on any rows it takes.

Greedy exactness of w8a8 models, whose decode steps run in this kernel where it is built,
is checked end to end in ``test_quantization.py``; this file checks the kernel itself
against :func:`~ngram_trie_rag.engine.quant.kernels.int8_dynamic_product` without
``comp`` (the oneDNN product and tensor operations), bitwise.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ngram_trie_rag.engine.quant import kernels, vnni
from ngram_trie_rag.engine.quant.linear import Int8DynamicLinear

if not vnni.supported_cpu():
    pytest.skip("the CPU has no AVX512-VNNI: w8a8 products run through torch._int_mm",
                allow_module_level=True)

# (out, in): the default model's stacked q/k/v, gate/up and down projections, lm_head's
# width, and widths that leave a partial 64-byte chunk or fewer outputs than one block
SHAPES = [(960, 576), (3072, 576), (576, 1536), (4096, 576), (100, 200), (7, 70), (3, 64)]


@pytest.fixture(scope="module")
def product() -> vnni.Product:
    kernel = vnni.kernel()
    assert kernel is not None, "the CPU has AVX512-VNNI but the kernel did not build"
    return kernel


def _layer(out_features: int, in_features: int, seed: int) -> Int8DynamicLinear:
    torch.manual_seed(seed)
    return Int8DynamicLinear.quantize(nn.Linear(in_features, out_features, bias=False))


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_every_row_count_gives_the_python_path_bits(product, out_features: int,
                                                    in_features: int) -> None:
    layer = _layer(out_features, in_features, seed=out_features)
    for rows in range(1, vnni.MAX_ROWS + 3):  # past MAX_ROWS too: the kernel takes any
        # rows of very different scales, one all zero (its step is the 1e-12 floor)
        x = torch.randn(rows, in_features) * torch.logspace(-3, 3, rows)[:, None]
        x[rows // 2] = 0
        ours = product(x, layer.qweight, layer.scale, layer.comp)
        assert torch.equal(ours, kernels.int8_dynamic_product(x, layer.qweight, layer.scale))


def test_rounding_ties_and_the_extremes_match(product) -> None:
    """Values that round half-way (x / step = k + 0.5 exactly) go to the even integer, as
    ``torch.round`` does; the row's largest value maps to +-127."""
    layer = _layer(64, 128, seed=1)
    step = 0.25
    x = torch.arange(-127, 129, dtype=torch.float32)[:128].mul(step).reshape(1, 128)
    x[0, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5]) * step
    x[0, 8] = 127 * step  # the absmax: step is exactly 0.25
    ours = product(x, layer.qweight, layer.scale, layer.comp)
    assert torch.equal(ours, kernels.int8_dynamic_product(x, layer.qweight, layer.scale))


def test_a_row_that_is_not_finite_is_left_to_the_python_path(product) -> None:
    layer = _layer(64, 128, seed=2)
    x = torch.randn(2, 128)
    x[1, 5] = float("nan")
    assert product(x, layer.qweight, layer.scale, layer.comp).numel() == 0
    got = layer(x)  # the layer falls back: NaN where the operations give NaN
    assert torch.equal(got[0], kernels.int8_dynamic_product(x, layer.qweight, layer.scale)[0])
    assert got[1].isnan().all()


def test_the_layer_sends_few_rows_to_the_kernel_and_many_to_onednn(monkeypatch) -> None:
    layer = _layer(128, 256, seed=3)
    calls: list[int] = []
    real = vnni.kernel()

    def counting(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(vnni, "_KERNEL", [counting])
    for rows in (1, vnni.MAX_ROWS, vnni.MAX_ROWS + 1, 300):
        layer(torch.randn(rows, 256))
    assert calls == [1, vnni.MAX_ROWS]


def test_threads_do_not_change_the_bits(product) -> None:
    layer = _layer(3072, 576, seed=4)
    x = torch.randn(5, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = product(x, layer.qweight, layer.scale, layer.comp)
        torch.set_num_threads(2)
        two = product(x, layer.qweight, layer.scale, layer.comp)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_a_missing_compiler_warns_and_leaves_the_python_path(no_compiler, caplog) -> None:
    no_compiler(vnni)
    with caplog.at_level("WARNING", logger=vnni.__name__):
        assert vnni.kernel() is None
    assert "no C++ compiler 'no-such-c++' on PATH" in caplog.text
    layer = _layer(64, 128, seed=5)
    x = torch.randn(3, 128)
    assert torch.equal(layer(x), kernels.int8_dynamic_product(x, layer.qweight, layer.scale))


def test_it_compiles_once_into_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(vnni, "_KERNEL", [])
    assert vnni.kernel() is not None
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"  # no temporary left beside it
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(vnni, "_KERNEL", [])
    assert vnni.kernel() is not None  # a second process: loaded, not compiled again
    assert built[0].stat().st_mtime_ns == stamp


def test_a_damaged_cached_build_is_compiled_again(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(vnni, "_KERNEL", [])
    monkeypatch.delenv("CXX", raising=False)
    damaged = vnni.library_path("c++")
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"\x7fELF cut short")  # as a build cut off by a crash would leave it
    with caplog.at_level("WARNING", logger=vnni.__name__):
        product = vnni.kernel()
    assert product is not None and "does not load" in caplog.text
    layer = _layer(64, 128, seed=6)
    x = torch.randn(2, 128)
    assert torch.equal(product(x, layer.qweight, layer.scale, layer.comp),
                       kernels.int8_dynamic_product(x, layer.qweight, layer.scale))

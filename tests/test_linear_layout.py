"""The transposed linear layout and the buffered KV cache: same results, restored modules."""

from __future__ import annotations

import threading

import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag.engine.costs.latency import LatencyCurve
from ngram_trie_rag.engine.cpu import linear_layout
from ngram_trie_rag.engine.kv_cache import MIN_SLACK, BufferLayer, cache_kwargs, compact, new_cache
from ngram_trie_rag.reference import greedy_reference


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_linear_matches_nn_linear(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=bias)
    x = torch.randn(1, rows, 64)
    expected = layer(x)
    got = linear_layout.linear_transposed(layer, x)
    assert got.shape == expected.shape == (1, rows, 48)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_layout_switches_only_inside_and_only_in_this_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = tiny_llama(seed=4, vocab_size=32)
    prompt = [5, 6, 7, 8, 9]
    reference = greedy_reference(model, prompt, 6)  # before install: nn.Linear's forward
    calls: list[torch.nn.Linear] = []
    real = linear_layout.linear_transposed

    def spy(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        calls.append(layer)
        return real(layer, x)

    monkeypatch.setattr(linear_layout, "linear_transposed", spy)
    linear_layout.install(model)
    linear_layout.install(model)  # idempotent
    assert linear_layout.installed(model) and linear_layout.applies(model)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert model.lm_head in linears

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]))

    forward()
    assert calls == []  # installed, but outside transposed: F.linear
    with pytest.raises(RuntimeError), linear_layout.transposed(True):
        forward()
        assert set(calls) == set(linears)  # every plain linear layer, transposed
        calls.clear()
        other = threading.Thread(target=forward)  # another thread: stock
        other.start()
        other.join()
        assert calls == []
        raise RuntimeError("a forward failed")
    forward()  # the switch was reset by the failure
    with linear_layout.transposed(False):
        forward()
    assert calls == []
    assert greedy_reference(model, prompt, 6) == reference  # generate runs as shipped
    assert calls == []


def test_transposed_forward_gives_the_same_greedy_tokens(generator) -> None:
    model = generator.model
    linear_layout.install(model)  # stock outside ``transposed``: harmless to share
    ids = torch.tensor([generator.encode_prompt("The capital of France is Paris. The capital")])
    with torch.inference_mode():
        stock = model(input_ids=ids).logits
        with linear_layout.transposed(True):
            fast = model(input_ids=ids).logits
    torch.testing.assert_close(fast, stock, rtol=1e-4, atol=1e-4)
    assert torch.equal(fast.argmax(-1), stock.argmax(-1))


def test_layout_choice_per_forward_size() -> None:
    curve = LatencyCurve({1: 0.03, 2: 0.05, 5: 0.06, 9: 0.08},
                         {1: "transposed", 5: "transposed", 9: "prepacked"})
    assert curve.layout(1) == "transposed"
    assert curve.layout(2) == "stock"
    assert curve.layout(4) == "stock"  # the nearest measured size below decides
    assert curve.layout(5) == curve.layout(8) == "transposed"
    assert curve.layout(9) == "prepacked"
    assert curve.layout(700) == "stock"  # past the curve (a prefill): never another


def test_buffer_cache_matches_dynamic_cache_and_compacts(generator) -> None:
    from transformers import DynamicCache

    model = generator.model
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, model.config.vocab_size, (1, 40), generator=gen)
    block = torch.randint(0, model.config.vocab_size, (1, 5), generator=gen)
    pos = torch.arange(40, 45)[None]
    with torch.inference_mode():
        ref, buf = DynamicCache(), new_cache()
        for cache in (ref, buf):
            model(input_ids=prefix, **cache_kwargs(model, cache), use_cache=True)
            model(input_ids=block, position_ids=pos, **cache_kwargs(model, cache), use_cache=True)
        assert all(isinstance(layer, BufferLayer) for layer in buf.layers)
        for a, b in zip(ref.layers, buf.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        kept = ref.layers[0].keys[:, :, [40, 42, 44]].clone()
        compact(buf, 40, [0, 2, 4])
        layer = buf.layers[0]
        assert buf.get_seq_length() == 43
        assert torch.equal(layer.keys[:, :, 40:], kept)
        # The next forward writes after the kept rows, into the same buffer: the live
        # view keeps its storage and grows by one position, the rows before it untouched.
        before = layer.keys.clone()
        start = layer.keys.data_ptr()
        model(input_ids=block[:, :1], position_ids=torch.tensor([[43]]), **cache_kwargs(model, buf),
              use_cache=True)
        assert buf.get_seq_length() == 44
        assert layer.keys.data_ptr() == start
        assert torch.equal(layer.keys[:, :, :43], before)


def test_buffer_cache_grows_past_its_capacity() -> None:
    layer = BufferLayer()
    k = torch.randn(1, 2, 300, 4)
    layer.update(k, k + 1)
    start = layer.keys.data_ptr()
    # More than the first buffer has left: it doubles, with at least MIN_SLACK to spare.
    more = torch.randn(1, 2, 300 + 2 * MIN_SLACK, 4)
    keys, values = layer.update(more, more + 1)
    assert keys.data_ptr() != start  # a new, larger buffer
    assert keys.shape[-2] == 300 + more.shape[-2]
    assert torch.equal(keys[:, :, :300], k) and torch.equal(keys[:, :, 300:], more)
    assert torch.equal(values, keys + 1)

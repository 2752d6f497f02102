"""Masked GQA without repeat_kv: bitwise the same logits as Transformers' SDPA path,
switched on only inside ``masked_gqa`` in the calling thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine.cpu import gqa_attention
from ngram_trie_rag.engine.kv_cache import cache_kwargs, new_cache
from ngram_trie_rag.engine.trees.tree_attention import tree_inputs
from ngram_trie_rag.reference import greedy_reference

# A two-branch tree below the last committed token: 5-6-7, 8-9, 5-10-11 style shapes.
TREE = DraftTree(np.array([5, 6, 7, 8, 9, 10, 11]), np.array([-1, 0, 1, -1, 3, 0, 5]),
                 np.array([1, 2, 3, 1, 2, 2, 3]), np.ones(7, dtype=np.int64), 1)


def _installed(dtype: torch.dtype) -> torch.nn.Module:
    """The packaged model, loaded for this module alone: installing the gated attention
    changes the model's configured attention, which no other module's model should see."""
    from ngram_trie_rag.loading import load_model

    model = load_model(None, dtype=dtype)[0]
    gqa_attention.install(model)
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {"float32": _installed(torch.float32), "bfloat16": _installed(torch.bfloat16)}


def _after_prefix(model, ids: torch.Tensor, packed: bool, single: bool = False,
                  **inputs) -> torch.Tensor:
    """Logits of a forward of ``ids`` after 300 random cached tokens, the packed GQA
    attention on or off."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.config.vocab_size, (1, 300), generator=gen)
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prefix, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
        with gqa_attention.masked_gqa(packed, single=single):
            return model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True,
                         **inputs).logits


def _verify_logits(model, fast: bool) -> torch.Tensor:
    pos, mask = tree_inputs(TREE, 300, model.device, model.dtype)
    ids = torch.tensor([[4, *TREE.tokens.tolist()]], device=model.device)
    return _after_prefix(model, ids, fast, position_ids=pos, attention_mask=mask)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_masked_gqa_is_bitwise_identical(models, dtype) -> None:
    model = models[dtype]
    assert gqa_attention.applies(model)  # the packaged model: 9 query, 3 KV heads
    assert gqa_attention.installed(model)
    assert torch.equal(_verify_logits(model, False), _verify_logits(model, True))


@pytest.fixture
def packed_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every call of the two packed attentions (which then run as usual)."""
    calls: list[str] = []
    for name in ("sdpa_masked_gqa", "sdpa_packed_gqa"):
        real = getattr(gqa_attention, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(gqa_attention, name, spy)
    return calls


def test_packing_switches_only_inside_and_only_in_this_thread(packed_calls) -> None:
    model, _ = tiny_llama(seed=4, vocab_size=32)  # 4 query heads, 2 KV heads
    prompt = [5, 6, 7, 8, 9]
    reference = greedy_reference(model, prompt, 6)  # before install: stock SDPA
    gqa_attention.install(model)
    gqa_attention.install(model)  # idempotent
    assert gqa_attention.installed(model) and gqa_attention.applies(model)
    layers = model.config.num_hidden_layers

    def tree_forward() -> None:
        _verify_logits(model, False)

    tree_forward()
    assert packed_calls == []  # installed, but outside masked_gqa: stock SDPA
    with pytest.raises(RuntimeError), gqa_attention.masked_gqa(True):
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]))  # inside: the packed attention's turn
        assert packed_calls == ["sdpa_masked_gqa"] * layers
        other = threading.Thread(target=tree_forward)  # another thread: stock
        other.start()
        other.join()
        assert packed_calls == ["sdpa_masked_gqa"] * layers
        raise RuntimeError("a forward failed")
    packed_calls.clear()
    tree_forward()  # the switch was reset by the failure
    with gqa_attention.masked_gqa(False):
        tree_forward()
    assert packed_calls == []
    _verify_logits(model, True)
    assert packed_calls == ["sdpa_masked_gqa"] * layers
    packed_calls.clear()
    _step_logits(model, True)
    assert packed_calls == ["sdpa_packed_gqa"] * layers  # single queries packed too
    packed_calls.clear()
    assert greedy_reference(model, prompt, 6) == reference  # generate runs as shipped
    assert packed_calls == []


def test_applies_only_to_sdpa_with_fewer_kv_heads(models) -> None:
    model = models["float32"]
    cfg = model.config
    kv_heads, attention = cfg.num_key_value_heads, cfg._attn_implementation
    try:
        cfg.num_key_value_heads = cfg.num_attention_heads  # plain multi-head attention
        assert not gqa_attention.applies(model)
        cfg.num_key_value_heads = kv_heads
        cfg._attn_implementation = "eager"
        assert not gqa_attention.applies(model)
    finally:
        cfg.num_key_value_heads = kv_heads
        cfg._attn_implementation = attention
    assert gqa_attention.applies(model)


def _step_logits(model, single: bool) -> torch.Tensor:
    """Logits of a plain decode step (one token, no mask)."""
    return _after_prefix(model, torch.tensor([[4]]), single, single=single,
                         position_ids=torch.tensor([[300]]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_single_query_matches_stock_attention(models, dtype) -> None:
    model = models[dtype]
    stock, packed = _step_logits(model, False), _step_logits(model, True)
    tol = 1e-4 if dtype == "float32" else 0.125  # other kernels: a few bf16 ulps, no more
    torch.testing.assert_close(packed, stock, rtol=tol, atol=tol)
    assert torch.equal(packed.argmax(-1), stock.argmax(-1))

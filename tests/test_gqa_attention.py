"""Masked GQA without repeat_kv: bitwise the same logits as Transformers' SDPA path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ngram_trie_rag import gqa_attention
from ngram_trie_rag.draft_tree import DraftTree
from ngram_trie_rag.kv_cache import cache_kwargs, new_cache
from ngram_trie_rag.tree_attention import tree_inputs

# A two-branch tree below the last committed token: 5-6-7, 8-9, 5-10-11 style shapes.
TREE = DraftTree(np.array([5, 6, 7, 8, 9, 10, 11]), np.array([-1, 0, 1, -1, 3, 0, 5]),
                 np.array([1, 2, 3, 1, 2, 2, 3]), np.ones(7, dtype=np.int64), 1)


def _after_prefix(model, ids: torch.Tensor, packed: bool, single: bool = False,
                  **inputs) -> torch.Tensor:
    """Logits of a forward of ``ids`` after 300 random cached tokens, the packed GQA
    attention on or off."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.config.vocab_size, (1, 300), generator=gen)
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prefix, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
        with gqa_attention.masked_gqa(model, packed, single=single):
            return model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True,
                         **inputs).logits


def _verify_logits(model, fast: bool) -> torch.Tensor:
    pos, mask = tree_inputs(TREE, 300, model.device, model.dtype)
    ids = torch.tensor([[4, *TREE.tokens.tolist()]], device=model.device)
    return _after_prefix(model, ids, fast, position_ids=pos, attention_mask=mask)


@pytest.fixture(scope="module")
def bf16_model():
    from ngram_trie_rag.loading import load_model

    return load_model(None, dtype=torch.bfloat16)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_masked_gqa_is_bitwise_identical(generator, bf16_model, dtype) -> None:
    model = generator.model if dtype == "float32" else bf16_model
    assert gqa_attention.applies(model)  # the packaged model: 9 query, 3 KV heads
    assert torch.equal(_verify_logits(model, False), _verify_logits(model, True))


def test_configured_attention_is_restored(generator) -> None:
    cfg = generator.model.config
    with pytest.raises(RuntimeError), gqa_attention.masked_gqa(generator.model, True):
        assert cfg._attn_implementation == gqa_attention.NAME
        used = ALL_ATTENTION_FUNCTIONS.get_interface(cfg._attn_implementation, None)
        assert used is gqa_attention.sdpa_masked_gqa  # what the attention layers call
        raise RuntimeError("a forward failed")
    assert cfg._attn_implementation == "sdpa"
    with gqa_attention.masked_gqa(generator.model, False):
        assert cfg._attn_implementation == "sdpa"


def test_applies_only_to_sdpa_with_fewer_kv_heads(generator) -> None:
    cfg = generator.model.config
    kv_heads = cfg.num_key_value_heads
    try:
        cfg.num_key_value_heads = cfg.num_attention_heads  # plain multi-head attention
        assert not gqa_attention.applies(generator.model)
        cfg.num_key_value_heads = kv_heads
        cfg._attn_implementation = "eager"
        assert not gqa_attention.applies(generator.model)
    finally:
        cfg.num_key_value_heads = kv_heads
        cfg._attn_implementation = "sdpa"
    assert gqa_attention.applies(generator.model)


def _step_logits(model, single: bool) -> torch.Tensor:
    """Logits of a plain decode step (one token, no mask)."""
    return _after_prefix(model, torch.tensor([[4]]), single, single=single,
                         position_ids=torch.tensor([[300]]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_single_query_matches_stock_attention(generator, bf16_model, dtype) -> None:
    model = generator.model if dtype == "float32" else bf16_model
    stock, packed = _step_logits(model, False), _step_logits(model, True)
    tol = 1e-4 if dtype == "float32" else 0.125  # other kernels: a few bf16 ulps, no more
    torch.testing.assert_close(packed, stock, rtol=tol, atol=tol)
    assert torch.equal(packed.argmax(-1), stock.argmax(-1))
    cfg = model.config
    with gqa_attention.masked_gqa(model, True, single=True):
        used = ALL_ATTENTION_FUNCTIONS.get_interface(cfg._attn_implementation, None)
        assert used is gqa_attention.sdpa_packed_gqa
    assert cfg._attn_implementation == "sdpa"

"""The architecture matrix: every family the engine claims, greedy output token-identical
to ``generate(do_sample=False)``.

Tiny random models (``model_families``), prompts of 400 tokens: six windows past the
64-token sliding window of the families that have one, so a draft node's window starts
inside the committed prefix and the tree mask must move it with the node. The drafting
documents hold the model's own greedy answer and corrupted copies of it, so drafts are
accepted (asserted) and trees branch; no download, under a second per family.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from model_families import (
    FAMILIES,
    WINDOW,
    accepted,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
)
from transformers.masking_utils import sliding_window_causal_mask_function

from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine.trees.tree_attention import tree_inputs
from ngram_trie_rag.reference import greedy_reference

PROMPT = 400
MAX_NEW = 64
NAMES = list(FAMILIES)


@cache
def _case(name: str):
    """(generator, prompt ids, plain greedy answer, drafting documents) per family."""
    model = build(FAMILIES[name])
    ids = random_prompt(PROMPT, seed=1)
    expected = greedy_reference(model, ids, MAX_NEW)
    return pinned_generator(model), ids, expected, drafting_documents(expected)


@pytest.mark.parametrize("name", NAMES)
def test_trie_and_chain_greedy_equal_generate(name: str) -> None:
    gen, ids, expected, docs = _case(name)
    assert gen.engine.sliding_window == FAMILIES[name].window
    for method in ("trie", "chain"):
        result = gen.generate(ids, documents=docs, max_new_tokens=MAX_NEW, method=method,
                              num_draft=8)
        assert result.token_ids == expected, method
        assert accepted(result) > 0, method  # the tree path really ran
        assert max(result.stats.draft_sizes) > 1, method


@pytest.mark.parametrize("name", NAMES)
def test_streamed_text_is_the_generated_text(name: str) -> None:
    gen, ids, expected, docs = _case(name)
    stream = gen.stream(ids, documents=docs, max_new_tokens=MAX_NEW, num_draft=8)
    text = "".join(stream)
    assert stream.result is not None and stream.result.token_ids == expected
    assert text == stream.result.text == gen.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("name", NAMES)
def test_seeded_sampling_is_reproducible(name: str) -> None:
    gen, ids, _, docs = _case(name)
    runs = [gen.generate(ids, documents=docs, max_new_tokens=32, temperature=0.8,
                         top_k=20, seed=seed, num_draft=8).token_ids for seed in (7, 7)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("past_len", [10, 200])
def test_sliding_mask_is_transformers_window_at_each_node(past_len: int) -> None:
    """A chain draft is a causal block: its sliding mask must be Transformers' own mask
    for the same positions (``p - window < k <= p``)."""
    gen, *_ = _case("mistral-window")
    tree = DraftTree.chain([5, 6, 7, 8])
    _, mask = tree_inputs(tree, past_len, gen.model.device, gen.model.dtype,
                          gen.engine.windows)
    q = np.arange(past_len, past_len + 5)[:, None]
    k = np.arange(past_len + 5)[None, :]
    visible = sliding_window_causal_mask_function(WINDOW)
    expected = visible(0, 0, torch.as_tensor(q), torch.as_tensor(k)).numpy()  # (5, S)
    assert np.array_equal(mask[0, 0].numpy() == 0, expected)


def test_per_layer_windows_get_a_mask_each() -> None:
    """Gemma 3 and windowed Qwen2 mix full and sliding layers: a dict keyed by layer
    type. One window for every layer (Mistral, Phi-3): one mask."""
    tree = DraftTree.chain([5, 6])
    for name, keys in [("gemma3", {"full_attention", "sliding_attention"}),
                       ("qwen2-window", {"full_attention", "sliding_attention"})]:
        gen, *_ = _case(name)
        _, mask = tree_inputs(tree, 100, gen.model.device, gen.model.dtype, gen.engine.windows)
        assert set(mask) == keys
        assert (mask["sliding_attention"] != 0).sum() > (mask["full_attention"] != 0).sum()
    for name in ("mistral-window", "phi3-window"):
        gen, *_ = _case(name)
        _, mask = tree_inputs(tree, 100, gen.model.device, gen.model.dtype, gen.engine.windows)
        assert not isinstance(mask, dict) and (mask[0, 0, 0] == 0).sum() == WINDOW

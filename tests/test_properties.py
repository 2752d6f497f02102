"""Exactness as a property: random tiny models, documents, n, L_p and budgets, plus
pathological drafts injected through custom proposers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_model import tiny_llama

from ngram_trie_rag import DraftTree, SpeculativeGenerator
from ngram_trie_rag.drafting.proposers import PROPOSERS
from ngram_trie_rag.reference import greedy_reference

# Seeds whose greedy answers run long before EOS (token 1), so drafts get exercised.
MODELS = {i: tiny_llama(seed=seed, vocab_size=24, init_scale=0.6 if seed == 3 else 0.4)
          for i, seed in enumerate((3, 11, 13, 19))}


tokens = st.lists(st.integers(2, 23), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 3), prompt=tokens, docs=st.lists(tokens, max_size=3),
       n=st.integers(2, 16), data=st.data(), max_new=st.integers(1, 40),
       num_draft=st.one_of(st.none(), st.integers(1, 80)), method=st.sampled_from(
           ["trie", "chain"]))
def test_random_models_and_settings_are_exact(seed, prompt, docs, n, data, max_new, num_draft,
                                              method) -> None:
    model, tokenizer = MODELS[seed]
    prefix_len = data.draw(st.integers(1, n - 1))
    gen = SpeculativeGenerator(model, tokenizer, n=n, prefix_len=prefix_len,
                               num_draft=num_draft or 16)
    res = gen.generate(prompt, documents=docs or None, max_new_tokens=max_new,
                       num_draft=num_draft, method=method)
    assert res.token_ids == greedy_reference(model, prompt, max_new)


@pytest.fixture
def register(monkeypatch):
    """Install a test drafter under a method name for one test."""
    def add(name: str, proposer) -> str:
        monkeypatch.setitem(PROPOSERS, name, proposer)
        return name
    return add


def _produced(trie, prompt: list[int]) -> int:
    """Answer tokens committed so far: the trie holds the prompt, then the answer."""
    return trie.num_tokens - len(prompt)


@pytest.mark.parametrize("case", ["all_right", "all_wrong", "deep_chain", "wide_tree",
                                  "repeated", "eos_inside", "past_budget"])
def test_pathological_drafts_stay_exact(register, case: str) -> None:
    model, tokenizer = MODELS[3]
    prompt = [5, 6, 7, 8, 9]
    max_new = 30
    truth = greedy_reference(model, prompt, max_new)
    eos = 1

    def proposer(trie, tail, num_draft, max_depth):
        future = truth[_produced(trie, prompt):]
        if case == "all_right":
            return DraftTree.chain(future[:max_depth])
        if case == "all_wrong":
            return DraftTree.chain([(t + 1) % 24 for t in future[:max_depth]])
        if case == "deep_chain":
            return DraftTree.chain((future + [3] * 200)[: min(max_depth, 200)])
        if case == "wide_tree":  # 23 wrong siblings and the right token, each with a child
            toks, parents, depths = [], [], []
            for t in range(24):
                toks += [t, future[1] if len(future) > 1 else 0]
                parents += [-1, len(toks) - 2]
                depths += [1, 2]
            tree = DraftTree(np.array(toks), np.array(parents), np.array(depths))
            return tree if max_depth >= 2 else DraftTree.empty()
        if case == "repeated":
            return DraftTree.chain([future[0]] * max_depth if future else [])
        if case == "eos_inside":
            return DraftTree.chain((future[:2] + [eos, eos] + future[2:])[:max_depth])
        # past_budget: ignores max_depth on purpose; the generator must still stop on time
        return DraftTree.chain(future + [4] * 50)

    assert len(truth) == max_new  # this model does not stop early on this prompt
    name = register(f"test-{case}", proposer)
    gen = SpeculativeGenerator(model, tokenizer, n=6, prefix_len=2)
    res = gen.generate(prompt, max_new_tokens=max_new, method=name, num_draft=64)
    stats = res.stats  # one entry per step, counting only what was emitted
    assert sum(stats.accept_lengths) == len(res.token_ids) - 1
    assert len(stats.draft_sizes) == len(stats.accept_lengths) == stats.steps
    assert sum(stats.draft_sizes) == stats.drafted
    if case == "past_budget":
        assert len(res.token_ids) <= max_new
        assert res.token_ids == truth[: len(res.token_ids)]
        return
    assert res.token_ids == truth
    if case == "all_right":
        assert res.stats.steps <= 2  # everything accepted at once
    if case == "all_wrong":
        assert res.stats.mean_accept_length == 1.0


def test_an_accepted_eos_ends_the_answer_and_its_step(register) -> None:
    """A draft that runs through an end-of-sequence token: the answer stops at it, and
    the step counts only the tokens up to it."""
    model, tokenizer = MODELS[3]
    prompt, max_new = [5, 6, 7, 8, 9], 30
    truth = greedy_reference(model, prompt, max_new)

    def proposer(trie, tail, num_draft, max_depth):
        return DraftTree.chain(truth[_produced(trie, prompt):][:max_depth])

    name = register("test-through-eos", proposer)
    gen = SpeculativeGenerator(model, tokenizer, n=6, prefix_len=2)
    gen.eos_token_ids = frozenset({truth[5]})  # the sixth token now ends the answer
    stop = truth.index(truth[5])  # the first occurrence of that token
    res = gen.generate(prompt, max_new_tokens=max_new, method=name, num_draft=64)
    assert res.token_ids == truth[: stop + 1] and res.finish_reason == "eos"
    assert res.stats.accept_lengths == [stop]  # one step, drafted well past the EOS
    assert res.stats.draft_sizes[0] > stop

"""Sampling through the draft tree preserves the model's distribution (statistical test)."""

from __future__ import annotations

import itertools
import math

import torch
from scipy.stats import chisquare
from tiny_model import tiny_llama

from ngram_trie_rag import SamplingParams, SpeculativeGenerator
from ngram_trie_rag.decoding.sampling import probabilities
from ngram_trie_rag.reference import greedy_reference

PROMPT = [2, 3, 4, 5, 2, 3]
DOCS = [[3, 4, 5, 6, 3, 4, 7], [3, 4, 9, 10]]


def _exact_joint(model, params: SamplingParams, length: int) -> dict[tuple[int, ...], float]:
    """P(t1..t_length | prompt) under the processed distribution, by direct forwards."""
    out: dict[tuple[int, ...], float] = {}
    vocab = model.config.vocab_size

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length or (prefix and prefix[-1] == 1):  # 1 is EOS
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + list(prefix)])).logits[0, -1]
        p = probabilities(logits, params)
        for tok in range(vocab):
            if p[tok] > 1e-6:
                walk(prefix + (tok,), prob * float(p[tok]))

    walk((), 1.0)
    return out


def _chi_square(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= set(exact), "sampled a sequence of probability zero"
    # Pool rare cells so every expected count is >= 5.
    big = [k for k, p in exact.items() if p * n >= 5]
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    expected = [exact[k] * n for k in big] + [n * (1 - sum(exact[k] for k in big))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue)


def test_tree_sampling_matches_model_distribution() -> None:
    model, tokenizer = tiny_llama(seed=3, init_scale=0.6)
    gen = SpeculativeGenerator(model, tokenizer, n=6, prefix_len=2, num_draft=8)
    params = SamplingParams(temperature=0.8, top_k=8)
    length = 3
    exact = _exact_joint(model, params, length)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-4)
    # Draft sources: the prompt's tail followed by the likeliest and the second and third
    # likeliest sequences, so the tree is often (not always) right.
    ranked = sorted(exact, key=exact.get, reverse=True)
    docs = [PROMPT[-2:] + list(seq) for seq in ranked[:3]]
    samples, multi = [], 0
    for seed in range(2500):
        res = gen.generate(PROMPT, documents=docs, max_new_tokens=length, temperature=0.8,
                           num_draft=8,
                           top_k=8, seed=seed)
        samples.append(tuple(res.token_ids))
        multi += any(a > 1 for a in res.stats.accept_lengths)
    assert multi > 100, "drafts were rarely accepted: the test would not exercise the tree"
    assert _chi_square(samples, exact) > 1e-3


def test_seed_makes_sampling_reproducible() -> None:
    model, tokenizer = tiny_llama(seed=1)
    gen = SpeculativeGenerator(model, tokenizer, n=6, prefix_len=2)
    runs = [gen.generate(PROMPT, documents=DOCS, max_new_tokens=12, temperature=1.0, seed=7)
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids


def test_top_p_keeps_the_crossing_token() -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert (p[:2] > 0).all() and (p[2:] == 0).all()
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=1))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_tiny_model_greedy_equals_generate_over_many_prompts() -> None:
    model, tokenizer = tiny_llama(seed=5, init_scale=0.4)
    gen = SpeculativeGenerator(model, tokenizer, n=5, prefix_len=2, num_draft=12)
    for prompt in itertools.islice(itertools.permutations(range(2, 9), 5), 0, 400, 20):
        ids = list(prompt)
        got = gen.generate(ids, documents=[[4, 5, 6, 7, 8], ids[::-1]], max_new_tokens=20)
        assert got.token_ids == greedy_reference(model, ids, 20)

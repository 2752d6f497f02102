"""Greedy speculative output is token-identical to ``model.generate(do_sample=False)``.

Real prompts from the shared data, the real packaged model in fp32, 64 new tokens.
"""

from __future__ import annotations

import pytest
import torch
from data_files import read_jsonl

MAX_NEW = 64


_PLAIN: dict[tuple[int, ...], list[int]] = {}


def _plain_greedy(generator, ids: list[int]) -> list[int]:
    """Reference output, computed once per prompt and shared by every drafter's test."""
    key = tuple(ids)
    if key not in _PLAIN:
        out = generator.model.generate(torch.tensor([ids]), do_sample=False,
                                       max_new_tokens=MAX_NEW)
        _PLAIN[key] = out[0, len(ids):].tolist()
    return _PLAIN[key]


def _cases() -> list[tuple[str, list[dict], list[str] | None]]:
    cases = []
    for i, row in enumerate(read_jsonl("spec_bench/rag.jsonl", 12)):
        cases.append((f"rag-{i}", [{"role": "user", "content": row["turns"][0]}], None))
    for i, row in enumerate(read_jsonl("hagrid/hagrid.jsonl", 10)):
        docs = row["context"] if isinstance(row["context"], list) else [row["context"]]
        docs = [d if isinstance(d, str) else d.get("text", str(d)) for d in docs]
        cases.append((f"hagrid-{i}", [{"role": "user", "content": row["turns"][0]}], docs))
    return cases


CASES = _cases()
CHAIN_CASES = [c for c in CASES if c[0].endswith(("-0", "-1", "-2"))]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "messages", "docs"), CASES, ids=[c[0] for c in CASES])
def test_trie_greedy_equals_plain_generate(generator, name, messages, docs) -> None:
    _check(generator, messages, docs, "trie")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "messages", "docs"), CHAIN_CASES,
                         ids=[c[0] for c in CHAIN_CASES])
def test_chain_greedy_equals_plain_generate(generator, name, messages, docs) -> None:
    _check(generator, messages, docs, "chain")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "messages", "docs"), CHAIN_CASES,
                         ids=[c[0] for c in CHAIN_CASES])
def test_backoff_greedy_equals_plain_generate(generator, name, messages, docs) -> None:
    _check(generator, messages, docs, "backoff")


def _check(generator, messages, docs, method: str) -> None:
    ids = generator.encode_prompt(messages)
    expected = _plain_greedy(generator, ids)
    result = generator.generate(messages, documents=docs, max_new_tokens=MAX_NEW, method=method)
    assert result.token_ids == expected
    assert result.stats.draft_source == ("documents" if docs else "prompt")
    assert sum(result.stats.accept_lengths) + 1 == len(result.token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("num_draft", [1, 3, 64])
def test_greedy_exact_across_budgets(generator, num_draft: int) -> None:
    row = read_jsonl("spec_bench/summarization.jsonl", 1)[0]
    messages = [{"role": "user", "content": row["turns"][0]}]
    expected = _plain_greedy(generator, generator.encode_prompt(messages))
    result = generator.generate(messages, max_new_tokens=MAX_NEW, num_draft=num_draft)
    assert result.token_ids == expected
    assert result.stats.mean_accept_length >= 1.0


ENGINE_CASES = [c for c in CASES if c[0] in ("rag-0", "hagrid-0")]


ENGINES = [("llama-step", "stock"), ("llama-step", "transposed"), ("llama-step", "prepacked"),
           ("modules", "stock"), ("modules", "transposed")]


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "layout"), ENGINES, ids=[f"{e}-{lay}" for e, lay in ENGINES])
@pytest.mark.parametrize(("name", "messages", "docs"), ENGINE_CASES,
                         ids=[c[0] for c in ENGINE_CASES])
def test_engine_variants_keep_greedy_exact(generator, name, messages, docs, engine: str,
                                           layout: str) -> None:
    """Whatever the latency curve picks on a host -- packed attention for plain steps,
    any linear layout at any size -- and whether the steps run the Llama step or
    the modules, greedy output stays that of ``generate``."""
    from ngram_trie_rag import SpeculativeGenerator
    from ngram_trie_rag.latency import LatencyCurve

    seconds = dict(generator._forward_costs().seconds)
    forced = SpeculativeGenerator(generator.model, generator.tokenizer)
    assert forced.step is not None  # the packaged model is a Llama
    if engine == "modules":
        forced.step = None
    forced._costs = LatencyCurve(seconds, dict.fromkeys(seconds, layout), pack_single=True)
    _check(forced, messages, docs, "trie")

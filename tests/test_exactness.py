"""Greedy speculative output is token-identical to ``model.generate(do_sample=False)``.

Real prompts from the shared data, the real packaged model in fp32, 64 new tokens.
"""

from __future__ import annotations

import pytest
from data_files import read_jsonl

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import EagerEngine, LatencyCurve
from ngram_trie_rag.engine.costs.latency import SIZES
from ngram_trie_rag.engine.quant import w8a32
from ngram_trie_rag.reference import greedy_reference

MAX_NEW = 64


_PLAIN: dict[tuple[int, ...], list[int]] = {}


def _plain_greedy(generator: SpeculativeGenerator, ids: list[int]) -> list[int]:
    """Reference output, computed once per prompt and shared by every drafter's test."""
    key = tuple(ids)
    if key not in _PLAIN:
        _PLAIN[key] = greedy_reference(generator.model, ids, MAX_NEW)
    return _PLAIN[key]


def _cases() -> list[tuple[str, list[dict], list[str] | None]]:
    cases = []
    for i, row in enumerate(read_jsonl("spec_bench/rag.jsonl", 6)):
        cases.append((f"rag-{i}", [{"role": "user", "content": row["turns"][0]}], None))
    for i, row in enumerate(read_jsonl("hagrid/hagrid.jsonl", 6)):
        docs = row["context"] if isinstance(row["context"], list) else [row["context"]]
        docs = [d if isinstance(d, str) else d.get("text", str(d)) for d in docs]
        cases.append((f"hagrid-{i}", [{"role": "user", "content": row["turns"][0]}], docs))
    return cases


CASES = _cases()
CHAIN_CASES = [c for c in CASES if c[0].endswith(("-0", "-1", "-2"))]
BACKOFF_CASES = [c for c in CHAIN_CASES if c[0].startswith("rag")]


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
@pytest.mark.parametrize(("name", "messages", "docs"), BACKOFF_CASES,
                         ids=[c[0] for c in BACKOFF_CASES])
def test_backoff_greedy_equals_plain_generate(generator, name, messages, docs) -> None:
    _check(generator, messages, docs, "backoff")


def _check(generator: SpeculativeGenerator, messages, docs, method: str,
           speculative: SpeculativeGenerator | None = None) -> None:
    """``speculative`` (by default ``generator``) answers greedily as ``generate`` does
    on the packaged model (``generator``'s)."""
    speculative = speculative or generator
    ids = generator.encode_prompt(messages)
    expected = _plain_greedy(generator, ids)
    result = speculative.generate(messages, documents=docs, max_new_tokens=MAX_NEW,
                                  method=method)
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
    # The summary copies phrases of the article it summarises: drafts were accepted.
    assert sum(a - 1 for a in result.stats.accept_lengths) > 0


# One prompt with documents: the layouts follow the rows a forward computes, not the
# context length or where drafts come from (the trie cases above cover those).
ENGINE_CASES = [c for c in CASES if c[0] == "hagrid-0"]


_AVX512 = pytest.mark.skipif(not w8a32.supported_cpu(), reason="the rowwise layout needs AVX-512")
ENGINES = [pytest.param(engine, layout, id=f"{engine}-{layout}",
                        marks=[_AVX512] if layout == "rowwise" else [])
           for engine, layout in (("llama-step", "stock"), ("llama-step", "transposed"),
                                  ("llama-step", "prepacked"), ("llama-step", "rowwise"),
                                  ("modules", "stock"), ("modules", "transposed"))]


@pytest.fixture(scope="module")
def modules_model():
    """The packaged model (fp32, the same weights as ``generator``'s), loaded for the
    modules engines alone: building one installs the gated attention and linear layers
    on its model, which the session's model should not carry into other modules."""
    from ngram_trie_rag.loading import load_model

    return load_model(None, dtype="float32")[0]


def _pinned_curve(layout: str) -> LatencyCurve:
    """A curve with every size in ``layout`` and packed single queries: the variants a
    host's measurement may pick, forced. Costs nearly flat, so trees get verified."""
    seconds = {q: 0.03 + 0.0005 * q for q in (1, *(1 + k for k in SIZES))}
    return LatencyCurve(seconds, dict.fromkeys(seconds, layout), pack_single=True)


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "layout"), ENGINES)
@pytest.mark.parametrize(("name", "messages", "docs"), ENGINE_CASES,
                         ids=[c[0] for c in ENGINE_CASES])
def test_engine_variants_keep_greedy_exact(generator, modules_model, name, messages, docs,
                                           engine: str, layout: str) -> None:
    """Whatever the latency curve picks on a host -- packed attention for plain steps,
    any linear layout at any size -- and whether the steps run the Llama step or
    the modules, greedy output stays that of ``generate``."""
    direct = engine == "llama-step"
    model = generator.model if direct else modules_model
    pinned = EagerEngine(model, direct_step=direct, curve=_pinned_curve(layout))
    assert (pinned.step is not None) == direct  # the packaged model is a Llama
    assert pinned.packed_gqa  # CPU, SDPA, 9 query heads over 3 KV heads
    forced = SpeculativeGenerator(model, generator.tokenizer, engine=pinned)
    _check(generator, messages, docs, "trie", speculative=forced)

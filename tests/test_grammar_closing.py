"""An answer under a grammar that must end early (token budget, repetition stop) is
closed so that it parses, after tokens that are plain greedy decoding's."""

from __future__ import annotations

import json

import pytest

xgr = pytest.importorskip("xgrammar")

from pydantic import BaseModel  # noqa: E402

from ngram_trie_rag import SpeculativeGenerator  # noqa: E402
from ngram_trie_rag.decoding.grammar import Grammar, compiler_for  # noqa: E402


class Inner(BaseModel):
    n: int
    ok: bool


class Record(BaseModel):
    answer: str
    quote: str
    items: list[int]
    inner: Inner


class Cited(BaseModel):
    answer: str
    quote: str


DOC = ("The Eiffel Tower opened in 1889 in Paris. It was built by Gustave Eiffel's company "
       "for the World's Fair.")
QUESTION = [{"role": "user", "content": "When did the Eiffel Tower open? Answer as JSON "
             "with an answer and a quote."}]


@pytest.fixture(scope="module")
def gen() -> SpeculativeGenerator:
    return SpeculativeGenerator.from_pretrained(dtype="float32")


@pytest.mark.parametrize(("prefix", "kept"), [
    ('{"answer": "Paris is the capital', {"answer": "Paris is the capital"}),  # a string
    ('{"answer": "x", "quote": "y", "items": [1, 2', {"quote": "y", "items": [1, 2]}),
    ("{", {}),  # every required field still to come
    ('{"answer": "x", "quote": "y", "items": [], "inner": {"n": 12', {"items": []}),
])
def test_closing_completes_a_schema_from_any_state(gen, prefix: str, kept: dict) -> None:
    tok = gen.tokenizer
    constraint = compiler_for(tok, gen.logits_width).constraint(Grammar.json_schema(Record))
    constraint.advance(tok.encode(prefix, add_special_tokens=False))
    closing = constraint.closing(64)
    assert closing  # an open structure needs at least one token
    record = Record.model_validate_json(prefix + tok.decode(closing)).model_dump()
    assert record | kept == record  # what the prefix said stays
    assert constraint.closing(len(closing) - 1) is None  # a limit it cannot meet


def test_closing_other_grammars(gen) -> None:
    tok = gen.tokenizer
    compiler = compiler_for(tok, gen.logits_width)
    free = compiler.constraint(Grammar.json())
    free.advance(tok.encode('{"a": [1, {"b": "c', add_special_tokens=False))
    assert json.loads('{"a": [1, {"b": "c' + tok.decode(free.closing(16))) == {
        "a": [1, {"b": "c"}]}
    year = compiler.constraint(Grammar.regex(r" [0-9]{4}"))
    year.advance(tok.encode(" 19", add_special_tokens=False))
    assert tok.decode(year.closing(8)).isdigit()
    done = compiler.constraint(Grammar.regex(r" [0-9]{2}"))
    done.advance(tok.encode(" 19", add_special_tokens=False))
    assert done.closing(8) == []  # complete: nothing to add


def test_budget_closes_the_structure_after_greedy_tokens(gen) -> None:
    grammar = Grammar.json_schema(Cited)
    full = gen.generate(QUESTION, [DOC], max_new_tokens=120, grammar=grammar)
    assert full.finish_reason == "eos" and full.stats.closed_by is None
    for budget in (16, 40):
        outs = [gen.generate(QUESTION, [DOC], max_new_tokens=budget, grammar=grammar,
                             method=method) for method in ("trie", "none")]
        assert outs[0].token_ids == outs[1].token_ids  # speculation changes nothing
        out = outs[0]
        assert (out.finish_reason, out.stats.closed_by) == ("length", "length")
        assert len(out.token_ids) <= budget
        at = out.stats.closed_at
        assert 0 < at < len(out.token_ids)
        assert out.token_ids[:at] == full.token_ids[:at]  # the model's tokens: greedy's
        Cited.model_validate_json(out.text)


def test_repetition_cut_closes_the_structure(gen) -> None:
    grammar = Grammar.json_schema(Cited)
    full = gen.generate(QUESTION, [DOC], max_new_tokens=120, grammar=grammar)
    out = gen.generate(QUESTION, [DOC], max_new_tokens=120, grammar=grammar,
                       repetition_stop=2)
    assert (out.finish_reason, out.stats.closed_by) == ("repetition", "repetition")
    at = out.stats.closed_at
    assert out.token_ids[:at] == full.token_ids[:at]
    Cited.model_validate_json(out.text)
    streamed = "".join(gen.stream(QUESTION, [DOC], max_new_tokens=120, grammar=grammar,
                                  repetition_stop=2))
    assert streamed == out.text

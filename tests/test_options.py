"""GenerationOptions: every per-call option checked once, where the object is made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ngram_trie_rag.decoding.options import GenerationOptions, options_from
from ngram_trie_rag.drafting import AnswerStore

LANGCHAIN = {"max_new_tokens": "max_tokens"}  # a caller that spells the budget its own way


def test_defaults_and_normalised_values() -> None:
    options = GenerationOptions(max_new_tokens=np.int64(7), temperature=1, top_k=np.int32(3),
                                stop="END", seed=np.uint8(5))
    assert options == GenerationOptions(max_new_tokens=7, temperature=1.0, top_k=3,
                                        stop=("END",), seed=5)
    assert type(options.max_new_tokens) is int and type(options.temperature) is float
    assert GenerationOptions().greedy and not options.greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.temperature = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(("values", "error", "message"), [
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1, got 0"),
    ({"max_new_tokens": 3.0}, TypeError, "max_new_tokens must be an integer"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an integer"),
    ({"temperature": float("nan")}, ValueError, "temperature must be a finite number"),
    ({"temperature": 1e-9}, ValueError, "temperature must be 0 \\(greedy\\) or at least"),
    ({"top_p": 0.0}, ValueError, "top_p must be > 0.0"),
    ({"top_k": -1}, ValueError, "top_k must be >= 0"),
    ({"stop": ["ok", ""]}, ValueError, "stop must not contain an empty string"),
    ({"stop": b"END"}, TypeError, "stop must be a string or a list of strings"),
    ({"seed": "1"}, TypeError, "seed must be an integer"),
    ({"num_draft": 0}, ValueError, "num_draft must be >= 1"),
    ({"method": "beam"}, ValueError, "unknown draft method 'beam'"),
    ({"repetition_stop": 1}, ValueError, "repetition_stop must be >= 2"),
    ({"answer_store": [[1, 2]]}, TypeError, "answer_store must be an AnswerStore"),
    ({"grammar": '{"type": "object"}'}, TypeError, "grammar must be an ngram_trie_rag"),
])
def test_a_bad_option_names_itself_and_its_value(values, error, message) -> None:
    with pytest.raises(error, match=message):
        GenerationOptions(**values)


def test_messages_use_the_callers_spelling() -> None:
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        options_from(LANGCHAIN, max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got -2"):
        GenerationOptions().with_changes(LANGCHAIN, max_new_tokens=-2)
    assert options_from(LANGCHAIN, max_tokens=9).max_new_tokens == 9


def test_an_unknown_keyword_is_an_error_listing_the_supported_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown generation option\(s\) 'max_new_token' "
                                        r"\(did you mean 'max_new_tokens'\?\)"):
        options_from(max_new_token=5)
    with pytest.raises(TypeError, match="'max_tokens'"):  # listed as the caller spells it
        options_from(LANGCHAIN, bogus=1)
    with pytest.raises(TypeError, match="unknown generation option"):
        GenerationOptions().with_changes(names=None, temprature=0.5)


def test_changes_over_defaults() -> None:
    store = AnswerStore()
    base = GenerationOptions(max_new_tokens=32, temperature=0.7, seed=1, num_draft=4)
    changed = base.with_changes(top_k=5, answer_store=store)
    assert (changed.max_new_tokens, changed.temperature, changed.top_k) == (32, 0.7, 5)
    assert changed.answer_store is store and base.answer_store is None
    # None: "the default" for an option that always has a value, "unset" for the others
    assert base.with_changes(max_new_tokens=None, seed=None, num_draft=None) == \
        GenerationOptions(max_new_tokens=32, temperature=0.7)
    assert options_from(max_new_tokens=None, temperature=None) == GenerationOptions()

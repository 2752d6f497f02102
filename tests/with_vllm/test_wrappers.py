"""The LangChain and LlamaIndex wrappers on vLLM, end to end, greedy in fp32.

* ``base_url``: vLLM's OpenAI server started by ``ngram-trie-rag serve`` (the session
  fixture). A small RAG chain (a real retriever over in-memory passages) answers exactly
  what a direct POST with the same messages and documents answers; the documents reach the
  server's drafter; streams, stop strings, usage and concurrent calls behave.
* ``backend="vllm"``: vLLM's engine in this process, one for the module. ``abatch`` goes
  in as one batch, and every answer equals the same prompt alone and the server's.

Runs in vLLM's environment (``.venv-vllm``); skipped where vLLM is not installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402
from langchain_core.tools import tool as lc_tool  # noqa: E402
from langchain_ngram_trie import ChatNGramTrie, NGramTrieLLM, document_registry  # noqa: E402
from langchain_ngram_trie.messages import to_chat  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.event_handlers import BaseEventHandler  # noqa: E402
from llama_index.core.instrumentation.events.llm import LLMChatStartEvent  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: E402
from llama_index.core.retrievers import BaseRetriever as NodeRetriever  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.llms.ngram_trie import NGramTrieLLM as LlamaNGramTrieLLM  # noqa: E402
from llama_index.llms.ngram_trie import registry_size  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from ngram_trie_rag.serving import DOCUMENTS, ServerError  # noqa: E402

TOKENS = 32
PASSAGES = {
    "lighthouse": "The lighthouse keeper climbed the spiral stairs at dusk, lit the great "
                  "lamp, and wrote the hour, the wind and the state of the sea into the "
                  "logbook on the desk.",
    "socrates": "Socrates was born in Alopece, a deme of Athens, around 470 BC. He was the "
                "son of Sophroniscus, a stonemason, and Phaenarete, a midwife.",
    "hamlet": "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and "
              "1601. It is Shakespeare's longest play, with 29,551 words.",
    "bees": "Honey bees build hexagonal wax cells to store honey and pollen, and they "
            "communicate the direction of flowers to each other with a waggle dance.",
}
COPY = "What did the lighthouse keeper do at dusk? Repeat the passage word for word."
QUESTIONS = ["Where was Socrates born, and who were his parents?",
             "Who wrote Hamlet, and how long is the play?",
             "How do honey bees tell each other where flowers are?",
             COPY]
UNRELATED = ("Quarterly revenue of the cement works rose by four percent, driven by road "
             "construction contracts in the northern provinces and lower energy prices.")
ENGINE_ARGS = {"dtype": "float32", "max_model_len": 4096, "enforce_eager": True,
               "kv_cache_memory_bytes": 1 << 30}


# ---- a real retriever, the chain, direct requests -----------------------------------------
def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) - {"the", "a", "and", "of", "to", "do",
                                                        "did", "who", "what", "how", "is"}


def ranked(query: str) -> list[str]:
    """Passage ids by words shared with the query, best first (ties by id)."""
    return sorted(PASSAGES, key=lambda k: (-len(words(query) & words(PASSAGES[k])), k))


class KeywordRetriever(BaseRetriever):
    """The passage sharing the most words with the query."""

    k: int = 1

    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        return [Document(page_content=PASSAGES[i], id=i) for i in ranked(query)[:self.k]]


PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using only this context.\n\nContext:\n{context}"),
    ("human", "{question}"),
])


def fmt(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def rag_chain(llm: Any) -> Any:
    return {"context": KeywordRetriever() | fmt, "question": RunnablePassthrough()} | PROMPT | llm


def chain_messages(question: str) -> list[dict[str, str]]:
    """The messages the chain sends for ``question``, as OpenAI messages."""
    context = fmt(KeywordRetriever().invoke(question))
    return to_chat(PROMPT.invoke({"context": context, "question": question}).to_messages())


def post(server: Any, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{server.base_url}/{path}",
                                     data=json.dumps({"model": server.model, **body}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def direct(server: Any, prompt: Any, documents: list[str] | None,
           max_tokens: int = TOKENS, **options: Any) -> dict:
    """One greedy request straight to the server; documents as the wrappers send them."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, **options}
    if documents:
        body["vllm_xargs"] = {DOCUMENTS: documents}
    if isinstance(prompt, str):
        return post(server, "completions", {"prompt": prompt, **body})
    return post(server, "chat/completions", {"messages": prompt, **body})


def text_of(reply: dict) -> str:
    choice = reply["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def accepted_tokens(server: Any) -> float:
    """The server's running total of accepted draft tokens."""
    url = server.base_url.removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Recorder(BaseCallbackHandler):
    """Each chat model call's response metadata, under the call's question."""

    def __init__(self) -> None:
        self._question: dict[Any, str] = {}
        self.by_question: dict[str, dict] = {}

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any,
                            **kwargs: Any) -> None:
        self._question[run_id] = messages[0][-1].content

    def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
        question = self._question.pop(run_id, None)
        if question is not None:
            self.by_question[question] = response.generations[0][0].message.response_metadata


@pytest.fixture(scope="module")
def chat(vllm_server: Any) -> ChatNGramTrie:
    return ChatNGramTrie(base_url=vllm_server.base_url, model=vllm_server.model,
                         max_tokens=TOKENS)


# ---- LangChain on the server ----------------------------------------------------------------
def test_rag_chain_answers_as_a_direct_request_and_sends_the_documents(chat, vllm_server,
                                                                       held_before):
    before = accepted_tokens(vllm_server)
    message = rag_chain(chat).invoke(COPY)
    gained = accepted_tokens(vllm_server) - before
    reply = direct(vllm_server, chain_messages(COPY), [PASSAGES["lighthouse"]])
    assert message.content == text_of(reply)
    assert message.content.startswith("The lighthouse keeper climbed the spiral stairs")
    meta = message.response_metadata
    assert meta["model_name"] == vllm_server.model
    assert meta["finish_reason"] in ("eos", "length")
    spec = meta["speculative"]
    assert spec["backend"] == "vllm-server" and spec["documents_from"] == "retriever"
    assert [d["id"] for d in spec["documents"]] == ["lighthouse"]
    assert spec["draft_source"] == "documents" and spec["num_documents"] == 1
    assert spec["acceptance"] is None  # this server does not report it per request
    assert message.usage_metadata == {
        "input_tokens": reply["usage"]["prompt_tokens"],
        "output_tokens": reply["usage"]["completion_tokens"],
        "total_tokens": reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]}
    # The same prompt and answer drafted from an unrelated text instead: the drafter had
    # the passage above, since drafting from this one gains less.
    before = accepted_tokens(vllm_server)
    other = rag_chain(chat.bind(documents=[UNRELATED])).invoke(COPY)
    assert other.content == message.content  # drafts change speed, never the answer
    assert other.response_metadata["speculative"]["documents_from"] == "argument"
    assert gained > accepted_tokens(vllm_server) - before
    assert document_registry().size == held_before


def test_stream_stop_strings_and_the_completion_llm(chat, vllm_server):
    whole = rag_chain(chat).invoke(QUESTIONS[0])
    chunks = list(rag_chain(chat).stream(QUESTIONS[0]))
    assert "".join(c.content for c in chunks) == whole.content
    assert len([c for c in chunks if c.content]) > 1  # streamed, not one blob
    last = chunks[-1]
    assert last.usage_metadata == whole.usage_metadata
    assert last.response_metadata["speculative"]["documents_from"] == "retriever"
    word = whole.content.split()[3]
    stopped = rag_chain(chat.bind(stop=[word])).invoke(QUESTIONS[0])
    assert stopped.response_metadata["finish_reason"] == "stop"
    assert whole.content.startswith(stopped.content) and word not in stopped.content
    reply = direct(vllm_server, chain_messages(QUESTIONS[0]), [PASSAGES["socrates"]],
                   stop=[word])
    assert stopped.content == text_of(reply)
    # The completion model sends the prompt as-is to /completions.
    llm = NGramTrieLLM(base_url=vllm_server.base_url, max_tokens=TOKENS)  # name: asked
    prompt = f"{PASSAGES['hamlet']}\nQ: Who wrote Hamlet?\nA:"
    result = llm.generate([prompt], documents=[PASSAGES["hamlet"]])
    reply = direct(vllm_server, prompt, [PASSAGES["hamlet"]])
    generation = result.generations[0][0]
    assert generation.text == text_of(reply)
    assert generation.generation_info["usage"]["input_tokens"] == reply["usage"]["prompt_tokens"]
    assert result.llm_output["model_name"] == vllm_server.model
    assert "".join(llm.stream(prompt, documents=[PASSAGES["hamlet"]])) == generation.text


async def test_concurrent_ainvokes_each_get_their_own_answer(held_before, chat):
    recorder = Recorder()
    chain = rag_chain(chat)
    config = {"callbacks": [recorder]}
    together = await asyncio.gather(*(chain.ainvoke(q, config=config) for q in QUESTIONS[:2]))
    alone = [chain.invoke(q).content for q in QUESTIONS[:2]]
    assert [m.content for m in together] == alone
    assert alone[0] != alone[1]
    for question, expected in zip(QUESTIONS[:2], ["socrates", "hamlet"], strict=True):
        spec = recorder.by_question[question]["speculative"]
        assert [d["id"] for d in spec["documents"]] == [expected]
    chunks = [c async for c in chain.astream(QUESTIONS[1])]
    assert "".join(c.content for c in chunks) == alone[1]
    assert document_registry().size == held_before


def test_server_errors_carry_the_servers_message(vllm_server):
    wrong = ChatNGramTrie(base_url=vllm_server.base_url, model="no-such-model", max_tokens=4)
    with pytest.raises(ServerError, match="HTTP 404 .*no-such-model"):
        wrong.invoke([HumanMessage("Hello")])


# ---- LlamaIndex on the server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def li_llm(vllm_server: Any) -> LlamaNGramTrieLLM:
    return LlamaNGramTrieLLM(base_url=vllm_server.base_url, model_name=vllm_server.model,
                             max_new_tokens=TOKENS)


def test_llama_index_complete_chat_and_streams(li_llm, vllm_server):
    docs = [PASSAGES["lighthouse"]]
    user = [{"role": "user", "content": COPY + "\n\n" + docs[0]}]
    before = accepted_tokens(vllm_server)
    response = li_llm.complete(user[0]["content"], documents=docs)
    assert accepted_tokens(vllm_server) > before
    reply = direct(vllm_server, user, docs)
    assert response.text == text_of(reply)
    extra = response.additional_kwargs
    assert extra["model_name"] == vllm_server.model
    assert li_llm.metadata.context_window == 4096  # the server's max_model_len
    assert extra["prompt_tokens"] == reply["usage"]["prompt_tokens"]
    assert extra["speculative"]["backend"] == "vllm-server"
    assert response.raw["draft_texts"] == docs and "token_ids" not in response.raw
    messages = [ChatMessage(role="system", content="Answer in one sentence."),
                ChatMessage(role="user", content=QUESTIONS[1] + "\n\n" + PASSAGES["hamlet"])]
    answer = li_llm.chat(messages, documents=[PASSAGES["hamlet"]])
    reply = direct(vllm_server, [{"role": m.role.value, "content": m.content} for m in messages],
                   [PASSAGES["hamlet"]])
    assert answer.message.content == text_of(reply)
    assert answer.additional_kwargs["finish_reason"] in ("eos", "length")
    prompt = f"{PASSAGES['bees']}\nQuestion: What do bees build?\nAnswer:"
    plain = li_llm.complete(prompt, formatted=True)  # as-is, to /completions
    assert plain.text == text_of(direct(vllm_server, prompt, None))
    stopped = li_llm.complete(prompt, formatted=True, stop=[plain.text.split()[2]])
    assert stopped.additional_kwargs["finish_reason"] == "stop"
    assert plain.text.startswith(stopped.text) and len(stopped.text) < len(plain.text)


async def test_llama_index_async_streams_and_concurrent_calls(li_llm):
    prompts = [QUESTIONS[0] + "\n\n" + PASSAGES["socrates"],
               QUESTIONS[2] + "\n\n" + PASSAGES["bees"]]
    docs = [[PASSAGES["socrates"]], [PASSAGES["bees"]]]
    alone = [li_llm.complete(p, documents=d).text for p, d in zip(prompts, docs, strict=True)]
    together = await asyncio.gather(*(li_llm.acomplete(p, documents=d)
                                      for p, d in zip(prompts, docs, strict=True)))
    assert [r.text for r in together] == alone
    chunks = [c async for c in await li_llm.astream_complete(prompts[1], documents=docs[1])]
    assert "".join(c.delta for c in chunks) == alone[1] == chunks[-1].text
    assert chunks[-1].additional_kwargs["completion_tokens"] > 0


class KeywordNodes(NodeRetriever):
    """LlamaIndex's side of the keyword retriever: the best passage as a node."""

    def _retrieve(self, query_bundle: Any) -> list[NodeWithScore]:
        best = ranked(query_bundle.query_str)[0]
        return [NodeWithScore(node=TextNode(id_=best, text=PASSAGES[best]), score=1.0)]


class ChatStarts(BaseEventHandler):
    """The messages of every chat call started."""

    messages: list[list[ChatMessage]] = []

    @classmethod
    def class_name(cls) -> str:
        return "ChatStarts"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatStartEvent):
            self.messages.append(list(event.messages))


@pytest.fixture
def chat_starts() -> Iterator[ChatStarts]:
    handler = ChatStarts(messages=[])
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    yield handler
    dispatcher.event_handlers.remove(handler)


def test_llama_index_query_engine_sends_the_retrieved_nodes(li_llm, vllm_server, chat_starts):
    engine = RetrieverQueryEngine.from_args(KeywordNodes(), llm=li_llm)
    response = engine.query(QUESTIONS[2])
    assert [n.node.node_id for n in response.source_nodes] == ["bees"]
    [messages] = chat_starts.messages
    node_text = response.source_nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
    reply = direct(vllm_server, [{"role": m.role.value, "content": m.content} for m in messages],
                   [node_text])
    assert response.response == text_of(reply)
    assert registry_size() == 0


# ---- vLLM in this process -------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_llm(vllm_server: Any) -> Iterator[NGramTrieLLM]:
    """The completion model on an in-process engine; the engine is shut down after."""
    llm = NGramTrieLLM(backend="vllm", model=vllm_server.model_dir, max_tokens=TOKENS,
                       vllm_engine_args=ENGINE_ARGS)
    yield llm
    llm.active_backend.client.close()


BATCH = [*QUESTIONS[:3], "When did the lighthouse keeper climb the stairs?"]


def rag_prompt(question: str) -> str:
    return f"Context:\n{PASSAGES[ranked(question)[0]]}\n\nQuestion: {question}\nAnswer:"


async def test_in_process_abatch_is_one_batch_equal_to_each_alone_and_the_server(
        engine_llm, vllm_server):
    prompts = [rag_prompt(q) for q in BATCH]
    docs = [[PASSAGES[ranked(q)[0]]] for q in BATCH]
    engine = engine_llm.active_backend.client.start()
    # One request at a time: the reference, and a check that answers depend on the prompt.
    alone = [engine_llm.invoke(p, documents=d) for p, d in zip(prompts, docs, strict=True)]
    assert all(alone) and len(set(alone)) == len(alone)
    in_flight = 0
    done = asyncio.Event()

    async def watch() -> None:  # how many requests vLLM holds at once
        nonlocal in_flight
        while not done.is_set():
            in_flight = max(in_flight, engine._llm.get_num_unfinished_requests())
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    bound = [engine_llm.bind(documents=d) for d in docs]
    together = await asyncio.gather(*(b.ainvoke(p) for b, p in zip(bound, prompts,
                                                                    strict=True)))
    batch = await engine_llm.abatch(prompts)  # no documents: drafted from the prompts
    done.set()
    await watcher
    assert together == alone
    assert batch == alone  # drafts change speed, never the answer
    assert in_flight >= 2  # batched by vLLM, not queued behind one another
    assert alone == [text_of(direct(vllm_server, p, d)) for p, d in zip(prompts, docs,
                                                                        strict=True)]


def test_in_process_chat_reports_acceptance_and_matches_the_server(engine_llm, vllm_server):
    chat = ChatNGramTrie(backend="vllm", model=vllm_server.model_dir, max_tokens=TOKENS,
                         vllm_engine_args=ENGINE_ARGS)
    # same settings, one shared engine
    assert chat.active_backend.client is engine_llm.active_backend.client
    question = [SystemMessage("Repeat the passage word for word."),
                HumanMessage(PASSAGES["lighthouse"])]
    copied = chat.invoke(question, documents=[PASSAGES["lighthouse"]])
    unrelated = chat.invoke(question, documents=[UNRELATED])
    assert copied.content == unrelated.content == text_of(
        direct(vllm_server, to_chat(question), [PASSAGES["lighthouse"]]))
    assert isinstance(copied, AIMessage) and copied.usage_metadata["output_tokens"] > 0
    acceptance = copied.response_metadata["speculative"]["acceptance"]
    other = unrelated.response_metadata["speculative"]["acceptance"]
    # Per request: drafting from the passage being copied beats drafting from another text.
    assert acceptance["num_accepted_draft_tokens"] > other["num_accepted_draft_tokens"]
    chunks = list(chat.stream(question, documents=[PASSAGES["lighthouse"]]))
    assert "".join(c.content for c in chunks) == copied.content
    assert chunks[-1].response_metadata["speculative"]["backend"] == "vllm"


async def test_in_process_llama_index_shares_the_engine(engine_llm, vllm_server):
    llm = LlamaNGramTrieLLM(backend="vllm", model_path=vllm_server.model_dir,
                            max_new_tokens=TOKENS, vllm_engine_args=ENGINE_ARGS)
    assert llm.active_backend.client is engine_llm.active_backend.client  # the one shared engine
    assert llm.metadata.context_window == 4096 and llm.metadata.is_chat_model
    prompt = QUESTIONS[1] + "\n\n" + PASSAGES["hamlet"]
    response = await llm.acomplete(prompt, documents=[PASSAGES["hamlet"]])
    reply = direct(vllm_server, [{"role": "user", "content": prompt}], [PASSAGES["hamlet"]])
    assert response.text == text_of(reply)
    assert response.additional_kwargs["speculative"]["acceptance"]["num_spec_steps"] >= 1
    deltas = [c.delta async for c in await llm.astream_complete(prompt,
                                                                 documents=[PASSAGES["hamlet"]])]
    assert "".join(deltas) == response.text


# ---- grammars: structured output and tool calls, on the server and in process ----------------
class Cited(BaseModel):
    answer: str = Field(max_length=60)  # bounded: a small model may loop inside a string
    quote: str = Field(max_length=60)


@lc_tool
def search_docs(query: str) -> str:
    """Search the documents for passages about ``query``."""
    return PASSAGES[ranked(query)[0]]


CITED_QUESTION = [HumanMessage(QUESTIONS[1] + "\n\n" + PASSAGES["hamlet"])]
LONG = 128  # room for a whole JSON object


def test_structured_output_and_tool_calls_on_vllm(vllm_server, engine_llm):
    """The grammar goes with the request as vLLM's structured outputs: the answer parses
    into the schema and the tool call names the tool with valid arguments, on the server
    and in process alike (the same greedy answer from both)."""
    server = ChatNGramTrie(base_url=vllm_server.base_url, model=vllm_server.model,
                           max_tokens=LONG)
    local = ChatNGramTrie(backend="vllm", model=vllm_server.model_dir, max_tokens=LONG,
                          vllm_engine_args=ENGINE_ARGS)
    assert local.active_backend.client is engine_llm.active_backend.client
    answers = [chat.with_structured_output(Cited, include_raw=True).invoke(CITED_QUESTION)
               for chat in (server, local)]
    for out in answers:
        assert out["parsing_error"] is None and isinstance(out["parsed"], Cited)
        assert out["parsed"].answer and out["parsed"].quote
    assert answers[0]["raw"].content == answers[1]["raw"].content
    for chat in (server, local):
        call = chat.bind_tools([search_docs], tool_choice="search_docs").invoke(
            "Find out who wrote Hamlet.")
        [tool_call] = call.tool_calls
        assert tool_call["name"] == "search_docs" and tool_call["id"]
        assert isinstance(tool_call["args"]["query"], str)
    json_mode = server.bind(response_format={"type": "json_object"}).invoke(CITED_QUESTION)
    assert json_mode.content.startswith("{")
    if json_mode.response_metadata["finish_reason"] != "length":  # not cut by the limit
        assert isinstance(json.loads(json_mode.content), dict)


def test_llama_index_structured_predict_and_tools_on_the_server(vllm_server):
    llm = LlamaNGramTrieLLM(base_url=vllm_server.base_url, model_name=vllm_server.model,
                            max_new_tokens=LONG)
    assert llm.metadata.is_function_calling_model
    cited = llm.structured_predict(Cited, PromptTemplate("{question}\n\n{passage}"),
                                   question=QUESTIONS[1], passage=PASSAGES["hamlet"])
    assert isinstance(cited, Cited) and cited.answer
    def search(query: str) -> str:
        """Search the documents for passages about ``query``."""
        return PASSAGES[ranked(query)[0]]

    tool = FunctionTool.from_defaults(fn=search, name="search_docs")
    response = llm.chat_with_tools([tool], user_msg="Find out who wrote Hamlet.",
                                   tool_required=True)
    [selection] = llm.get_tool_calls_from_response(response)
    assert selection.tool_name == "search_docs" and isinstance(selection.tool_kwargs["query"], str)

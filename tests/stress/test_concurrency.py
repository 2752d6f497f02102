"""Many requests at once through the LangChain and LlamaIndex integrations, with the real
packaged model and real MiniLM retrieval.

Generation is serialised on one lock per model while retrieval, callbacks and spans run
concurrently, so the risks are a request drafting from another request's documents, state
left behind in the document registries, a deadlock between waiting requests and the one
holding the model, and a cancelled stream that keeps the model locked. Every answer is
compared with plain greedy decoding of the same prompt (``model.generate``), computed once
per question before any concurrent run. ``make stress`` repeats each burst three times.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from data_files import read_jsonl
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_ngram_trie import ChatNGramTrie, document_registry, shared_generator
from llama_index.core import VectorStoreIndex
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.schema import TextNode
from llama_index.llms.ngram_trie import (
    NGramTrieLLM,
    SentenceTransformerEmbedding,
    get_tracker,
    registry_size,
)
from stress_scale import scale

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.reference import greedy_reference
from ngram_trie_rag.retrieval import Embedder

# Concurrent requests per burst: 12 in make test (the integrations' own tests already run
# 16 at once), 32 in make stress.
REQUESTS = scale(8, 32)
ROUNDS = scale(1, 3)  # bursts per test: repeated bursts would show state piling up
TOKENS = 12  # short answers: the tests check isolation and liveness, not long outputs
LONG = 128  # answers that are still running when a stream is abandoned
TOP_K = 2  # documents per request; the chosen questions share none of them
DEADLINE = 600.0  # seconds for one group of requests; a deadlock never meets it
IDLE_WAIT = 10.0  # seconds for a closed or cancelled stream to release the model
WIKI_PASSAGES = 160  # enough distinct articles to find 32 questions with disjoint top-2
PASSAGE_CHARS = 320  # prefill dominates a 12-token answer: short passages keep prompts cheap

T = TypeVar("T")


@dataclass(frozen=True)
class Case:
    """One request: the question, the ids it must draft from, its plain greedy answer."""

    question: str
    doc_ids: tuple[str, ...]
    reference: str


# ---- shared helpers ------------------------------------------------------------------------
def clip(text: str, limit: int = PASSAGE_CHARS) -> str:
    """The start of ``text``, cut at a word boundary."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def plain_greedy(gen: SpeculativeGenerator, prompt: Any, max_new_tokens: int) -> str:
    """The reference answer: ``model.generate`` without drafting, on the same prompt ids."""
    answer = greedy_reference(gen.model, gen.encode_prompt(prompt), max_new_tokens)
    return gen.tokenizer.decode(answer, skip_special_tokens=True)


def disjoint_first(candidates: Iterable[tuple[str, Sequence[str]]],
                   count: int) -> list[tuple[str, tuple[str, ...]]]:
    """The first ``count`` questions whose document sets overlap no earlier pick's, so a
    document named in a response can only have come from its own request."""
    used: set[str] = set()
    picked: list[tuple[str, tuple[str, ...]]] = []
    for question, ids in candidates:
        if len(ids) == TOP_K and not used & set(ids):
            used |= set(ids)
            picked.append((question, tuple(ids)))
        if len(picked) == count:
            break
    assert len(picked) == count, f"only {len(picked)} questions with disjoint documents"
    return picked


def within(fn: Callable[[], T], seconds: float) -> T:
    """``fn()`` on a daemon thread; TimeoutError if it has not returned in time (a hung
    call must fail the test, not hang the run)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"not finished after {seconds:.0f} s: deadlock or starvation")
    if "error" in box:
        raise box["error"]
    return box["value"]


def on_thread_pool(fn: Callable[[str], T], questions: Sequence[str]) -> list[T]:
    """One ``fn(question)`` per pool thread, all at once, results in order, one deadline."""
    pool = ThreadPoolExecutor(max_workers=len(questions))
    try:
        futures = [pool.submit(fn, q) for q in questions]
        end = time.monotonic() + DEADLINE
        return [f.result(timeout=max(0.0, end - time.monotonic())) for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def wait_idle(gen: SpeculativeGenerator, seconds: float = IDLE_WAIT) -> bool:
    """True once no generation holds the model (a closed stream may finish its last step)."""
    end = time.monotonic() + seconds
    while gen.busy and time.monotonic() < end:
        time.sleep(0.02)
    return not gen.busy


async def await_idle(gen: SpeculativeGenerator, seconds: float = IDLE_WAIT) -> bool:
    end = time.monotonic() + seconds
    while gen.busy and time.monotonic() < end:
        await asyncio.sleep(0.02)
    return not gen.busy


# ---- LangChain -------------------------------------------------------------------------------
ROLES = {"system": "system", "human": "user", "ai": "assistant"}
LC_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using only this context.\n\nContext:\n{context}"),
    ("human", "{question}"),
])


class LockedMiniLM(Embeddings):
    """The package's MiniLM embedder as LangChain embeddings. Encoding is serialised:
    async retrievals embed from executor threads, and a fast tokenizer is not re-entrant."""

    def __init__(self) -> None:
        self._embedder = Embedder()
        self._lock = threading.Lock()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            return self._embedder.encode(list(texts), progress=False).tolist()

    def embed_query(self, text: str) -> list[float]:
        with self._lock:
            return self._embedder.encode_queries([text], progress=False)[0].tolist()


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def lc_rag_chain(retriever: Runnable, llm: Runnable) -> Runnable:
    """The canonical RAG chain, ending at the model so each answer keeps its metadata."""
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} \
        | LC_PROMPT | llm


@pytest.fixture(scope="module")
def lc_gen() -> SpeculativeGenerator:
    return shared_generator()


@pytest.fixture(scope="module")
def lc_retriever() -> Runnable:
    """HAGRID passages (the first two of each row, clipped) in an in-memory store, top 2."""
    passages = []
    for row in read_jsonl("hagrid/hagrid.jsonl"):
        parts = [p.strip() for p in row["context"].split("\n\n") if p.strip()]
        passages += [Document(page_content=clip(text), id=f"hagrid-{row['question_id']}-{j}")
                     for j, text in enumerate(parts[:2])]
    store = InMemoryVectorStore(embedding=LockedMiniLM())
    store.add_documents(passages, ids=[d.id for d in passages])
    return store.as_retriever(search_kwargs={"k": TOP_K})


@pytest.fixture(scope="module")
def lc_cases(lc_gen: SpeculativeGenerator, lc_retriever: Runnable) -> list[Case]:
    """``REQUESTS`` questions with pairwise disjoint retrieved documents, and their
    greedy answers."""
    rows = read_jsonl("hagrid/hagrid.jsonl")
    found = ((r["question"], [d.id for d in lc_retriever.invoke(r["question"])]) for r in rows)
    cases = []
    for question, ids in disjoint_first(found, REQUESTS):
        docs = lc_retriever.invoke(question)
        messages = LC_PROMPT.invoke({"context": format_docs(docs), "question": question})
        chat = [{"role": ROLES[m.type], "content": m.content} for m in messages.to_messages()]
        cases.append(Case(question, ids, plain_greedy(lc_gen, chat, TOKENS)))
    return cases


@pytest.fixture(scope="module")
def lc_chain(lc_retriever: Runnable) -> Runnable:
    return lc_rag_chain(lc_retriever, ChatNGramTrie(max_tokens=TOKENS))


def check_lc_one(case: Case, answer: AIMessage) -> None:
    """The answer is its own greedy answer, drafted from its own documents only."""
    spec = answer.response_metadata["speculative"]
    assert spec["documents_from"] == "retriever", case.question
    assert tuple(d["id"] for d in spec["documents"]) == case.doc_ids, case.question
    assert spec["num_documents"] == TOP_K
    assert answer.content == case.reference, case.question


def check_lc(cases: Sequence[Case], answers: Sequence[AIMessage], held_before: int) -> None:
    assert len(answers) == len(cases) == REQUESTS
    for case, answer in zip(cases, answers, strict=True):
        check_lc_one(case, answer)
    assert document_registry().size == held_before


def test_langchain_batch_on_threads(lc_chain: Runnable, lc_cases: list[Case],
                                    held_before: int) -> None:
    questions = [c.question for c in lc_cases]
    for _ in range(ROUNDS):
        answers = within(
            lambda: lc_chain.batch(questions, config={"max_concurrency": REQUESTS}), DEADLINE)
        check_lc(lc_cases, answers, held_before)


def test_langchain_invokes_from_a_thread_pool(held_before: int, lc_chain: Runnable,
                                                 lc_cases: list[Case]) -> None:
    for _ in range(ROUNDS):
        answers = on_thread_pool(lc_chain.invoke, [c.question for c in lc_cases])
        check_lc(lc_cases, answers, held_before)


async def test_langchain_concurrent_ainvokes(held_before: int, lc_chain: Runnable,
                                                lc_cases: list[Case]) -> None:
    for _ in range(ROUNDS):
        answers = await asyncio.wait_for(
            asyncio.gather(*(lc_chain.ainvoke(c.question) for c in lc_cases)), DEADLINE)
        check_lc(lc_cases, answers, held_before)


def test_langchain_stream_closed_midway_frees_the_model(
        held_before: int,
        lc_gen: SpeculativeGenerator, lc_retriever: Runnable, lc_chain: Runnable,
        lc_cases: list[Case]) -> None:
    long_chain = lc_rag_chain(lc_retriever, ChatNGramTrie(max_tokens=LONG))
    stream = long_chain.stream(lc_cases[0].question)
    for chunk in stream:
        if chunk.content:
            break
    assert lc_gen.busy  # stopped mid-answer: the stream still holds the model
    stream.close()
    assert wait_idle(lc_gen)
    assert document_registry().size == held_before
    follow = lc_cases[1]
    check_lc_one(follow, within(lambda: lc_chain.invoke(follow.question), DEADLINE))
    assert document_registry().size == held_before


async def test_langchain_async_stream_cancelled_frees_the_model(
        held_before: int,
        lc_gen: SpeculativeGenerator, lc_retriever: Runnable, lc_chain: Runnable,
        lc_cases: list[Case]) -> None:
    long_chain = lc_rag_chain(lc_retriever, ChatNGramTrie(max_tokens=LONG))
    started = asyncio.Event()

    async def consume() -> None:
        async for chunk in long_chain.astream(lc_cases[2].question):
            if chunk.content:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), DEADLINE)
    assert lc_gen.busy and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await await_idle(lc_gen)
    assert document_registry().size == held_before
    follow = lc_cases[3]
    check_lc_one(follow, await asyncio.wait_for(lc_chain.ainvoke(follow.question), DEADLINE))
    assert document_registry().size == held_before


# ---- LlamaIndex ------------------------------------------------------------------------------
class PlainGreedyLLM(CustomLLM):
    """The reference LLM: same metadata (so the same prompts), plain greedy decoding."""

    _gen: Any = PrivateAttr()
    _meta: LLMMetadata = PrivateAttr()

    def __init__(self, gen: SpeculativeGenerator, metadata: LLMMetadata) -> None:
        super().__init__()
        self._gen = gen
        self._meta = metadata

    @property
    def metadata(self) -> LLMMetadata:
        return self._meta

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=plain_greedy(self._gen, prompt, TOKENS))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        text = self.complete(prompt, formatted).text
        return iter([CompletionResponse(text=text, delta=text)])

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        chat = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        text = plain_greedy(self._gen, chat, TOKENS)
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))


class SpeculativeCallRecorder(BaseEventHandler):
    """``raw`` of every finished speculative chat call, with the question it answered."""

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _calls: list[tuple[str, dict]] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "SpeculativeCallRecorder"

    def handle(self, event: Any, **kwargs: Any) -> None:
        raw = getattr(getattr(event, "response", None), "raw", None)
        if isinstance(event, LLMChatEndEvent) and isinstance(raw, dict) \
                and "speculative" in raw:
            prompt = "\n".join(m.content or "" for m in event.messages)
            with self._lock:
                self._calls.append((prompt, raw))

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()

    def about(self, question: str) -> list[dict]:
        """Calls whose prompt asked exactly ``question`` (the QA template's query line)."""
        line = f"Query: {question}\nAnswer:"
        with self._lock:
            return [raw for prompt, raw in self._calls if line in prompt]


@pytest.fixture(scope="module")
def li_llm() -> NGramTrieLLM:
    return NGramTrieLLM(max_new_tokens=TOKENS)


@pytest.fixture(scope="module")
def li_index() -> VectorStoreIndex:
    rows = read_jsonl("wiki_passages/passages.jsonl", WIKI_PASSAGES)
    nodes = [TextNode(id_=r["id"], text=clip(r["contents"])) for r in rows]
    return VectorStoreIndex(nodes, embed_model=SentenceTransformerEmbedding())


@pytest.fixture(scope="module")
def li_cases(li_llm: NGramTrieLLM, li_index: VectorStoreIndex) -> list[Case]:
    """``REQUESTS`` "What is <article>?" questions with disjoint top-2 nodes, and the answers of the
    same query engine with a plain greedy LLM, run one after another."""
    retriever = li_index.as_retriever(similarity_top_k=TOP_K)
    rows = read_jsonl("wiki_passages/passages.jsonl", WIKI_PASSAGES)
    titles = dict.fromkeys(r["contents"].split("\n", 1)[0].strip('"') for r in rows)
    questions = (f"What is {title}?" for title in titles)
    found = ((q, [n.node.node_id for n in retriever.retrieve(q)]) for q in questions)
    plain = li_index.as_query_engine(llm=PlainGreedyLLM(li_llm.generator, li_llm.metadata),
                                     similarity_top_k=TOP_K)
    return [Case(q, ids, plain.query(q).response) for q, ids in disjoint_first(found, REQUESTS)]


@pytest.fixture
def li_recorder() -> Iterable[SpeculativeCallRecorder]:
    dispatcher = get_dispatcher()
    recorder = SpeculativeCallRecorder()
    dispatcher.add_event_handler(recorder)
    yield recorder
    dispatcher.event_handlers.remove(recorder)


def check_li_no_leak() -> None:
    assert registry_size() == 0
    assert get_tracker().num_open_spans == 0


def check_li(cases: Sequence[Case], responses: Sequence[Any],
             recorder: SpeculativeCallRecorder) -> None:
    """Each answer is its own greedy answer, drafted from its own source nodes only."""
    assert len(responses) == len(cases) == REQUESTS
    for case, response in zip(cases, responses, strict=True):
        [raw] = recorder.about(case.question)
        assert raw["draft_origin"] == "retrieved_nodes", case.question
        sources = tuple(n.node.node_id for n in response.source_nodes)
        assert tuple(raw["draft_node_ids"]) == sources == case.doc_ids, case.question
        assert raw["speculative"]["num_documents"] == TOP_K
        assert response.response == case.reference, case.question
    check_li_no_leak()


@pytest.mark.parametrize("how", ["aquery", "thread_pool"])
def test_llama_index_concurrent_queries(how: str, li_llm: NGramTrieLLM,
                                        li_index: VectorStoreIndex, li_cases: list[Case],
                                        li_recorder: SpeculativeCallRecorder) -> None:
    """Concurrent queries, awaited together on one event loop or made from a pool's
    threads: every answer is its own, drafted from its own nodes."""
    engine = li_index.as_query_engine(llm=li_llm, similarity_top_k=TOP_K)
    questions = [c.question for c in li_cases]

    async def gathered() -> list[Any]:
        return await asyncio.wait_for(
            asyncio.gather(*(engine.aquery(q) for q in questions)), DEADLINE)

    for _ in range(ROUNDS):
        li_recorder.clear()
        responses = (asyncio.run(gathered()) if how == "aquery"
                     else on_thread_pool(engine.query, questions))
        check_li(li_cases, responses, li_recorder)


def test_llama_index_stream_closed_midway_frees_the_model(
        li_llm: NGramTrieLLM, li_index: VectorStoreIndex, li_cases: list[Case]) -> None:
    streaming = li_index.as_query_engine(llm=NGramTrieLLM(max_new_tokens=LONG),
                                         similarity_top_k=TOP_K, streaming=True)
    tokens = streaming.query(li_cases[0].question).response_gen
    assert next(tokens)
    assert li_llm.generator.busy  # stopped mid-answer: the stream still holds the model
    tokens.close()
    assert wait_idle(li_llm.generator)
    check_li_no_leak()
    follow = li_cases[1]
    engine = li_index.as_query_engine(llm=li_llm, similarity_top_k=TOP_K)
    assert within(lambda: engine.query(follow.question), DEADLINE).response == follow.reference
    check_li_no_leak()


async def test_llama_index_async_stream_cancelled_frees_the_model(
        li_llm: NGramTrieLLM, li_index: VectorStoreIndex, li_cases: list[Case]) -> None:
    streaming = li_index.as_query_engine(llm=NGramTrieLLM(max_new_tokens=LONG),
                                         similarity_top_k=TOP_K, streaming=True)
    response = await asyncio.wait_for(streaming.aquery(li_cases[2].question), DEADLINE)
    started = asyncio.Event()

    async def consume() -> None:
        async for token in response.async_response_gen():
            if token:
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), DEADLINE)
    assert li_llm.generator.busy and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await await_idle(li_llm.generator)
    check_li_no_leak()
    follow = li_cases[3]
    engine = li_index.as_query_engine(llm=li_llm, similarity_top_k=TOP_K)
    answer = await asyncio.wait_for(engine.aquery(follow.question), DEADLINE)
    assert answer.response == follow.reference
    check_li_no_leak()

"""The retrieved-documents hand-off, on its own: real LangChain runnables and callbacks, a
probe step in place of the model (it asks the registry what a model call would see)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from langchain_ngram_trie import document_registry
from langchain_ngram_trie.documents import choose_documents
from langchain_ngram_trie.registry import call_run_ids


class KeywordRetriever(BaseRetriever):
    """Returns ``n`` documents derived from the query, so every query has its own."""

    n: int = 3
    tag: str = "base"

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=f"{self.tag} {query} #{i}", id=f"{self.tag}:{query}:{i}")
                for i in range(self.n)]


class KeepLast(BaseRetriever):
    """A retriever wrapping another and keeping its last ``top_n`` (a stand-in reranker)."""

    base: BaseRetriever
    top_n: int = 1

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        docs = self.base.invoke(query, config={"callbacks": run_manager.get_child()})
        return docs[-self.top_n:]


def seen_ids(_: object) -> list[str] | None:
    """What a model call at this point would draft from (ids), or None for the prompt."""
    found = document_registry().lookup(*call_run_ids(None))
    draft = choose_documents(None, found.retrieved)
    return [d.id for d in draft.documents] if draft.origin == "retriever" else None


probe = RunnableLambda(seen_ids)


def expected(query: str, tag: str = "base", n: int = 3) -> list[str]:
    return [f"{tag}:{query}:{i}" for i in range(n)]


@pytest.fixture(autouse=True)
def registry_is_empty_after(held_before):
    # No model is built here, so the registry is installed the way a caller without one
    # would: through document_registry().
    document_registry()
    yield
    assert document_registry().size == held_before


# Counts the registry's entries in LangChain's configure hooks, in a fresh interpreter.
HOOK_CHECK = """
import langchain_ngram_trie
from langchain_core.tracers import context

def hooks():
    return sum(var.name == "ngram_trie_retrieved_documents"
               for var, *_ in context._configure_hooks)

print("import", hooks())
from langchain_ngram_trie import ChatNGramTrie, NGramTrieLLM
ChatNGramTrie(model="/no/such/model")  # nothing is loaded when a model is built
print("first", hooks())
ChatNGramTrie()
NGramTrieLLM()
print("more", hooks())
"""


def test_importing_registers_nothing_and_building_a_model_registers_once():
    out = subprocess.run([sys.executable, "-c", HOOK_CHECK], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["import", "0", "first", "1", "more", "1"]


def test_sibling_retriever_documents_reach_the_model_step():
    chain = {"context": KeywordRetriever(), "question": RunnablePassthrough()} | probe
    assert chain.invoke("alpha") == expected("alpha")


def test_without_a_retriever_the_prompt_is_the_source():
    assert ({"question": RunnablePassthrough()} | probe).invoke("alpha") is None
    assert probe.invoke("alpha") is None


def test_batch_threads_and_async_each_see_their_own():
    chain = {"context": KeywordRetriever(), "question": RunnablePassthrough()} | probe
    queries = [f"q{i}" for i in range(8)]
    assert chain.batch(queries) == [expected(q) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(chain.invoke, queries)) == [expected(q) for q in queries]

    async def many() -> list[list[str] | None]:
        return await asyncio.gather(*(chain.ainvoke(q) for q in queries * 2))

    assert asyncio.run(many()) == [expected(q) for q in queries * 2]


def test_outermost_retriever_wins():
    chain = {"context": KeepLast(base=KeywordRetriever(n=5), top_n=2),
             "question": RunnablePassthrough()} | probe
    assert chain.invoke("beta") == expected("beta", n=5)[-2:]


def test_sibling_retrievers_are_both_kept():
    chain = {"a": KeywordRetriever(tag="a", n=1), "b": KeywordRetriever(tag="b", n=1)} | probe
    assert sorted(chain.invoke("gamma")) == ["a:gamma:0", "b:gamma:0"]


def test_a_failing_chain_leaves_nothing_behind():
    def boom(_: object) -> None:
        raise RuntimeError("boom")

    chain = {"context": KeywordRetriever()} | RunnableLambda(boom)
    with pytest.raises(RuntimeError):
        chain.invoke("delta")


def test_streaming_chain_sees_documents():
    chain = {"context": KeywordRetriever(), "question": RunnablePassthrough()} | probe
    assert list(chain.stream("eps")) == [expected("eps")]


def test_handler_is_always_truthy_and_never_inline():
    registry = document_registry()
    assert not hasattr(registry, "__len__")
    assert bool(registry) is True
    assert registry.run_inline is False


def test_concurrent_registry_updates_are_consistent():
    chain = {"context": KeywordRetriever(), "question": RunnablePassthrough()} | probe
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(5):
                q = f"t{i}-{j}"
                assert chain.invoke(q) == expected(q)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors

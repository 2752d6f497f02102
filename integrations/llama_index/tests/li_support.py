"""Test helpers: a plain greedy reference LLM and a recorder of finished LLM calls."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode
from ngram_trie_rag.reference import greedy_reference
from ngram_trie_rag.util.cache_paths import data_dir

WIKI = data_dir() / "wiki_passages" / "passages.jsonl"


def wiki_nodes(limit: int = 30) -> list[TextNode]:
    """The first ``limit`` wiki passages as nodes (id = passage id, text = title + body)."""
    with WIKI.open() as f:
        rows = [json.loads(line) for line, _ in zip(f, range(limit), strict=False)]
    return [TextNode(id_=r["id"], text=r["contents"]) for r in rows]


def title(node: TextNode) -> str:
    return node.text.split("\n", 1)[0].strip('"')


def llm_text(nodes: Sequence[NodeWithScore]) -> list[str]:
    """Node texts as the synthesizer puts them into the prompt."""
    return [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]


class PlainGreedyLLM(CustomLLM):
    """Reference: the same model and prompts with ``model.generate(do_sample=False)``.

    Answers are cached by prompt ids, so reference runs shared by several tests cost once.
    """

    max_new_tokens: int = 40
    _gen: Any = PrivateAttr()
    _meta: LLMMetadata = PrivateAttr()
    _cache: dict = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, generator: Any, metadata: LLMMetadata, max_new_tokens: int) -> None:
        super().__init__(max_new_tokens=max_new_tokens)
        self._gen = generator
        self._meta = metadata

    @property
    def metadata(self) -> LLMMetadata:
        return self._meta

    def answer(self, prompt: Any, max_new_tokens: int | None = None) -> str:
        """Greedy answer to a prompt (string as-is, or chat messages via the template)."""
        limit = max_new_tokens or self.max_new_tokens
        ids = self._gen.encode_prompt(prompt)
        key = (tuple(ids), limit)
        with self._lock:
            if key not in self._cache:
                new = greedy_reference(self._gen.model, ids, limit)
                self._cache[key] = self._gen.tokenizer.decode(new, skip_special_tokens=True)
            return self._cache[key]

    def _completion_prompt(self, prompt: str, formatted: bool) -> Any:
        return prompt if formatted else [{"role": "user", "content": prompt}]

    @staticmethod
    def _chat_prompt(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        return [{"role": m.role.value, "content": m.content or ""} for m in messages]

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.answer(self._completion_prompt(prompt, formatted)))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        text = self.answer(self._completion_prompt(prompt, formatted))
        return iter([CompletionResponse(text=text, delta=text)])

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = self.answer(self._chat_prompt(messages))
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        text = self.answer(self._chat_prompt(messages))
        message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
        return iter([ChatResponse(message=message, delta=text)])


class SpeculativeCalls(BaseEventHandler):
    """Records every finished speculative LLM call (its response carries the draft texts)."""

    calls: list[Any] = []

    @classmethod
    def class_name(cls) -> str:
        return "SpeculativeCalls"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent | LLMCompletionEndEvent):
            raw = getattr(event.response, "raw", None)
            if isinstance(raw, dict) and "speculative" in raw:
                self.calls.append(event)

    def clear(self) -> None:
        self.calls.clear()

    def raws(self) -> list[dict]:
        """``raw`` of every recorded call, in order of completion."""
        return [event.response.raw for event in list(self.calls)]

    def about(self, text: str) -> list[dict]:
        """``raw`` of the calls whose prompt contains ``text``."""
        found = []
        for event in list(self.calls):
            if isinstance(event, LLMChatEndEvent):
                prompt = "\n".join(m.content or "" for m in event.messages)
            else:
                prompt = event.prompt
            if text in prompt:
                found.append(event.response.raw)
        return found

"""``ChatNGramTrie``: a LangChain chat model over n-gram trie speculative decoding.

Messages go through the model's chat template; tokens are drafted from the documents the
enclosing chain retrieved (or passed with ``documents=``) and verified by the model, so the
answer is the model's own: under greedy decoding, token for token what plain decoding gives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, closing
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from .messages import to_chat
from .metadata import Answer, message_metadata
from .registry import call_run_ids
from .settings import NGramTrieSettings, Request


class ChatNGramTrie(NGramTrieSettings, BaseChatModel):
    """Chat model whose answers are sped up by drafting from the retrieved documents.

    Example:
        ```python
        llm = ChatNGramTrie(max_tokens=128)
        chain = (
            {"context": retriever | format_docs, "question": RunnablePassthrough()}
            | prompt | llm | StrOutputParser()
        )
        chain.invoke("Where was Socrates born?")
        ```

    The chain needs no change: documents returned by any retriever in the same chain call
    are found through callbacks. ``llm.bind(documents=[...])`` (strings or Documents) takes
    precedence. ``response_metadata["speculative"]`` reports accept lengths, drafted nodes,
    steps and the documents drafted from; ``usage_metadata`` counts tokens.

    On vLLM, the same chain, each call's documents sent with its request:

        ```python
        llm = ChatNGramTrie(base_url="http://127.0.0.1:8000/v1", model="smollm2")
        llm = ChatNGramTrie(backend="vllm", vllm_engine_args={"dtype": "float32"})
        ```

    There ``response_metadata["speculative"]`` names the backend, the draft source and
    documents, and vLLM's per-request ``acceptance`` when vLLM reports it (``None``
    otherwise; see ``metadata``).
    """

    streaming: bool = False
    """Stream inside ``invoke`` too (token callbacks); ``stream()`` always streams."""

    @property
    def _llm_type(self) -> str:
        return "ngram-trie-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._settings_params()

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(**self._ls_params("chat", stop, kwargs))

    # ---- whole answers ----------------------------------------------------------------------
    def _chat_request(self, messages: list[BaseMessage], stop: list[str] | None,
                      run_manager: Any, kwargs: dict[str, Any]) -> Request:
        return self._request(to_chat(messages), stop, kwargs, *call_run_ids(run_manager))

    @staticmethod
    def _result(answer: Answer) -> ChatResult:
        message = AIMessage(content=answer.text, **message_metadata(answer))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        request = self._chat_request(messages, stop, run_manager, kwargs)
        return self._result(self._generate_one(request))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        request = self._chat_request(messages, stop, run_manager, kwargs)
        return self._result(await self._agenerate_one(request))

    # ---- streams ----------------------------------------------------------------------------
    @staticmethod
    def _chunk(delta: str, answer: Answer | None) -> ChatGenerationChunk:
        """A text delta, or the empty last chunk carrying usage and metadata (merging
        chunks would concatenate strings repeated on every chunk)."""
        if answer is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=delta))
        return ChatGenerationChunk(message=AIMessageChunk(
            content="", chunk_position="last", **message_metadata(answer)))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        request = self._chat_request(messages, stop, run_manager, kwargs)
        with closing(self._deltas(request)) as pairs:  # leaving early frees the model
            for delta, answer in pairs:
                yield self._chunk(delta, answer)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        request = self._chat_request(messages, stop, run_manager, kwargs)
        async with aclosing(self._adeltas(request)) as pairs:
            async for delta, answer in pairs:
                yield self._chunk(delta, answer)

"""``ChatNGramTrie``: a LangChain chat model over n-gram trie speculative decoding.

Messages go through the model's chat template (a model without one reads them as the plain
text of ``ngram_trie_rag.inputs.messages_as_text``); tokens are drafted from the documents the
enclosing chain retrieved (or passed with ``documents=``) and verified by the model, so the
answer is the model's own: under greedy decoding, token for token what plain decoding gives.

Tools (``bind_tools``), structured output (``with_structured_output``) and JSON mode
(``bind(response_format=...)``) decode under a grammar: on the local engine still
speculatively and still exactly (see ``output_format``, ``tools`` and ``structured``); on
vLLM the grammar goes with the request as vLLM's structured outputs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, closing
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from ngram_trie_rag.backends import Answer, Delta

from .calls import Call, make_call
from .messages import to_chat, with_instruction
from .metadata import message_metadata
from .output_format import pop_output_format
from .registry import call_run_ids
from .settings import NGramTrieSettings
from .structured import Method, structured_runnable
from .tools import as_tool_calls, tool_call_chunks, tool_choice_name, tool_specs


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

    The model: a hub id, folder or ``.gguf`` file (``model=`` or ``model_id=``; default:
    the packaged SmolLM2-135M-Instruct), or a model already loaded with its tokenizer:

        ```python
        llm = ChatNGramTrie(model_id="HuggingFaceTB/SmolLM2-360M-Instruct", device_map="auto")
        llm = ChatNGramTrie(model=model, tokenizer=tokenizer)  # loaded by the caller
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

    Tools and structured output (local engine):

        ```python
        llm.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?")
        # AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {...}, ...}])
        llm.with_structured_output(Joke).invoke("Tell me a joke")  # a Joke instance
        llm.bind(response_format={"type": "json_object"})  # JSON mode
        ```
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

    # ---- tools and structured output ----------------------------------------------------------
    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
                   *, tool_choice: str | dict[str, Any] | bool | None = None,
                   parallel_tool_calls: bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools``; replies carry ``tool_calls`` (or ``content`` for a plain answer).

        ``tool_choice``: ``None``/``"auto"`` (the model decides), ``"any"``/``"required"``
        (at least one call), a tool's name (that tool), ``"none"`` (text, tools unseen).
        ``parallel_tool_calls=True`` allows several calls per reply; the default is one,
        as a small model given the room tends to repeat its call.
        """
        specs = tool_specs(tools)  # bad tools and choices fail here, not at the first call
        tool_choice_name(tool_choice, [s.name for s in specs])
        options: dict[str, Any] = {"tools": [convert_to_openai_tool(t) for t in tools]}
        if tool_choice is not None:
            options["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            options["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(**options, **kwargs)

    def with_structured_output(self, schema: dict[str, Any] | type | None = None, *,
                               method: Method = "json_schema", include_raw: bool = False,
                               strict: bool | None = None,
                               **kwargs: Any) -> Runnable[LanguageModelInput, Any]:
        """Answers parsed into ``schema`` (Pydantic class, TypedDict or JSON schema).

        ``method``: ``"json_schema"`` (grammar from the schema), ``"json_mode"`` (any JSON
        object; the prompt must ask for the keys) or ``"function_calling"`` (a forced tool
        call). The grammar makes every answer match, so ``strict`` changes nothing.
        """
        del strict
        if kwargs:
            raise ValueError(f"unsupported arguments {sorted(kwargs)}")
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw)
        return structured_runnable(self, schema, method, include_raw)

    # ---- whole answers ----------------------------------------------------------------------
    def _chat_call(self, messages: list[BaseMessage], stop: list[str] | None,
                   run_manager: Any, kwargs: dict[str, Any]) -> Call:
        """The call: the messages in chat form, under the grammar of the answer's shape
        (bound tools, a response format) with its instruction added, when one is asked."""
        kwargs = dict(kwargs)
        output = pop_output_format(kwargs)
        chat = with_instruction(to_chat(messages), output.instruction if output else None)
        return make_call(self, chat, stop, kwargs, call_run_ids(run_manager),
                         grammar=output.grammar if output else None,
                         tool_reply=bool(output and output.tools))

    @staticmethod
    def _result(answer: Answer, call: Call) -> ChatResult:
        metadata = message_metadata(answer, call.draft)
        if call.request.tool_reply:
            message = AIMessage(content=answer.content or "",
                                tool_calls=as_tool_calls(answer.tool_calls), **metadata)
        else:
            message = AIMessage(content=answer.text, **metadata)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        call = self._chat_call(messages, stop, run_manager, kwargs)
        return self._result(self.active_backend.complete(call.request), call)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        call = self._chat_call(messages, stop, run_manager, kwargs)
        return self._result(await self.active_backend.acomplete(call.request), call)

    # ---- streams ----------------------------------------------------------------------------
    @staticmethod
    def _chunks(delta: Delta, call: Call) -> Iterator[ChatGenerationChunk]:
        """Text deltas as chunks, then an empty last chunk carrying usage and metadata
        (merging chunks would concatenate strings repeated on every chunk).

        A tool-call reply comes as that last chunk alone: its JSON is the format, not the
        answer, so it is not streamed as text; the calls come as ``tool_call_chunks``."""
        tool_reply = call.request.tool_reply
        if delta.text and not tool_reply:
            yield ChatGenerationChunk(message=AIMessageChunk(content=delta.text))
        answer = delta.answer
        if answer is None:
            return
        metadata = message_metadata(answer, call.draft)
        if tool_reply:
            calls = tool_call_chunks(as_tool_calls(answer.tool_calls))
            yield ChatGenerationChunk(message=AIMessageChunk(
                content=answer.content or "", tool_call_chunks=calls, chunk_position="last",
                **metadata))
        else:
            yield ChatGenerationChunk(message=AIMessageChunk(
                content="", chunk_position="last", **metadata))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        call = self._chat_call(messages, stop, run_manager, kwargs)
        with closing(self.active_backend.stream(call.request)) as deltas:  # leaving early frees it
            for delta in deltas:
                yield from self._chunks(delta, call)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        call = self._chat_call(messages, stop, run_manager, kwargs)
        async with aclosing(await self.active_backend.astream(call.request)) as deltas:
            async for delta in deltas:
                for chunk in self._chunks(delta, call):
                    yield chunk

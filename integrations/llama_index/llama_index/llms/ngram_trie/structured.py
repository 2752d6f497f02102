"""Structured output by constrained decoding: the answer is generated under the output
class's JSON schema (``Grammar.json_schema``) and parsed with the Pydantic class.

LlamaIndex routes ``structured_predict`` of a function-calling LLM through a tool call
(``FunctionCallingProgram``). Here a direct JSON-schema grammar is better: no tool prompt
around the schema, and the JSON is valid for the schema by construction, token by token,
with the same speculation (the scaffolding the grammar forces is drafted for free).
``as_structured_llm`` goes through these methods too. ``pydantic_program_mode`` other
than DEFAULT keeps LlamaIndex's own programs (e.g. ``LLM`` for plain prompting).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.program.utils import FlexibleModel, process_streaming_objects
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from ngram_trie_rag.decoding.grammar import Grammar
from pydantic import BaseModel

dispatcher = get_dispatcher(__name__)
Model = TypeVar("Model", bound=BaseModel)


def schema_messages(messages: Sequence[ChatMessage],
                    output_cls: type[BaseModel]) -> list[ChatMessage]:
    """The prompt with the schema stated in its system message: the grammar keeps the
    shape, the statement tells the model what each field means."""
    text = ("Reply with a JSON object that matches this JSON schema: "
            f"{json.dumps(output_cls.model_json_schema())}")
    messages = list(messages)
    if messages and messages[0].role == MessageRole.SYSTEM and messages[0].content:
        text = f"{messages[0].content}\n\n{text}"
        messages = messages[1:]
    return [ChatMessage(role=MessageRole.SYSTEM, content=text), *messages]


def parse_response(response: ChatResponse, output_cls: type[Model]) -> Model:
    """The finished answer as ``output_cls``; a JSON cut by the token limit says so."""
    text = response.message.content or ""
    if response.additional_kwargs.get("finish_reason") == "length":
        raise ValueError(f"the {output_cls.__name__} JSON was cut by the token limit "
                         f"({response.additional_kwargs.get('completion_tokens')} tokens): "
                         f"pass a larger max_tokens in llm_kwargs; got {text!r}")
    return output_cls.model_validate_json(text)


class StructuredOutput:
    """``structured_predict`` and its async / streaming variants under the output class's
    grammar. Mixed into ``NGramTrieLLM`` (which provides ``chat``, ``achat``, ...)."""

    def _structured_call(self, output_cls: type[BaseModel], prompt: BasePromptTemplate,
                         llm_kwargs: dict[str, Any] | None,
                         prompt_args: dict[str, Any]) -> tuple[list[ChatMessage], dict]:
        """(messages, chat keyword arguments) of a structured call."""
        messages = self._get_messages(prompt, **prompt_args)  # type: ignore[attr-defined]
        kwargs = {**(llm_kwargs or {}), "grammar": Grammar.json_schema(output_cls)}
        return schema_messages(messages, output_cls), kwargs

    def _own_mode(self) -> bool:
        return self.pydantic_program_mode == PydanticProgramMode.DEFAULT  # type: ignore

    @dispatcher.span
    def structured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                           llm_kwargs: dict[str, Any] | None = None,
                           **prompt_args: Any) -> Model:
        """An ``output_cls`` generated under its JSON schema (see the module doc)."""
        if not self._own_mode():
            return super().structured_predict(  # type: ignore[misc]
                output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        result = parse_response(self.chat(messages, **kwargs), output_cls)  # type: ignore
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None,
                                  **prompt_args: Any) -> Model:
        if not self._own_mode():
            return await super().astructured_predict(  # type: ignore[misc]
                output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args))
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        response = await self.achat(messages, **kwargs)  # type: ignore[attr-defined]
        result = parse_response(response, output_cls)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    # The base class's stream_structured_predict / astream_structured_predict call these
    # (and send the events); they yield partial objects, then the validated one.
    def _structured_stream_call(self, output_cls: type[Model], prompt: BasePromptTemplate,
                                llm_kwargs: dict[str, Any] | None = None,
                                **prompt_args: Any) -> Generator[Model | FlexibleModel]:
        if not self._own_mode():
            return super()._structured_stream_call(  # type: ignore[misc]
                output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        stream = self.stream_chat(messages, **kwargs)  # type: ignore[attr-defined]
        return _partials(stream, output_cls)

    async def _structured_astream_call(
        self, output_cls: type[Model], prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any,
    ) -> AsyncGenerator[Model | FlexibleModel]:
        if not self._own_mode():
            return await super()._structured_astream_call(  # type: ignore[misc]
                output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        stream = await self.astream_chat(messages, **kwargs)  # type: ignore[attr-defined]
        return _apartials(stream, output_cls)


def _partial(response: ChatResponse, output_cls: type[Model],
             current: Model | FlexibleModel | None) -> Model | FlexibleModel:
    """The object so far (fields not yet complete are missing), or the validated object
    once the response is finished."""
    if "finish_reason" in response.additional_kwargs:
        return parse_response(response, output_cls)
    found = process_streaming_objects(response, output_cls,
                                      cur_objects=None if current is None else [current])
    assert not isinstance(found, list)
    return found


def _partials(stream: Any, output_cls: type[Model]) -> Generator[Model | FlexibleModel]:
    current = None
    for response in stream:
        current = _partial(response, output_cls, current)
        yield current


async def _apartials(stream: Any,
                     output_cls: type[Model]) -> AsyncGenerator[Model | FlexibleModel]:
    current = None
    async for response in stream:
        current = _partial(response, output_cls, current)
        yield current

"""``NGramTrieLLM``: the string-prompt (completion) counterpart of ``ChatNGramTrie``.

The prompt is tokenised as-is, with no chat template. Chat messages given to a model
without one read as the plain text every entry point gives such a model
(``ngram_trie_rag.inputs.messages_as_text``); to any other model, as LangChain's own
``Human: ...`` transcript.

``batch``/``abatch`` run each input as its own call: ``BaseLLM``'s batch sends every prompt
through one ``_generate`` holding only the first prompt's run manager, which would hand
every input the first input's documents.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, closing
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseLLM, LangSmithParams, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.prompt_values import ChatPromptValue, PromptValue, StringPromptValue
from langchain_core.runnables import Runnable, RunnableConfig
from ngram_trie_rag.backends import Answer, Delta
from ngram_trie_rag.inputs import has_chat_template, messages_as_text

from .calls import Call, make_call
from .messages import to_chat
from .metadata import generation_info, usage_metadata
from .registry import call_run_ids
from .settings import NGramTrieSettings


class NGramTrieLLM(NGramTrieSettings, BaseLLM):
    """Completion model whose answers are sped up by drafting from the retrieved documents.

    Example:
        ```python
        llm = NGramTrieLLM(max_tokens=64)
        chain = {"context": retriever | fmt, "question": RunnablePassthrough()} | prompt | llm
        ```

    The model is named or passed as for ``ChatNGramTrie`` (``model``/``model_id``: a hub
    id, folder or ``.gguf`` file, or a loaded model with ``tokenizer=``).

    Each generation's ``generation_info`` holds ``finish_reason``, ``usage`` and
    ``speculative`` (accept lengths, drafted nodes, steps, documents drafted from).

    On vLLM (the prompt goes to ``/completions`` or the engine as-is):

        ```python
        llm = NGramTrieLLM(base_url="http://127.0.0.1:8000/v1", model="smollm2")
        llm = NGramTrieLLM(backend="vllm", vllm_engine_args={"dtype": "float32"})
        await llm.abatch(prompts)  # one vLLM batch
        ```
    """

    @property
    def _llm_type(self) -> str:
        return "ngram-trie"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._settings_params()

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(**self._ls_params("llm", stop, kwargs))

    # ---- chat messages ------------------------------------------------------------------------
    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        """LangChain's conversion, except chat messages for a model without a chat template:
        those read as they do at every other entry point, ending on the line the model
        answers on, which LangChain's transcript lacks. A model with a template, or one
        whose tokenizer cannot be seen (a server), gets LangChain's transcript as before."""
        value = super()._convert_input(model_input)
        if isinstance(value, ChatPromptValue) and self._reads_plain_text():
            chat = to_chat(value.messages)
            name = self.active_backend.model_name
            return StringPromptValue(text=messages_as_text(chat, name))
        return value

    def _reads_plain_text(self) -> bool:
        tokenizer = self.active_backend.tokenizer
        return tokenizer is not None and not has_chat_template(tokenizer)

    # ---- one input per run --------------------------------------------------------------------
    def batch(self, inputs: list[LanguageModelInput],
              config: RunnableConfig | list[RunnableConfig] | None = None, *,
              return_exceptions: bool = False, **kwargs: Any) -> list[str]:
        """Each input as its own ``invoke`` (own run, own documents), on threads."""
        return Runnable.batch(self, inputs, config, return_exceptions=return_exceptions,
                              **kwargs)

    async def abatch(self, inputs: list[LanguageModelInput],
                     config: RunnableConfig | list[RunnableConfig] | None = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[str]:
        """Each input as its own ``ainvoke`` (own run, own documents), concurrently."""
        return await Runnable.abatch(self, inputs, config,
                                     return_exceptions=return_exceptions, **kwargs)

    # ---- whole answers ----------------------------------------------------------------------
    def _calls(self, prompts: list[str], stop: list[str] | None, run_manager: Any,
               kwargs: dict[str, Any]) -> list[Call]:
        # With several prompts only the first one's run is known here (see the module
        # docstring), so retrieved documents are used for single-prompt calls only; the
        # scope named in the metadata is every prompt's (one config for the whole call).
        ids = call_run_ids(run_manager)
        return [make_call(self, p, stop, kwargs, ids, retrieved=len(prompts) == 1)
                for p in prompts]

    @staticmethod
    def _result(answers: list[Answer], calls: list[Call]) -> LLMResult:
        generations: list[list[Generation]] = []
        totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        model_name = ""
        for answer, call in zip(answers, calls, strict=True):
            model_name = answer.model_name
            usage = usage_metadata(answer)
            for key in totals:
                totals[key] += usage[key]
            generations.append([Generation(
                text=answer.text, generation_info=generation_info(answer, call.draft))])
        return LLMResult(generations=generations,
                         llm_output={"token_usage": totals, "model_name": model_name})

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> LLMResult:
        calls = self._calls(prompts, stop, run_manager, kwargs)
        return self._result([self.active_backend.complete(c.request) for c in calls], calls)

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> LLMResult:
        calls = self._calls(prompts, stop, run_manager, kwargs)
        # All at once: vLLM batches them; the local engine takes them in turn.
        answers = await asyncio.gather(*(self.active_backend.acomplete(c.request) for c in calls))
        return self._result(list(answers), calls)

    # ---- streams ----------------------------------------------------------------------------
    @staticmethod
    def _chunks(delta: Delta, call: Call) -> Iterator[GenerationChunk]:
        """A text delta as a chunk; the answer as an empty last chunk whose
        ``generation_info`` has the stats."""
        if delta.text:
            yield GenerationChunk(text=delta.text)
        if delta.answer is not None:
            yield GenerationChunk(text="", generation_info={
                **generation_info(delta.answer, call.draft),
                "model_name": delta.answer.model_name})

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:
        call = make_call(self, prompt, stop, kwargs, call_run_ids(run_manager))
        with closing(self.active_backend.stream(call.request)) as deltas:  # leaving early frees it
            for delta in deltas:
                for chunk in self._chunks(delta, call):
                    if run_manager is not None and chunk.text:
                        run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        call = make_call(self, prompt, stop, kwargs, call_run_ids(run_manager))
        async with aclosing(await self.active_backend.astream(call.request)) as deltas:
            async for delta in deltas:
                for chunk in self._chunks(delta, call):
                    if run_manager is not None and chunk.text:
                        await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk

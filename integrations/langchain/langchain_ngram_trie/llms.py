"""``NGramTrieLLM``: the string-prompt (completion) counterpart of ``ChatNGramTrie``.

The prompt is tokenised as-is, with no chat template. ``batch``/``abatch`` run each input as
its own call: ``BaseLLM``'s batch sends every prompt through one ``_generate`` holding only
the first prompt's run manager, which would hand every input the first input's documents.
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
from langchain_core.runnables import Runnable, RunnableConfig
from ngram_trie_rag.threads import run_blocking

from .metadata import Answer, generation_info, usage_metadata
from .registry import call_run_ids
from .settings import NGramTrieSettings, Request


class NGramTrieLLM(NGramTrieSettings, BaseLLM):
    """Completion model whose answers are sped up by drafting from the retrieved documents.

    Example:
        ```python
        llm = NGramTrieLLM(max_tokens=64)
        chain = {"context": retriever | fmt, "question": RunnablePassthrough()} | prompt | llm
        ```

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
    def _requests(self, prompts: list[str], stop: list[str] | None, run_manager: Any,
                  kwargs: dict[str, Any]) -> list[Request]:
        # With several prompts only the first one's run is known here (see the module
        # docstring), so retrieved documents are used for single-prompt calls only; the
        # scope named in the metadata is every prompt's (one config for the whole call).
        ids = call_run_ids(run_manager)
        return [self._request(p, stop, kwargs, *ids, retrieved=len(prompts) == 1)
                for p in prompts]

    def _answers(self, requests: list[Request]) -> LLMResult:
        return self._result([self._generate_one(request) for request in requests])

    @staticmethod
    def _result(answers: list[Answer]) -> LLMResult:
        generations: list[list[Generation]] = []
        totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        model_name = ""
        for answer in answers:
            model_name = answer.model_name
            usage = usage_metadata(answer)
            for key in totals:
                totals[key] += usage[key]
            generations.append([Generation(text=answer.text,
                                           generation_info=generation_info(answer))])
        return LLMResult(generations=generations,
                         llm_output={"token_usage": totals, "model_name": model_name})

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> LLMResult:
        return self._answers(self._requests(prompts, stop, run_manager, kwargs))

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> LLMResult:
        requests = self._requests(prompts, stop, run_manager, kwargs)
        if self.runs_on == "local":
            return await run_blocking(self._answers, requests)
        # vLLM takes them all at once and batches them.
        return self._result(list(await asyncio.gather(
            *(self._agenerate_one(request) for request in requests))))

    # ---- streams ----------------------------------------------------------------------------
    @staticmethod
    def _chunk(delta: str, answer: Answer | None) -> GenerationChunk:
        """A text delta, or the empty last chunk whose ``generation_info`` has the stats."""
        if answer is None:
            return GenerationChunk(text=delta)
        return GenerationChunk(text="", generation_info={
            **generation_info(answer), "model_name": answer.model_name})

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:
        request = self._request(prompt, stop, kwargs, *call_run_ids(run_manager))
        with closing(self._deltas(request)) as pairs:  # leaving early frees the model
            for delta, answer in pairs:
                chunk = self._chunk(delta, answer)
                if run_manager is not None and chunk.text:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        request = self._request(prompt, stop, kwargs, *call_run_ids(run_manager))
        async with aclosing(self._adeltas(request)) as pairs:
            async for delta, answer in pairs:
                chunk = self._chunk(delta, answer)
                if run_manager is not None and chunk.text:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

"""``NGramTrieLLM``: the string-prompt (completion) counterpart of ``ChatNGramTrie``.

The prompt is tokenised as-is, with no chat template. ``batch``/``abatch`` run each input as
its own call: ``BaseLLM``'s batch sends every prompt through one ``_generate`` holding only
the first prompt's run manager, which would hand every input the first input's documents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseLLM, LangSmithParams, LanguageModelInput
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables import Runnable, RunnableConfig
from ngram_trie_rag.threads import iterate_blocking, run_blocking

from .metadata import generation_info, usage_metadata
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
        # docstring), so retrieved documents are used for single-prompt calls only.
        ids = call_run_ids(run_manager) if len(prompts) == 1 else (None, None)
        return [self._request(p, stop, kwargs, *ids) for p in prompts]

    def _answers(self, requests: list[Request]) -> LLMResult:
        generations: list[list[Generation]] = []
        totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        model_name = ""
        for request in requests:
            answer = self._generate_one(request)
            model_name = answer.model_name
            usage = usage_metadata(answer)
            for key in totals:
                totals[key] += usage[key]
            generations.append([Generation(text=answer.result.text,
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
        return await run_blocking(self._answers, requests)

    # ---- streams ----------------------------------------------------------------------------
    def _chunks(self, request: Request) -> Iterator[GenerationChunk]:
        """Text deltas, then an empty chunk whose ``generation_info`` carries the stats."""
        for delta, answer in self._deltas(request):
            if answer is None:
                yield GenerationChunk(text=delta)
            else:
                yield GenerationChunk(text="", generation_info={
                    **generation_info(answer), "model_name": answer.model_name})

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:
        request = self._request(prompt, stop, kwargs, *call_run_ids(run_manager))
        with closing(self._chunks(request)) as chunks:  # leaving early frees the model
            for chunk in chunks:
                if run_manager is not None and chunk.text:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        request = self._request(prompt, stop, kwargs, *call_run_ids(run_manager))
        async for chunk in iterate_blocking(lambda: self._chunks(request)):
            if run_manager is not None and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

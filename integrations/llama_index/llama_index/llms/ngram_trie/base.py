"""``NGramTrieLLM``: a LlamaIndex LLM whose drafts come from the retrieved nodes.

Speculative decoding with an n-gram trie built from the nodes the response synthesizer
received: the model verifies several drafted tokens per forward pass, and the answer is the
same as plain decoding (token for token when greedy). Which nodes belong to a call is found
through the instrumentation spans (``tracking``), so ``index.as_query_engine(llm=...)`` and
the chat engines need no extra wiring. The model may also run on vLLM (a server, or an engine
in this process; see ``ngram_trie_rag.backends``), the nodes travelling with each request.

Locally a call also drafts from the earlier answers of its scope (the index its nodes came
from, or a name in the instrument tags; see ``scopes``), kept in one ``AnswerStore`` per
scope (``ngram_trie_rag.wrappers.answer_scopes``); the answer joins that store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from ngram_trie_rag.backends import Request
from ngram_trie_rag.inputs import has_chat_template

from . import responses
from .calls import Call, option_changes
from .drafting import DraftItem, DraftSource, drafting_from, resolve_draft_source
from .function_calling import TOOL_REPLY, ToolCalling
from .prompts import Prompt, chat_prompt, completion_prompt
from .running import astreamed, awhole, streamed, whole
from .scopes import call_scope
from .settings import NGramTrieSettings
from .structured import StructuredOutput
from .tracking import get_tracker

if TYPE_CHECKING:
    from ngram_trie_rag import SpeculativeGenerator


class NGramTrieLLM(ToolCalling, StructuredOutput, CustomLLM, FunctionCallingLLM,
                   NGramTrieSettings):
    """Local Hugging Face causal LM with n-gram trie speculative decoding.

    Lossless: greedy answers equal ``model.generate(do_sample=False)``; with a temperature
    the sampling distribution is unchanged. The model is loaded on first use, once per
    process for a given model, device and dtype: instances that differ only in trie
    settings (``n``, ``prefix_len``) share its weights, tokenizer and lock. Each finished
    response carries the speculative statistics in ``additional_kwargs["speculative"]``
    and ``raw`` (see ``responses``).

    Draft source of a call, first match wins: ``documents=`` passed to the call, an
    enclosing ``with llm.drafting_from(nodes):`` block, the nodes the running query's
    response synthesizer received (after reranking), else the prompt itself.

    It is also a function-calling LLM: ``chat_with_tools`` (and ``FunctionAgent``) offers
    the tools in a system message and decodes the reply under a grammar built from their
    schemas; ``structured_predict`` and ``as_structured_llm`` decode under the output
    class's JSON schema; ``grammar=`` (an ``ngram_trie_rag.decoding.grammar.Grammar``)
    constrains any
    call. All of it is exact under speculation and drafts from the same sources.

    Options given as call keywords (``max_new_tokens`` or ``max_tokens``, ``temperature``,
    ``top_p``, ``top_k``, ``stop``, ``seed``, ``num_draft``, ``method``,
    ``repetition_stop``, ``grammar``) override the instance's for that call.

    Example::

        llm = NGramTrieLLM(max_new_tokens=128)
        engine = index.as_query_engine(llm=llm)
        engine.query("Who founded the company?")

    The model, as ``HuggingFaceLLM`` takes it: ``model_name`` (a hub id, a folder or a
    ``.gguf`` file; default: the packaged SmolLM2-135M-Instruct) with ``tokenizer_name``,
    ``model_kwargs``, ``tokenizer_kwargs``, ``device_map``, ``chat_template_kwargs``; or a
    model already loaded::

        model = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-360M-Instruct")
        llm = NGramTrieLLM(model=model, tokenizer=tokenizer)  # or tokenizer_name=...

    On vLLM, with the same draft sources, sent along with each request::

        llm = NGramTrieLLM(base_url="http://127.0.0.1:8000/v1", model_name="smollm2")
        llm = NGramTrieLLM(backend="vllm", vllm_engine_args={"dtype": "float32"})

    There ``speculative`` names the backend, the draft source and the number of documents,
    and holds vLLM's per-request ``acceptance`` when vLLM reports it (the in-process
    engine does; a server started with ``--per-request-spec-decode-metrics summary``
    does), else ``None``; ``raw`` has no ``token_ids``.
    """

    def __init__(self, generator: SpeculativeGenerator | None = None, **kwargs: Any) -> None:
        """``generator``: an already loaded ``SpeculativeGenerator`` to use instead of
        loading ``model_name`` (its own trie settings then apply)."""
        super().__init__(**kwargs)
        self._given_generator = generator
        self.check_all()
        # Attach the span tracker now: a query's spans must be followed from their start.
        get_tracker()

    @classmethod
    def class_name(cls) -> str:
        return "NGramTrieLLM"

    # ---- metadata ---------------------------------------------------------------------
    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=(self.context_window or self.active_backend.context_window
                            or DEFAULT_CONTEXT_WINDOW),
            num_output=self.max_new_tokens,
            is_chat_model=self.uses_chat_template(),
            is_function_calling_model=True,  # tool calls decode under a grammar anywhere
            model_name=self.model_label,
        )

    def uses_chat_template(self) -> bool:
        """Chat messages go through the model's chat template. A server's template cannot
        be seen from here: a model without a visible tokenizer counts as a chat model
        unless ``is_chat_model=False``."""
        if self.is_chat_model is not None:
            return self.is_chat_model
        tokenizer = self.active_backend.tokenizer
        return tokenizer is None or has_chat_template(tokenizer)

    def drafting_from(self, documents: Iterable[DraftItem]) -> AbstractContextManager[DraftSource]:
        """``with llm.drafting_from(nodes_or_texts):`` drafts every call in the block from
        them (for pipelines that hold the nodes themselves)."""
        return drafting_from(documents)

    # ---- a call, fixed when it is made ------------------------------------------------
    def _call(self, prompt: Prompt, kwargs: dict[str, Any]) -> Call:
        """The call's options, draft source and answer scope, fixed now: a stream is read
        after the query's spans have closed."""
        options = self.call_options(option_changes(kwargs))
        source = resolve_draft_source(kwargs.get("documents"))
        options, scope = self.with_answer_store(options, call_scope(source.retriever_scope))
        request = Request(prompt, source.documents, options,
                          tool_reply=bool(kwargs.get(TOOL_REPLY)))
        return Call(request, replace(source, answer_scope=scope), self.model_name)

    def _completion_call(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Call:
        return self._call(completion_prompt(self, prompt, formatted), kwargs)

    def _chat_call(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Call:
        return self._call(chat_prompt(self, messages), kwargs)

    # ---- sync -------------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Options as keyword arguments (see the class doc) and ``documents`` to draft
        from apply to this call."""
        call = self._completion_call(prompt, formatted, kwargs)
        return whole(self.active_backend, call, responses.completion)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        call = self._completion_call(prompt, formatted, kwargs)
        return streamed(self.active_backend, call, responses.completion)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return whole(self.active_backend, self._chat_call(messages, kwargs), responses.chat)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return streamed(self.active_backend, self._chat_call(messages, kwargs), responses.chat)

    # ---- async: the event loop stays free while the engine works -----------------------
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponse:
        call = self._completion_call(prompt, formatted, kwargs)
        return await awhole(self.active_backend, call, responses.completion)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        call = self._completion_call(prompt, formatted, kwargs)
        return await astreamed(self.active_backend, call, responses.completion)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await awhole(self.active_backend, self._chat_call(messages, kwargs), responses.chat)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage],
                           **kwargs: Any) -> ChatResponseAsyncGen:
        call = self._chat_call(messages, kwargs)
        return await astreamed(self.active_backend, call, responses.chat)

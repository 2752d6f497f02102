"""``NGramTrieLLM``: a LlamaIndex LLM whose drafts come from the retrieved nodes.

Speculative decoding with an n-gram trie built from the nodes the response synthesizer
received: the model verifies several drafted tokens per forward pass, and the answer is the
same as plain decoding (token for token when greedy). Which nodes belong to a call is found
through the instrumentation spans (``tracking``), so ``index.as_query_engine(llm=...)`` and
the chat engines need no extra wiring. The model may also run on vLLM (a server, or an engine
in this process; see ``backends``), the nodes travelling with each request.

Locally a call also drafts from the earlier answers of its scope (the index its nodes came
from, or a name in the instrument tags; see ``scopes``), kept in one ``AnswerStore`` per
scope (``ngram_trie_rag.answer_scopes``); the answer joins that store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, aclosing, closing
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
)
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import default_completion_to_prompt
from ngram_trie_rag import AnswerStore, GenerationStream, SpeculativeGenerator, shared_generator
from ngram_trie_rag.answer_scopes import (
    DEFAULT_MAX_SCOPES,
    DEFAULT_TOKENS_PER_SCOPE,
    AnswerMemory,
    AnswerScopes,
    check_answer_setting,
)
from ngram_trie_rag.loading import DEFAULT_MODEL_NAME
from ngram_trie_rag.serving.openai_http import DEFAULT_TIMEOUT_S, OpenAIHTTPBackend
from ngram_trie_rag.serving.server import DEFAULT_K
from ngram_trie_rag.threads import run_blocking
from ngram_trie_rag.validation import check_options, not_bool, refuse_bytes

from .backends import Outcome, Place, check_call_options, check_fields, place, vllm_options
from .drafting import DraftItem, DraftSource, drafting_from, resolve_draft_source
from .function_calling import TOOL_REPLY, ToolCalling
from .scopes import call_scope
from .streams import acollect, adeltas, collect, deltas
from .structured import StructuredOutput
from .tools import reply_message, streamed_content, template_messages
from .tracking import get_tracker

Prompt = str | list[dict[str, str]]
R = TypeVar("R", CompletionResponse, ChatResponse)
# Builds a response from (text so far, delta or None, outcome once finished, draft source).
Wrap = Callable[[str, str | None, Outcome | None, DraftSource], R]

# Per-call options a caller may pass as keyword arguments; anything else LlamaIndex passes
# along (e.g. ``formatted``) is not a generation option and is ignored. ``grammar``: an
# ``ngram_trie_rag.grammar.Grammar`` the answer must match (vLLM gets it as its
# structured outputs).
_OPTIONS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed",
            "num_draft", "method", "grammar")


@dataclass(frozen=True)
class _Request:
    """A call, fixed when it is made: prompt, draft source and generation options."""

    prompt: Prompt
    source: DraftSource
    options: dict[str, Any]
    tool_reply: bool = False  # the answer is a tool-call reply (JSON) to be parsed
    answer_store: AnswerStore | None = None  # the scope's earlier answers (local only)


class NGramTrieLLM(ToolCalling, StructuredOutput, CustomLLM, FunctionCallingLLM):
    """Local Hugging Face causal LM with n-gram trie speculative decoding.

    Lossless: greedy answers equal ``model.generate(do_sample=False)``; with a temperature
    the sampling distribution is unchanged. The model is loaded on first use, once per
    process for a given model, device and dtype: instances that differ only in trie
    settings (``n``, ``prefix_len``) share its weights, tokenizer and lock. Each response
    carries the speculative statistics in ``additional_kwargs["speculative"]`` and ``raw``.

    Draft source of a call, first match wins: ``documents=`` passed to the call, an
    enclosing ``with llm.drafting_from(nodes):`` block, the nodes the running query's
    response synthesizer received (after reranking), else the prompt itself.

    Locally it is also a function-calling LLM: ``chat_with_tools`` (and ``FunctionAgent``)
    offers the tools in a system message and decodes the reply under a grammar built from
    their schemas; ``structured_predict`` and ``as_structured_llm`` decode under the output
    class's JSON schema; ``grammar=`` (an ``ngram_trie_rag.grammar.Grammar``) constrains any
    call. All of it is exact under speculation and drafts from the same sources.

    Example::

        llm = NGramTrieLLM(max_new_tokens=128)
        engine = index.as_query_engine(llm=llm)
        engine.query("Who founded the company?")

    On vLLM, with the same draft sources, sent along with each request::

        llm = NGramTrieLLM(base_url="http://127.0.0.1:8000/v1", model_name="smollm2")
        llm = NGramTrieLLM(backend="vllm", vllm_engine_args={"dtype": "float32"})

    There ``speculative`` names the backend, the draft source and the number of documents,
    and holds vLLM's per-request ``acceptance`` when vLLM reports it (the in-process
    engine does; a server started with ``--per-request-spec-decode-metrics summary``
    does), else ``None``; ``raw`` has no ``token_ids``.
    """

    model_config = ConfigDict(protected_namespaces=())

    model_path: str | None = Field(
        default=None, description="Local Hugging Face model folder; None: the packaged default.")
    model_name: str | None = Field(
        default=None, description="Name reported in metadata; default: derived from the path. "
        "With base_url: the served model name (None asks the server).")
    backend: str = Field(
        default="local", description="'local' (this package's engine) or 'vllm' (vLLM's "
        "engine in this process, shared per model and engine arguments; in a script, make "
        "the first call under `if __name__ == '__main__':`, as vLLM spawns processes).")
    base_url: str | None = Field(
        default=None, description="A running vLLM OpenAI-compatible server "
        "(`ngram-trie-rag serve`), e.g. 'http://127.0.0.1:8000/v1'.")
    api_key: str | None = Field(
        default=None, description="Bearer token for base_url.", exclude=True, repr=False)
    request_timeout: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0, description="Seconds the base_url client waits on "
        "the server for each read.")
    vllm_engine_args: dict[str, Any] | None = Field(
        default=None, description="More AsyncEngineArgs for backend='vllm' (dtype, "
        "max_model_len, enforce_eager, kv_cache_memory_bytes, tensor_parallel_size...).")
    num_speculative_tokens: int = Field(
        default=DEFAULT_K, ge=1, description="backend='vllm': most tokens drafted per step.")
    device: str | None = Field(default=None, description="torch device; default CUDA if any.")
    dtype: str | None = Field(default=None, description="torch dtype; default fp32 on CPU.")
    max_new_tokens: int = Field(default=256, gt=0, description="Upper bound on answer tokens.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 keeps every token.")
    seed: int | None = Field(default=None, description="Sampling seed; None is random.")
    stop: list[str] | None = Field(default=None, description="Stop strings (not emitted).")
    n: int = Field(default=13, description="Trie window: prefix plus draft length (paper n).")
    prefix_len: int = Field(default=3, description="Longest matched prefix (paper L_p).")
    num_draft: int | None = Field(
        default=None, description="Draft tokens verified per step; None: generator default.")
    method: str | None = Field(
        default=None, description="'trie', 'chain' or 'none' (plain decoding, a baseline).")
    context_window: int | None = Field(
        default=None, description="Override the model's context window.")
    is_chat_model: bool | None = Field(
        default=None, description="Use the chat template; None: when the model has one.")
    remember_answers: bool = Field(
        default=True, description="Keep each scope's answers and draft later answers of that "
        "scope from them: the scope is the index a call's nodes came from, or the name in "
        "instrument_tags({'ngram_trie_scope': ...}); a call with neither keeps none. Greedy "
        "output is unchanged. Local engine only.")
    answer_store: AnswerStore | None = Field(
        default=None, exclude=True, description="One AnswerStore for every call, whatever "
        "its scope: answers cross scopes (the opt-in). Local engine only.")
    max_answer_scopes: int = Field(
        default=DEFAULT_MAX_SCOPES, description="Scopes whose answers are kept; past it the "
        "least recently used scope is dropped.")
    max_tokens_per_scope: int = Field(
        default=DEFAULT_TOKENS_PER_SCOPE, description="Tokens kept per scope; past it a "
        "scope's oldest answers are dropped first.")

    _generator: SpeculativeGenerator | None = PrivateAttr(default=None)
    _vllm: Any = PrivateAttr(default=None)  # the vLLM backend, made on first use
    _answer_memory: AnswerMemory = PrivateAttr(default_factory=AnswerMemory)

    def __init__(self, generator: SpeculativeGenerator | None = None, **kwargs: Any) -> None:
        """``generator``: an already loaded ``SpeculativeGenerator`` to use instead of
        loading ``model_path`` (its own trie settings then apply)."""
        super().__init__(**kwargs)
        given = set(self.model_fields_set) | ({"generator"} if generator is not None else set())
        check_fields(self.runs_on, given)  # also refuses unknown or contradicting backends
        self._generator = generator
        self._answer_memory = AnswerMemory.from_settings(
            self.remember_answers, self.answer_store, self.max_answer_scopes,
            self.max_tokens_per_scope, given=given)
        # Attach the span tracker now: a query's spans must be followed from their start.
        get_tracker()

    @field_validator("n", "prefix_len", "num_draft", "max_new_tokens", "temperature", "top_p",
                     "top_k", "seed", "num_speculative_tokens", "request_timeout",
                     "context_window", mode="before")
    @classmethod
    def _numbers_are_not_bools(cls, value: Any, info: ValidationInfo) -> Any:
        return not_bool(str(info.field_name), value)

    @field_validator("remember_answers", "answer_store", "max_answer_scopes",
                     "max_tokens_per_scope", mode="before")
    @classmethod
    def _check_answer_setting(cls, value: Any, info: ValidationInfo) -> Any:
        return check_answer_setting(str(info.field_name), value)

    @classmethod
    def class_name(cls) -> str:
        return "NGramTrieLLM"

    # ---- model and metadata -----------------------------------------------------------
    @property
    def runs_on(self) -> Place:
        """``"local"``, ``"vllm"`` (in this process) or ``"vllm-server"``."""
        return place(self.backend, self.base_url, "backend" in self.model_fields_set)

    @property
    def vllm(self) -> Any:
        """The vLLM backend (``OpenAIHTTPBackend`` or a shared ``VLLMEngine``), made on
        first access; both have ``stream``/``astream``/``complete``/``acomplete``."""
        if self._vllm is None:
            if self.runs_on == "vllm-server":
                assert self.base_url is not None
                self._vllm = OpenAIHTTPBackend(self.base_url, self.model_name,
                                               api_key=self.api_key,
                                               timeout=self.request_timeout)
            elif self.runs_on == "vllm":
                from ngram_trie_rag.serving.vllm_local import shared_vllm_engine

                self._vllm = shared_vllm_engine(
                    self.model_path, num_speculative_tokens=self.num_speculative_tokens,
                    engine_args=self.vllm_engine_args)
            else:
                raise RuntimeError("this LLM runs on the local engine, not on vLLM")
        return self._vllm

    @property
    def generator(self) -> SpeculativeGenerator:
        """The shared generator, loaded on first access."""
        if self._generator is None:
            self._generator = shared_generator(self.model_path, device=self.device,
                                               dtype=self.dtype, n=self.n,
                                               prefix_len=self.prefix_len)
        return self._generator

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window or self._model_context_window(),
            num_output=self.max_new_tokens,
            is_chat_model=self._uses_chat_template(),
            is_function_calling_model=True,  # tool calls decode under a grammar anywhere
            model_name=self.model_name or self._default_name(),
        )

    def _model_context_window(self) -> int:
        if self.runs_on == "local":
            return self.generator.context_window
        return self.vllm.context_window or DEFAULT_CONTEXT_WINDOW

    def _default_name(self) -> str:
        if self._generator is not None:
            return self._generator.model_name
        if self.runs_on != "local":
            return self.vllm.model_name
        return self.model_path or DEFAULT_MODEL_NAME

    def _uses_chat_template(self) -> bool:
        """Chat messages go through the model's chat template. A server's template cannot
        be seen from here: a base_url model counts as a chat model unless
        ``is_chat_model=False``."""
        if self.is_chat_model is not None:
            return self.is_chat_model
        if self.runs_on == "vllm-server":
            return True
        tokenizer = self.vllm.tokenizer if self.runs_on == "vllm" else self.generator.tokenizer
        return bool(getattr(tokenizer, "chat_template", None))

    @property
    def answer_scopes(self) -> AnswerScopes:
        """The per-scope answer stores (e.g. ``forget(scope)`` once its index changes)."""
        return self._answer_memory.scopes

    def drafting_from(self, documents: Iterable[DraftItem]) -> AbstractContextManager[DraftSource]:
        """``with llm.drafting_from(nodes_or_texts):`` drafts every call in the block from
        them (for pipelines that hold the nodes themselves)."""
        return drafting_from(documents)

    # ---- requests ---------------------------------------------------------------------
    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> Prompt:
        """Messages for the model's chat template, or one string when it has none; earlier
        tool calls and results rewritten into the template's roles (see ``tools``)."""
        messages = template_messages(messages)
        if not self._uses_chat_template():
            return self.messages_to_prompt(messages)
        return [{"role": _role(m.role), "content": m.content or ""} for m in messages]

    def _completion_prompt(self, prompt: str, formatted: bool) -> Prompt:
        """A formatted prompt goes as-is; otherwise a chat model gets it as the user turn."""
        if formatted:
            return prompt
        if self.completion_to_prompt is not default_completion_to_prompt:
            return self.completion_to_prompt(prompt)
        if not self._uses_chat_template():
            return prompt
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": prompt}]

    def _request(self, prompt: Prompt, kwargs: dict[str, Any]) -> _Request:
        """Fix the draft source now: a stream is read after the query's spans closed."""
        options: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop, "seed": self.seed,
            "num_draft": self.num_draft, "method": self.method,
        }
        if kwargs.get("max_tokens") is not None:  # the usual LlamaIndex spelling
            options["max_new_tokens"] = kwargs["max_tokens"]
        check_call_options(self.runs_on, kwargs)
        options.update({k: kwargs[k] for k in _OPTIONS if kwargs.get(k) is not None})
        check_options(**{k: v for k, v in options.items() if k != "grammar"})
        refuse_bytes(kwargs.get("documents"))
        source = resolve_draft_source(kwargs.get("documents"))
        tool_reply = bool(kwargs.get(TOOL_REPLY))
        if self.runs_on != "local":  # vLLM drafts with its own proposer: no answer stores
            return _Request(prompt, source, options, tool_reply)
        seeded = options["temperature"] > 0 and options["seed"] is not None
        store, scope = self._answer_memory.store_for(call_scope(source.retriever_scope),
                                               seeded_sampling=seeded)
        return _Request(prompt, replace(source, answer_scope=scope), options, tool_reply, store)

    def _completion_request(self, prompt: str, formatted: bool,
                            kwargs: dict[str, Any]) -> _Request:
        return self._request(self._completion_prompt(prompt, formatted), kwargs)

    def _chat_request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> _Request:
        return self._request(self._chat_prompt(messages), kwargs)

    def _open(self, request: _Request) -> GenerationStream:
        """Blocking: encode the prompt and documents; generation starts on first ``next``."""
        return self.generator.stream(request.prompt, request.source.documents,
                                     answer_store=request.answer_store, **request.options)

    def _info(self, outcome: Outcome, source: DraftSource) -> tuple[dict, dict]:
        """(additional_kwargs, raw) of a finished call; ``speculative`` holds the engine's
        counters (``store_answers``: earlier answers drafted from) and the answer scope."""
        stats = {**outcome.speculative, "answer_scope": source.answer_scope}
        usage = {
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        }
        extra = {
            "model_name": self.metadata.model_name,
            "finish_reason": outcome.finish_reason,
            **usage,
            "speculative": stats,
            "draft_origin": source.origin,
            "draft_node_ids": list(source.node_ids),
        }
        raw = {
            "usage": usage,
            "finish_reason": outcome.finish_reason,
            **({"token_ids": outcome.token_ids} if outcome.token_ids is not None else {}),
            "speculative": stats,
            "draft_origin": source.origin,
            "draft_node_ids": list(source.node_ids),
            "draft_texts": list(source.texts),
        }
        return extra, raw

    def _completion(self, text: str, delta: str | None, outcome: Outcome | None,
                    source: DraftSource) -> CompletionResponse:
        if outcome is None:
            return CompletionResponse(text=text, delta=delta)
        extra, raw = self._info(outcome, source)
        return CompletionResponse(text=text, delta=delta, additional_kwargs=extra, raw=raw)

    def _chat(self, text: str, delta: str | None, outcome: Outcome | None,
              source: DraftSource) -> ChatResponse:
        message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
        if outcome is None:
            return ChatResponse(message=message, delta=delta)
        extra, raw = self._info(outcome, source)
        return ChatResponse(message=message, delta=delta, additional_kwargs=extra, raw=raw)

    def _tool_chat(self, text: str, delta: str | None, outcome: Outcome | None,
                   source: DraftSource) -> ChatResponse:
        """A tool-call reply: the message holds its content and calls, never the JSON
        (kept in ``raw["reply"]``). While streaming, ``delta`` is new answer text only, so
        an agent's stream shows the answer and not the JSON around it."""
        before = streamed_content(text[: len(text) - len(delta or "")])
        if outcome is None:
            content = streamed_content(text)
            message = ChatMessage(role=MessageRole.ASSISTANT, content=content)
            return ChatResponse(message=message, delta=content[len(before):])
        message = reply_message(text)
        content = message.content or ""
        if delta is not None:  # the rest of the answer (none when the reply was calls)
            delta = content[len(before):] if content.startswith(before) else ""
        extra, raw = self._info(outcome, source)
        return ChatResponse(message=message, delta=delta, additional_kwargs=extra,
                            raw={**raw, "reply": text})

    def _chat_wrap(self, request: _Request) -> Wrap[ChatResponse]:
        return self._tool_chat if request.tool_reply else self._chat

    # ---- one call, any response type ---------------------------------------------------
    # Locally the stream is opened (prompt and documents encoded) when the call is made,
    # so bad input raises there and not on the first read.
    def _whole(self, request: _Request, wrap: Wrap[R]) -> R:
        if self.runs_on != "local":
            last = self.vllm.complete(request.prompt, request.source.documents,
                                      vllm_options(request.options))
            outcome = self._vllm_outcome(last.text, last, request.source)
            return wrap(outcome.text, None, outcome, request.source)
        result = collect(self._open(request))
        return wrap(result.text, None, Outcome.from_result(result), request.source)

    def _streamed(self, request: _Request, wrap: Wrap[R]) -> Iterator[R]:
        step = _accumulate(request.source, wrap)
        if self.runs_on != "local":
            return (step(delta, outcome) for delta, outcome in self._vllm_pairs(request))
        return (step(delta, None if result is None else Outcome.from_result(result))
                for delta, result in deltas(self._open(request)))

    async def _awhole(self, request: _Request, wrap: Wrap[R]) -> R:
        if self.runs_on != "local":
            last = await self.vllm.acomplete(request.prompt, request.source.documents,
                                             vllm_options(request.options))
            outcome = self._vllm_outcome(last.text, last, request.source)
            return wrap(outcome.text, None, outcome, request.source)
        result = await acollect(await run_blocking(self._open, request))
        return wrap(result.text, None, Outcome.from_result(result), request.source)

    async def _astreamed(self, request: _Request, wrap: Wrap[R]) -> AsyncIterator[R]:
        step = _accumulate(request.source, wrap)
        if self.runs_on != "local":
            return (step(delta, outcome) async for delta, outcome in self._avllm_pairs(request))
        pairs = adeltas(await run_blocking(self._open, request))
        return (step(delta, None if result is None else Outcome.from_result(result))
                async for delta, result in pairs)

    # ---- vLLM: deltas as (text delta, outcome once finished) ---------------------------
    def _vllm_outcome(self, text: str, last: Any, source: DraftSource) -> Outcome:
        return Outcome.from_vllm(self.vllm.name, text, last, len(source.texts))

    def _vllm_pair(self, text: list[str], delta: Any,
                   source: DraftSource) -> tuple[str, Outcome | None] | None:
        """One vLLM delta as (text delta, outcome once finished), or None when it carries
        nothing; ``text`` collects the answer so far."""
        text.append(delta.text)
        if delta.finish_reason is not None:
            return delta.text, self._vllm_outcome("".join(text), delta, source)
        return (delta.text, None) if delta.text else None

    def _vllm_pairs(self, request: _Request) -> Iterator[tuple[str, Outcome | None]]:
        """Blocking; closing it early aborts the request."""
        text: list[str] = []
        stream = self.vllm.stream(request.prompt, request.source.documents,
                                  vllm_options(request.options))
        with closing(stream):
            for delta in stream:
                if (pair := self._vllm_pair(text, delta, request.source)) is not None:
                    yield pair

    async def _avllm_pairs(self, request: _Request) -> AsyncIterator[tuple[str, Outcome | None]]:
        """Awaited; every call reaches vLLM at once, and vLLM batches them."""
        text: list[str] = []
        stream = self.vllm.astream(request.prompt, request.source.documents,
                                   vllm_options(request.options))
        async with aclosing(stream):
            async for delta in stream:
                if (pair := self._vllm_pair(text, delta, request.source)) is not None:
                    yield pair

    # ---- sync -------------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Options as keyword arguments (``max_new_tokens``, ``temperature``, ``stop``,
        ``documents`` to draft from, ...) override the instance's for this call."""
        return self._whole(self._completion_request(prompt, formatted, kwargs), self._completion)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponseGen:
        request = self._completion_request(prompt, formatted, kwargs)
        return self._streamed(request, self._completion)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._chat_request(messages, kwargs)
        return self._whole(request, self._chat_wrap(request))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request = self._chat_request(messages, kwargs)
        return self._streamed(request, self._chat_wrap(request))

    # ---- async: generation runs on the generation pool, the event loop stays free -----
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False,
                        **kwargs: Any) -> CompletionResponse:
        request = self._completion_request(prompt, formatted, kwargs)
        return await self._awhole(request, self._completion)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        request = self._completion_request(prompt, formatted, kwargs)
        return await self._astreamed(request, self._completion)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request = self._chat_request(messages, kwargs)
        return await self._awhole(request, self._chat_wrap(request))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage],
                           **kwargs: Any) -> ChatResponseAsyncGen:
        request = self._chat_request(messages, kwargs)
        return await self._astreamed(request, self._chat_wrap(request))


def _accumulate(source: DraftSource,
                wrap: Wrap[R]) -> Callable[[str, Outcome | None], R]:
    """A stream's response maker: each delta becomes a response holding the text so far."""
    text = ""

    def step(delta: str, outcome: Outcome | None) -> R:
        nonlocal text
        text += delta
        return wrap(text, delta, outcome, source)

    return step


def _role(role: MessageRole | str) -> str:
    return role.value if isinstance(role, MessageRole) else str(role)

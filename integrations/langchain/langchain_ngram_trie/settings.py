"""Fields and per-call options shared by the chat model and the string LLM.

Both classes turn a LangChain call into one request: resolve the options (instance
defaults, overridden per call), pick the draft documents, then generate or stream, on the
local ``SpeculativeGenerator`` or on vLLM (see ``backends``). Keeping that here means the two
front ends differ only in how they build the prompt and package the answer.

Locally a call also drafts from the earlier answers of its scope (``scopes``), kept in one
``AnswerStore`` per scope (``ngram_trie_rag.answer_scopes``); the answer joins that store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing, closing
from dataclasses import dataclass, replace
from typing import Any, Literal
from uuid import UUID

from ngram_trie_rag import AnswerStore, SpeculativeGenerator, shared_generator
from ngram_trie_rag.answer_scopes import (
    DEFAULT_MAX_SCOPES,
    DEFAULT_TOKENS_PER_SCOPE,
    AnswerMemory,
    AnswerScopes,
    check_answer_setting,
    check_answer_settings,
)
from ngram_trie_rag.loading import DEFAULT_MODEL_NAME
from ngram_trie_rag.serving.openai_http import DEFAULT_TIMEOUT_S, OpenAIHTTPBackend
from ngram_trie_rag.serving.server import DEFAULT_K
from ngram_trie_rag.threads import iterate_blocking, run_blocking
from ngram_trie_rag.validation import check_options, not_bool, refuse_bytes
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .backends import Place, check_call_options, check_fields, place, vllm_options
from .documents import DraftDocuments, choose_documents
from .metadata import Answer
from .registry import document_registry, install
from .scopes import call_scope

PROVIDER = "ngram_trie"  # LangSmith provider name

# Per-call keywords that map onto generator options (LangChain's name -> the core's).
CALL_OPTIONS = {"max_tokens": "max_new_tokens", "temperature": "temperature",
                "top_p": "top_p", "top_k": "top_k", "seed": "seed", "num_draft": "num_draft",
                "draft_method": "method"}
# The core's option names as a LangChain user spells them, for error messages.
OPTION_NAMES = {core: name for name, core in CALL_OPTIONS.items()}
# Keywords LangChain itself may pass along that carry no generation option.
IGNORED_KWARGS = {"stream"}


@dataclass
class Request:
    """One generation: the prompt, what to draft from, and the generator options."""

    prompt: Any
    draft: DraftDocuments
    options: dict[str, Any]
    answer_store: AnswerStore | None = None  # the call's scope's earlier answers (local only)


class NGramTrieSettings(BaseModel):
    """Model, trie and sampling settings; every sampling field can be overridden per call
    (``invoke(..., max_tokens=..., temperature=...)`` or ``bind``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    model: str | None = None
    """A local Hugging Face causal-LM folder; ``None`` loads the packaged
    SmolLM2-135M-Instruct. Loaded on first use, then shared process-wide. With
    ``base_url``: the served model name (``None`` asks the server)."""
    backend: str = "local"
    """``"local"``: this package's engine. ``"vllm"``: vLLM's engine in this process
    (needs vLLM installed), shared per model and engine arguments, batching concurrent
    calls; ``model`` is then a Hugging Face folder as for ``"local"``. vLLM starts its
    processes with ``spawn`` on a CPU: in a script, make the first call under
    ``if __name__ == "__main__":``."""
    base_url: str | None = None
    """A running vLLM OpenAI-compatible server (``ngram-trie-rag serve``), e.g.
    ``"http://127.0.0.1:8000/v1"``; each request sends its documents along."""
    api_key: SecretStr | None = None
    """Bearer token for ``base_url`` (when the server was started with ``--api-key``)."""
    request_timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """Seconds the ``base_url`` client waits on the server for each read."""
    vllm_engine_args: dict[str, Any] | None = None
    """More ``AsyncEngineArgs`` for ``backend="vllm"`` (``dtype``, ``max_model_len``,
    ``enforce_eager``, ``kv_cache_memory_bytes``, ``tensor_parallel_size``...)."""
    num_speculative_tokens: int = Field(default=DEFAULT_K, ge=1)
    """``backend="vllm"``: the most tokens a request drafts per step."""
    device: str | None = None
    """``"cpu"``, ``"cuda"``...; ``None``: CUDA when available, else CPU."""
    dtype: str | None = None
    """``"float32"``, ``"bfloat16"``...; ``None``: fp32 on CPU (exact), bf16 on CUDA."""
    generator: SpeculativeGenerator | None = Field(default=None, exclude=True)
    """An already built generator to use instead of ``model``/``device``/``dtype``."""

    n: int = Field(default=13, ge=2)
    """Trie window: prefix + suffix tokens per sample (paper: 13)."""
    prefix_len: int = Field(default=3, ge=1)
    """Longest matched prefix L_p (paper: 3); must be below ``n``."""
    num_draft: int | None = Field(default=None, ge=1)
    """Pin the draft nodes verified per step; ``None`` lets the generator adapt it to
    how well drafts are being accepted and what a wider verification costs."""
    draft_method: Literal["trie", "backoff", "chain", "none"] | None = None
    """``"trie"`` (default), ``"chain"`` (prompt-lookup style) or ``"none"`` (plain
    decoding, e.g. as a baseline: ``llm.bind(draft_method="none")``)."""

    max_tokens: int = Field(default=256, ge=1)
    """Upper bound on new tokens."""
    temperature: float = Field(default=0.0, ge=0.0)
    """0 is greedy (token-identical to plain decoding); above 0 samples losslessly."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    """0 keeps every token."""
    seed: int | None = None
    """Sampling seed. Sampled answers repeat exactly when ``num_draft`` is pinned too: an
    adaptive draft size follows measured latencies, and the draws depend on the tree."""
    stop: list[str] | None = None
    """Stop strings; the answer ends before the first one."""
    use_retrieved_documents: bool = True
    """Draft from the documents retrieved in the enclosing chain (when no ``documents``
    are passed); ``False`` always drafts from the prompt."""
    remember_answers: bool = True
    """Keep each scope's answers and draft later answers of that scope from them: the
    scope is the retriever a call's documents came from, or the name in
    ``config={"metadata": {"ngram_trie_scope": ...}}``; a call with neither keeps none.
    Greedy output is unchanged. Local engine only."""
    answer_store: AnswerStore | None = Field(default=None, exclude=True)
    """One ``AnswerStore`` for every call, whatever its scope: answers cross scopes (the
    opt-in). Local engine only."""
    max_answer_scopes: int = DEFAULT_MAX_SCOPES
    """Scopes whose answers are kept; past it the least recently used scope is dropped."""
    max_tokens_per_scope: int = DEFAULT_TOKENS_PER_SCOPE
    """Tokens kept per scope; past it a scope's oldest answers are dropped first."""

    _vllm: Any = PrivateAttr(default=None)  # the vLLM backend, made on first use
    _answer_memory: AnswerMemory = PrivateAttr(default_factory=AnswerMemory)

    @field_validator("n", "prefix_len", "num_draft", "max_tokens", "temperature", "top_p",
                     "top_k", "seed", "num_speculative_tokens", "request_timeout",
                     mode="before")
    @classmethod
    def _numbers_are_not_bools(cls, value: Any, info: ValidationInfo) -> Any:
        return not_bool(str(info.field_name), value)

    @field_validator("remember_answers", "answer_store", "max_answer_scopes",
                     "max_tokens_per_scope", mode="before")
    @classmethod
    def _check_answer_setting(cls, value: Any, info: ValidationInfo) -> Any:
        return check_answer_setting(str(info.field_name), value)

    @model_validator(mode="after")
    def _check_answer_settings(self) -> NGramTrieSettings:
        check_answer_settings(self.remember_answers, self.answer_store, self.model_fields_set)
        return self

    @model_validator(mode="after")
    def _check_trie_shape(self) -> NGramTrieSettings:
        if self.prefix_len >= self.n:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be below n ({self.n})")
        return self

    @model_validator(mode="after")
    def _check_backend(self) -> NGramTrieSettings:
        check_fields(self.runs_on, self.model_fields_set)
        return self

    @property
    def runs_on(self) -> Place:
        """``"local"``, ``"vllm"`` (in this process) or ``"vllm-server"``."""
        return place(self.backend, self.base_url, "backend" in self.model_fields_set)

    def model_post_init(self, context: Any, /) -> None:
        # A chain can only run a model that exists, so registering the retrieved-documents
        # handler here is early enough, and importing the package registers nothing.
        install()
        super().model_post_init(context)
        self._answer_memory = AnswerMemory(self.remember_answers, self.answer_store,
                                     AnswerScopes(self.max_answer_scopes,
                                                  self.max_tokens_per_scope))

    @property
    def answer_scopes(self) -> AnswerScopes:
        """The per-scope answer stores (e.g. ``forget(scope)`` once its documents change)."""
        return self._answer_memory.scopes

    # ---- the generator --------------------------------------------------------------------
    def load_generator(self) -> SpeculativeGenerator:
        """The generator (loads the model on first use; slow once, then cached)."""
        if self.generator is not None:
            return self.generator
        return shared_generator(self.model, device=self.device, dtype=self.dtype,
                                n=self.n, prefix_len=self.prefix_len)

    def load_vllm(self) -> Any:
        """The vLLM backend (``OpenAIHTTPBackend`` or a shared ``VLLMEngine``); both have
        ``stream``/``astream``/``complete``/``acomplete`` yielding ``Delta``s."""
        if self._vllm is None:
            if self.runs_on == "vllm-server":
                assert self.base_url is not None
                key = self.api_key.get_secret_value() if self.api_key else None
                self._vllm = OpenAIHTTPBackend(self.base_url, self.model, api_key=key,
                                               timeout=self.request_timeout)
            else:
                from ngram_trie_rag.serving.vllm_local import shared_vllm_engine

                self._vllm = shared_vllm_engine(
                    self.model, num_speculative_tokens=self.num_speculative_tokens,
                    engine_args=self.vllm_engine_args)
        return self._vllm

    @property
    def model_label(self) -> str:
        """The model's name without loading it (for tracing parameters)."""
        if self.generator is not None:
            return self.generator.model_name
        if self.runs_on == "vllm-server":
            return self.model or str(self.base_url)
        return self.model or DEFAULT_MODEL_NAME

    def _ls_params(self, model_type: str, stop: list[str] | None,
                   kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """LangSmith tracing parameters shared by the chat model and the string LLM."""
        model = kwargs.get("model")
        params: dict[str, Any] = {
            "ls_provider": PROVIDER,
            "ls_model_name": model if isinstance(model, str) else self.model_label,
            "ls_model_type": model_type,
            "ls_temperature": kwargs.get("temperature", self.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", self.max_tokens),
        }
        stop = stop or self.stop
        if stop:
            params["ls_stop"] = list(stop)
        return params

    def _settings_params(self) -> dict[str, Any]:
        sampling = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                    "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        if self.runs_on == "vllm-server":
            return {"model": self.model_label, "base_url": self.base_url, **sampling}
        if self.runs_on == "vllm":
            return {"model": self.model_label, "backend": "vllm",
                    "num_speculative_tokens": self.num_speculative_tokens,
                    "vllm_engine_args": self.vllm_engine_args, **sampling}
        return {"model": self.model_label, "device": self.device, "dtype": self.dtype,
                "n": self.n, "prefix_len": self.prefix_len, "num_draft": self.num_draft,
                "draft_method": self.draft_method, **sampling}

    # ---- one call ---------------------------------------------------------------------------
    def _request(self, prompt: Any, stop: list[str] | None, kwargs: Mapping[str, Any],
                 run_id: UUID | None, parent_run_id: UUID | None, *,
                 retrieved: bool = True) -> Request:
        """Options from the instance and this call's keywords, the draft documents (those
        retrieved above the run unless ``retrieved`` is False) and the answer store."""
        unknown = set(kwargs) - set(CALL_OPTIONS) - IGNORED_KWARGS - {"documents"}
        if unknown:
            raise TypeError(f"unsupported keyword arguments {sorted(unknown)}; "
                            f"supported: {sorted([*CALL_OPTIONS, 'documents', 'stop'])}")
        check_call_options(self.runs_on, kwargs)
        options = {core: kwargs.get(name, getattr(self, name))
                   for name, core in CALL_OPTIONS.items()}
        options["stop"] = list(stop) if stop else (list(self.stop) if self.stop else None)
        check_options(OPTION_NAMES, **options)
        refuse_bytes(kwargs.get("documents"))
        ids = (run_id, parent_run_id) if retrieved else (None, None)
        draft = choose_documents(kwargs.get("documents"), *ids, self.use_retrieved_documents)
        if self.runs_on != "local":  # vLLM drafts with its own proposer: no answer stores
            return Request(prompt, draft, options)
        scope = call_scope(document_registry().scope_names(run_id, parent_run_id),
                           draft.retriever_scopes)
        seeded = options["temperature"] > 0 and options["seed"] is not None
        store, reported = self._answer_memory.store_for(scope, seeded_sampling=seeded)
        return Request(prompt, replace(draft, answer_scope=reported), options, store)

    def _deltas(self, request: Request) -> Iterator[tuple[str, Answer | None]]:
        """Blocking: ``(delta, None)`` for each non-empty text delta as it is verified,
        then ``("", answer)`` once finished. Closing it early stops generation and frees
        the model (on vLLM: aborts the request)."""
        if self.runs_on != "local":
            yield from self._vllm_deltas(request)
            return
        gen = self.load_generator()
        with gen.stream(request.prompt, request.draft.texts, answer_store=request.answer_store,
                        **request.options) as stream:
            for delta in stream:
                if delta:
                    yield delta, None
        assert stream.result is not None
        yield "", Answer.from_result(gen.model_name, stream.result, request.draft)

    async def _adeltas(self, request: Request) -> AsyncIterator[tuple[str, Answer | None]]:
        """``_deltas`` for the event loop: the local engine runs on one pool worker (its
        lock serialises calls); vLLM gets every call at once and batches them."""
        if self.runs_on == "local":
            async with aclosing(iterate_blocking(lambda: self._deltas(request))) as pairs:
                async for pair in pairs:
                    yield pair
            return
        backend = self.load_vllm()
        text: list[str] = []
        deltas = backend.astream(request.prompt, request.draft.texts,
                                 vllm_options(request.options))
        async with aclosing(deltas):  # leaving early aborts the request
            async for delta in deltas:
                for pair in self._vllm_pairs(backend, text, delta, request):
                    yield pair

    def _vllm_deltas(self, request: Request) -> Iterator[tuple[str, Answer | None]]:
        backend = self.load_vllm()
        text: list[str] = []
        deltas = backend.stream(request.prompt, request.draft.texts,
                                vllm_options(request.options))
        with closing(deltas):  # leaving early aborts the request
            for delta in deltas:
                yield from self._vllm_pairs(backend, text, delta, request)

    @staticmethod
    def _vllm_pairs(backend: Any, text: list[str], delta: Any,
                    request: Request) -> Iterator[tuple[str, Answer | None]]:
        """One vLLM ``Delta`` as ``_deltas`` pairs; ``text`` collects the answer so far."""
        if delta.text:
            text.append(delta.text)
            yield delta.text, None
        if delta.finish_reason is not None:
            yield "", Answer.from_vllm(backend.name, backend.model_name, "".join(text), delta,
                                       request.draft)

    def _generate_one(self, request: Request) -> Answer:
        """Blocking: the whole answer."""
        if self.runs_on != "local":
            backend = self.load_vllm()
            last = backend.complete(request.prompt, request.draft.texts,
                                    vllm_options(request.options))
            return Answer.from_vllm(backend.name, backend.model_name, last.text, last,
                                    request.draft)
        for _, answer in self._deltas(request):
            if answer is not None:
                return answer
        raise AssertionError("a generation ends with its answer")

    async def _agenerate_one(self, request: Request) -> Answer:
        """The whole answer, awaited: the local engine on the generation pool, vLLM
        concurrently with every other call."""
        if self.runs_on == "local":
            return await run_blocking(self._generate_one, request)
        backend = self.load_vllm()
        last = await backend.acomplete(request.prompt, request.draft.texts,
                                       vllm_options(request.options))
        return Answer.from_vllm(backend.name, backend.model_name, last.text, last,
                                request.draft)

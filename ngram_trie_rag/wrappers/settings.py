"""What every framework wrapper shares: its settings, its backend, and turning a call into
a core :class:`~ngram_trie_rag.backends.Request`.

The LangChain and LlamaIndex classes are pydantic models (both frameworks build on
pydantic 2), so the shared settings are a pydantic mixin: :class:`WrapperSettings`. A
wrapper adds only what its framework names differently (the model field, the token budget,
its API key type) and translates its own message, document and response types.

Per call: the instance's options (checked once, at construction, as one
:class:`~ngram_trie_rag.decoding.options.GenerationOptions`) with the call's keywords over them, the
documents the wrapper found, and the answer store of the call's scope when the backend
drafts locally. Which engine runs it is the backend's business (:func:`open_backend`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from ..backends.settings import (
    DEFAULT_K,
    DEFAULT_TIMEOUT_S,
    BackendSettings,
    Place,
    check_settings,
    open_backend,
)
from ..decoding.options import GenerationOptions, options_from
from ..decoding.repetition import DEFAULT_N
from ..drafting import AnswerStore
from ..drafting.config import DraftConfig
from ..engine.engine_names import ENGINES, MIN_CAPACITY, check_capacity, check_engine
from ..engine.quant.names import check_scheme
from ..util.keywords import unknown_keywords
from ..validation import not_bool
from .answer_scopes import (
    DEFAULT_MAX_SCOPES,
    DEFAULT_TOKENS_PER_SCOPE,
    AnswerMemory,
    AnswerScopes,
    check_answer_setting,
)
from .models import shown, without_secrets

DraftMethod = Literal["trie", "backoff", "chain", "none"]
# The options a wrapper's fields hold (core names); the token budget is named per framework.
OPTION_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                 "num_draft", "method", "repetition_stop")
# The engine settings at the values that leave the choice to whatever runs the calls: set so,
# they are no choice, and neither vLLM nor a built generator refuses them.
ENGINE_DEFAULTS = {"engine": "auto", "capacity": None}


class WrapperSettings(BaseModel):
    """Settings of a wrapper: where calls run, the trie's shape, and the per-call option
    defaults (each overridable per call). A subclass names its model and token-budget
    fields in ``NAMES`` (core name -> its own) and returns its backend settings."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    NAMES: ClassVar[dict[str, str]] = {}  # core name -> this framework's spelling
    DEPRECATED: ClassVar[dict[str, str]] = {}  # old spelling -> current (a warning)
    INIT_KEYWORDS: ClassVar[tuple[str, ...]] = ()  # accepted besides the fields

    backend: str = Field(
        default="local", description="'local': this package's engine. 'vllm': vLLM's engine "
        "in this process (vLLM installed), shared per model and engine arguments, batching "
        "concurrent calls; vLLM spawns processes, so in a script make the first call under "
        "`if __name__ == '__main__':`.")
    base_url: str | None = Field(
        default=None, description="A running vLLM OpenAI-compatible server (`ngram-trie-rag "
        "serve`), e.g. 'http://127.0.0.1:8000/v1'; each request sends its documents along.")
    request_timeout: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0,
        description="Seconds the base_url client waits on the server for each read.")
    vllm_engine_args: dict[str, Any] | None = Field(
        default=None, description="More AsyncEngineArgs for backend='vllm' (dtype, "
        "max_model_len, enforce_eager, kv_cache_memory_bytes, tensor_parallel_size...).")
    num_speculative_tokens: int = Field(
        default=DEFAULT_K, ge=1, description="backend='vllm': the most tokens a request "
        "drafts per step.")
    device: str | None = Field(
        default=None, description="'cpu', 'cuda'...; None: CUDA when available, else CPU.")
    dtype: str | None = Field(
        default=None, description="'float32', 'bfloat16', 'float16' or 'auto' (the model's "
        "own); None: fp32 on CPU (exact), bf16 on CUDA.")
    tokenizer: Any = Field(
        default=None, exclude=True, description="With a loaded model: its tokenizer, or a "
        "name or folder to load one from (default: the model's own).")
    model_kwargs: dict[str, Any] | None = Field(
        default=None, description="Passed to AutoModelForCausalLM.from_pretrained as given: "
        "device_map, dtype, attn_implementation, quantization_config, trust_remote_code, "
        "revision, token...")
    tokenizer_kwargs: dict[str, Any] | None = Field(
        default=None, description="Passed to AutoTokenizer.from_pretrained as given.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="Passed to the chat template of every prompt, e.g. "
        "{'enable_thinking': False} for Qwen3.")
    engine: str = Field(
        default="auto", description="What runs the forwards, local engine only: "
        f"{', '.join(repr(e) for e in ENGINES)}. 'auto': on CUDA eager until the process "
        "has answered once, then the compiled engine (compiled in the background, stored "
        "for the next process) for every request that fits its cache; on a CPU eager; "
        "'eager': a cache that "
        "grows as it goes; 'static': a preallocated cache, trees padded to fixed sizes; "
        "'compiled': the static step compiled in the background; 'uniform': every step one "
        "size (in bf16 drafting then almost always gives plain decoding's tokens); "
        "'uniform-compiled': that one size compiled.")
    capacity: int | None = Field(
        default=None, description=f"Cache positions (at least {MIN_CAPACITY}) a "
        "preallocating engine (any but 'eager') reserves and compiles for; None leaves the "
        "size to the engine. Local engine only.")
    quantization: str | None = Field(
        default=None, description="'int8' or 'int4': weight-only quantization of the loaded "
        "weights (0.30x / 0.23x the fp32 model's memory for the default model); 'w8a8': "
        "int8 weights and per-token int8 activations (CPU; the soonest first token); all decoded "
        "exactly as the quantized model's own generate; None keeps the weights as loaded. "
        "Local engine only; a model loaded with a quantization_config runs as it is.")
    n: int = Field(default=13, description="Trie window n: prefix plus suffix tokens per "
                   "sample (paper: 13).")
    prefix_len: int = Field(default=3, description="Longest matched prefix L_p (paper: 3); "
                            "below n.")
    num_draft: int | None = Field(
        default=None, description="Draft nodes verified per step, pinned; None lets the "
        "engine choose per step from acceptance and what a wider verification costs.")
    method: DraftMethod | None = Field(
        default=None, description="'trie' (default), 'backoff', 'chain' (prompt-lookup "
        "style) or 'none' (plain decoding, e.g. as a baseline).")
    temperature: float = Field(default=0.0, description="0 is greedy (token-identical to "
                               "plain decoding); above 0 samples, the distribution kept.")
    top_p: float = Field(default=1.0, description="Nucleus filtering; 1.0 keeps every token.")
    top_k: int = Field(default=0, description="0 keeps every token.")
    seed: int | None = Field(
        default=None, description="Sampling seed. Sampled answers repeat exactly when "
        "num_draft is pinned too: the draws depend on the tree.")
    stop: list[str] | None = Field(default=None, description="Stop strings; the answer "
                                   "ends before the first one.")
    repetition_stop: int | None = Field(
        default=DEFAULT_N, description="An n-gram length n >= 2: the answer ends before its "
        "first repeated n-gram (a prefix of the plain answer; finish reason 'repetition'), "
        "so a looping small model stops instead of filling the token budget. None turns it "
        "off. Local engine only (where calls run elsewhere, the default does not apply).")
    remember_answers: bool = Field(
        default=True, description="Keep each scope's answers and draft later answers of that "
        "scope from them (the scope: where a call's documents came from, or a name the "
        "caller gives). Greedy output is unchanged. Local engine only.")
    answer_store: AnswerStore | None = Field(
        default=None, exclude=True, description="One AnswerStore for every call, whatever "
        "its scope: answers cross scopes (the opt-in). Local engine only.")
    max_answer_scopes: int = Field(
        default=DEFAULT_MAX_SCOPES, description="Scopes whose answers are kept; past it the "
        "least recently used scope is dropped.")
    max_tokens_per_scope: int = Field(
        default=DEFAULT_TOKENS_PER_SCOPE, description="Tokens kept per scope; past it a "
        "scope's oldest answers are dropped first.")

    _backend: Any = PrivateAttr(default=None)
    _answer_memory: AnswerMemory = PrivateAttr(default_factory=AnswerMemory)

    @field_validator("n", "prefix_len", "num_draft", "temperature", "top_p", "top_k", "seed",
                     "repetition_stop", "num_speculative_tokens", "request_timeout",
                     "capacity", mode="before")
    @classmethod
    def _numbers_are_not_bools(cls, value: Any, info: ValidationInfo) -> Any:
        return not_bool(str(info.field_name), value)

    @field_validator("engine", mode="before")
    @classmethod
    def _known_engine(cls, value: Any) -> str:
        return check_engine(value)  # a misspelt name fails here, with the nearest one

    @field_validator("quantization", mode="before")
    @classmethod
    def _known_quantization(cls, value: Any) -> str | None:
        return check_scheme(value)  # a misspelt name fails here, with the nearest one

    @field_validator("remember_answers", "answer_store", "max_answer_scopes",
                     "max_tokens_per_scope", mode="before")
    @classmethod
    def _check_answer_setting(cls, value: Any, info: ValidationInfo) -> Any:
        return check_answer_setting(str(info.field_name), value)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keywords(cls, data: Any) -> Any:
        """A keyword that names no field (nor an alias, a deprecated spelling or one of
        ``INIT_KEYWORDS``) is an error with a did-you-mean, never dropped: a misspelt
        ``max_token=16`` would otherwise run with the default budget."""
        if not isinstance(data, Mapping):
            return data
        known = {*cls.INIT_KEYWORDS, *cls.DEPRECATED}
        for name, info in cls.model_fields.items():
            known.add(name)
            for alias in (info.alias, info.validation_alias):
                choices = getattr(alias, "choices", [alias])  # AliasChoices, or one alias
                known.update(choice for choice in choices if isinstance(choice, str))
        unknown = [key for key in data if key not in known]
        if unknown:
            raise ValueError(unknown_keywords(f"{cls.__name__} keyword(s)", unknown, known))
        return data

    @field_serializer("model_kwargs", "tokenizer_kwargs")
    def _no_token(self, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return without_secrets(value, mask=None)  # a dump holds no credential

    def __repr_args__(self) -> Any:
        # A loaded model by its name and a tokenizer object by its class, not their reprs;
        # a token in the loader keywords masked.
        for name, value in super().__repr_args__():
            if name in ("model", "tokenizer"):
                value = shown(value)
            elif name in ("model_kwargs", "tokenizer_kwargs"):
                value = without_secrets(value)
            yield name, value

    @classmethod
    def renamed(cls, data: Any, stacklevel: int = 4) -> Any:
        """Deprecated spellings (``DEPRECATED``) as their current names, with a warning;
        for a ``model_validator(mode="before")`` of the subclass. ``stacklevel``: the
        caller's frame, so the warning shows where the old name was written."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for old, new in cls.DEPRECATED.items():
            if old in data:
                warnings.warn(f"{old!r} is deprecated; use {new!r}", DeprecationWarning,
                              stacklevel=stacklevel)
                if new in data:
                    raise ValueError(f"{old!r} and {new!r} name one setting: pass {new!r}")
                data[new] = data.pop(old)
        return data

    def spelled(self, core: str) -> str:
        """This framework's spelling of a core name."""
        return self.NAMES.get(core, core)

    @classmethod
    def core_name(cls, name: str) -> str:
        """The core's name for this framework's spelling (the inverse of ``spelled``)."""
        return next((core for core, spelled in cls.NAMES.items() if spelled == name), name)

    # ---- what a subclass supplies ---------------------------------------------------
    def backend_settings(self) -> BackendSettings:
        """The model and where calls run (the subclass knows its model field); built
        with :meth:`backend_settings_for`."""
        raise NotImplementedError

    def backend_settings_for(self, model: str | None, api_key: str | None,
                             generator: Any = None) -> BackendSettings:
        """The shared fields as backend settings, with the subclass's model, key and
        already built generator (``None``: none)."""
        return BackendSettings(
            model=model, backend=self.backend, base_url=self.base_url, api_key=api_key,
            request_timeout=self.request_timeout, vllm_engine_args=self.vllm_engine_args,
            num_speculative_tokens=self.num_speculative_tokens, device=self.device,
            dtype=self.dtype, tokenizer=self.tokenizer, model_kwargs=self.model_kwargs,
            tokenizer_kwargs=self.tokenizer_kwargs,
            chat_template_kwargs=self.chat_template_kwargs, n=self.n,
            prefix_len=self.prefix_len, engine=self.engine, capacity=self.capacity,
            quantization=self.quantization, generator=generator,
            backend_was_set="backend" in self.model_fields_set)

    def settings_given(self) -> set[str]:
        """Core names of the settings the caller set (for refusing foreign ones); the
        engine settings only when they choose something (see ``ENGINE_DEFAULTS``)."""
        return {self.core_name(name) for name in self.model_fields_set
                if not self._left_to_default(name)}

    def _left_to_default(self, name: str) -> bool:
        """Whether ``name`` is an engine setting set to the value that chooses nothing."""
        return name in ENGINE_DEFAULTS and getattr(self, name) == ENGINE_DEFAULTS[name]

    # ---- checked once ---------------------------------------------------------------
    def check_all(self) -> None:
        """Settings checked together, once (call from the subclass's after-validator):
        where calls run and what that place reads, the trie's shape, the option
        defaults as one options object, the answer settings."""
        settings = self.backend_settings()
        check_settings(settings.place, self.settings_given(), self.NAMES)
        self._check_engine_settings(settings.generator is not None)
        if self.prefix_len >= self.n:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be below n ({self.n})")
        DraftConfig(n=self.n, prefix_len=self.prefix_len)
        self.option_defaults()
        self._answer_memory = AnswerMemory.from_settings(
            self.remember_answers, self.answer_store, self.max_answer_scopes,
            self.max_tokens_per_scope, given=self.model_fields_set)

    def _check_engine_settings(self, has_generator: bool) -> None:
        """``capacity`` fits ``engine``, and neither is chosen beside a built generator,
        which runs on the engine it was built with (they would be silently ignored)."""
        check_capacity(self.capacity, self.engine)
        chosen = sorted(set(ENGINE_DEFAULTS) & self.settings_given())
        if has_generator and self.quantization is not None:
            raise ValueError("quantization cannot be set with generator=: the generator's "
                             "weights are loaded already (build it with SpeculativeGenerator"
                             ".from_pretrained(..., quantization=...))")
        if has_generator and chosen:
            raise ValueError(f"{' and '.join(self.spelled(n) for n in chosen)} cannot be "
                             "set with generator=: the generator has its own engine (build "
                             "it with SpeculativeGenerator.from_pretrained(..., engine=...))")

    @property
    def runs_on(self) -> Place:
        """``"local"``, ``"vllm"`` (in this process) or ``"vllm-server"``."""
        return self.backend_settings().place

    @property
    def active_backend(self) -> Any:
        """The :class:`~ngram_trie_rag.backends.Backend` calls run on; nothing loads or
        connects until the first call."""
        if self._backend is None:
            self._backend = open_backend(self.backend_settings())
        return self._backend

    @property
    def answer_scopes(self) -> AnswerScopes:
        """The per-scope answer stores (e.g. ``forget(scope)`` once its documents change)."""
        return self._answer_memory.scopes

    # ---- one call ---------------------------------------------------------------------
    def option_defaults(self) -> GenerationOptions:
        """The option fields as one checked object, read as they are now (a field assigned
        after construction, ``llm.temperature = 0.2``, applies to the next call)."""
        values = {self.spelled(core): getattr(self, self.spelled(core))
                  for core in OPTION_FIELDS}
        if "repetition_stop" not in self.settings_given() and self.runs_on != "local":
            values[self.spelled("repetition_stop")] = None  # a local default, not a choice
        return options_from(self.NAMES, **values)

    def call_options(self, keywords: Mapping[str, Any],
                     stop: Sequence[str] | None = None) -> GenerationOptions:
        """The instance's options with this call's ``keywords`` (this framework's spelling;
        deprecated ones warn) over them; an unknown keyword is a ``TypeError``."""
        changes = dict(self.renamed(keywords))
        if stop:
            changes[self.spelled("stop")] = list(stop)
        defaults = self.option_defaults()
        if not changes:
            return defaults
        return defaults.with_changes(
            self.NAMES, **{self.core_name(k): v for k, v in changes.items()})

    def with_answer_store(self, options: GenerationOptions,
                          scope: str | None) -> tuple[GenerationOptions, str | None]:
        """``options`` with the store of the call's ``scope`` when the backend drafts
        locally (vLLM drafts with its own proposer), and the scope to report."""
        if not self.active_backend.drafts_locally:
            return options, None
        seeded = options.temperature > 0 and options.seed is not None
        store, reported = self._answer_memory.store_for(scope, seeded_sampling=seeded)
        if store is None:
            return options, reported
        return options.with_changes(answer_store=store), reported

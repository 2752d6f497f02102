"""Settings shared by the chat model and the string LLM.

Where calls run, the trie's shape, the per-call option defaults and the answer settings are
the core's :class:`~ngram_trie_rag.wrappers.settings.WrapperSettings`, checked once at construction.
What LangChain names its own way is here: ``max_tokens`` for the token budget, ``model``
(a name to load, or a loaded model; ``model_id`` is the same setting, as
langchain-huggingface spells it), ``device_map``, ``api_key`` as a ``SecretStr`` (and
``timeout`` for ``request_timeout``, LangChain's standard name), an already
built ``generator``, whether to draft from the documents retrieved in the chain, and the
parameters LangChain traces.

``draft_method``, this package's earlier name for ``method``, still works, as a field and
as a per-call keyword, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.backends import BackendSettings
from ngram_trie_rag.loading import DEFAULT_MODEL_NAME
from ngram_trie_rag.validation import not_bool
from ngram_trie_rag.wrappers.models import (
    check_loading,
    is_loaded,
    loaded_name,
    loading,
    model_value,
    shown,
    without_secrets,
)
from ngram_trie_rag.wrappers.settings import WrapperSettings
from pydantic import Field, SecretStr, field_serializer, field_validator, model_validator

from .registry import install

PROVIDER = "ngram_trie"  # LangSmith provider name
# Settings that identify a model per place (besides its name and the sampling options):
# LangChain's cache keys and traces are built from them.
TRACED = {"local": ("device", "dtype", "device_map", "model_kwargs", "tokenizer_kwargs",
                    "chat_template_kwargs", "n", "prefix_len", "num_draft", "method",
                    "repetition_stop", "engine", "capacity"),
          "vllm": ("backend", "num_speculative_tokens", "vllm_engine_args"),
          "vllm-server": ("base_url",)}


class NGramTrieSettings(WrapperSettings):
    """Model, trie and sampling settings; every sampling field can be overridden per call
    (``invoke(..., max_tokens=..., temperature=...)`` or ``bind``)."""

    NAMES: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens"}
    DEPRECATED: ClassVar[dict[str, str]] = {"draft_method": "method"}
    # Other spellings of a setting, no warning: langchain-huggingface's ``model_id``, and
    # LangChain's standard ``timeout`` (as in ChatOpenAI).
    ALIASES: ClassVar[dict[str, str]] = {"model_id": "model", "timeout": "request_timeout"}
    INIT_KEYWORDS: ClassVar[tuple[str, ...]] = tuple(ALIASES)

    model: Any = None
    """What to run: a Hugging Face hub id (``"HuggingFaceTB/SmolLM2-360M-Instruct"``), a
    local folder or a ``.gguf`` file, loaded on first use and shared process-wide; or a
    model already loaded (``AutoModelForCausalLM.from_pretrained(...)``), with its
    ``tokenizer`` (an object, or a name to load it from; default: the model's own). ``None``
    loads the packaged SmolLM2-135M-Instruct. With ``base_url``: the served model name
    (``None`` asks the server). ``model_id=`` is accepted as the same setting."""
    device_map: str | dict[str, Any] | None = None
    """Where Transformers places the weights (``"auto"``, ``"cuda:0"``, a layer map): the
    same as ``model_kwargs={"device_map": ...}``; instead of ``device``."""
    api_key: SecretStr | None = None
    """Bearer token for ``base_url`` (when the server was started with ``--api-key``)."""
    generator: SpeculativeGenerator | None = Field(default=None, exclude=True)
    """An already built generator to use instead of ``model``/``device``/``dtype``."""
    max_tokens: int = 256
    """Upper bound on new tokens."""
    use_retrieved_documents: bool = True
    """Draft from the documents retrieved in the enclosing chain (when no ``documents``
    are passed); ``False`` always drafts from the prompt."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)
            for alias, name in cls.ALIASES.items():
                if alias in data:
                    if name in data:
                        raise ValueError(f"{alias!r} and {name!r} name one setting: pass one")
                    data[name] = data.pop(alias)
        # The warning names the caller's line: past LangChain's __init__ and pydantic's.
        return cls.renamed(data, stacklevel=5)

    @field_validator("model", mode="before")
    @classmethod
    def _model_is_a_name_or_a_loaded_model(cls, value: Any) -> Any:
        return model_value("model", value)

    @field_serializer("model")
    def _model_by_name(self, value: Any) -> Any:
        return shown(value)  # a dump names a loaded model, never serialises its weights

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_is_not_a_bool(cls, value: Any) -> Any:
        return not_bool("max_tokens", value)

    @model_validator(mode="after")
    def _check_all(self) -> NGramTrieSettings:
        self.check_all()
        check_loading(self.runs_on, self.model, {
            "device": self.device, "dtype": self.dtype, "model_kwargs": self.model_kwargs,
            "quantization": self.quantization,
            "device_map": self.device_map, "tokenizer": self.tokenizer,
            "tokenizer_kwargs": self.tokenizer_kwargs})
        return self

    def model_post_init(self, context: Any, /) -> None:
        # A chain can only run a model that exists, so registering the retrieved-documents
        # handler here is early enough, and importing the package registers nothing.
        install()
        super().model_post_init(context)

    def backend_settings(self) -> BackendSettings:
        key = self.api_key.get_secret_value() if self.api_key else None
        return loading(self.backend_settings_for(self.model, key, self.generator),
                       self.device_map)

    # ---- what LangChain traces ------------------------------------------------------------
    @property
    def model_label(self) -> str:
        """The name of the model calls run on, without loading it (for tracing
        parameters): the generator's, the name given, or the one a loaded model was
        loaded from; with no model, the packaged default (a server: its address)."""
        if self.generator is not None:
            return self.generator.model_name
        if is_loaded(self.model):
            return loaded_name(self.model)
        return self.model or self.base_url or DEFAULT_MODEL_NAME

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
        """The model's name, what identifies it where its calls run, and its sampling
        defaults (the identifying parameters)."""
        placed = {name: getattr(self, name) for name in TRACED[self.runs_on]}
        for name in ("model_kwargs", "tokenizer_kwargs"):
            if name in placed:  # traces and cache keys hold no credential
                placed[name] = without_secrets(placed[name])
        if self.tokenizer is not None:  # a name as given, an object by its class
            placed["tokenizer"] = shown(self.tokenizer)
        return {"model": self.model_label, **placed, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "seed": self.seed}

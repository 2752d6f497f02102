"""The settings only LlamaIndex's ``NGramTrieLLM`` has, beside the ones every wrapper
shares (:class:`~ngram_trie_rag.wrappers.settings.WrapperSettings`), and the backend they name.

The model is named as in LlamaIndex's ``HuggingFaceLLM``: ``model_name`` is what gets
loaded (a hub id, a folder or a ``.gguf`` file; for a vLLM server, the served model's
name), ``tokenizer_name`` where its tokenizer comes from; or ``model`` (and ``tokenizer``)
are objects already loaded, ``model_name`` then only their label. ``model_path``, this
package's earlier name for ``model_name``, still works with a ``DeprecationWarning``. The
token budget keeps the core's name, ``max_new_tokens``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.bridge.pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from ngram_trie_rag.backends.settings import BackendSettings
from ngram_trie_rag.validation import not_bool
from ngram_trie_rag.wrappers.models import (
    check_loading,
    is_loaded,
    loaded_name,
    loading,
)
from ngram_trie_rag.wrappers.settings import WrapperSettings

if TYPE_CHECKING:
    from ngram_trie_rag import SpeculativeGenerator


class NGramTrieSettings(WrapperSettings):
    """The LlamaIndex-specific fields, and the backend settings built from all of them.

    ``generator`` is an init argument, not a field: an already loaded
    ``SpeculativeGenerator`` is an object to run on, not a setting to serialise.
    """

    DEPRECATED: ClassVar[dict[str, str]] = {"model_path": "model_name"}
    INIT_KEYWORDS: ClassVar[tuple[str, ...]] = ("generator",)

    model_name: str | None = Field(
        default=None, description="The model to load: a hub id, a local folder or a .gguf "
        "file; None: the packaged SmolLM2-135M-Instruct. With base_url: the served model "
        "name (None asks the server). With a loaded model: its name in metadata.")
    model: Any = Field(
        default=None, exclude=True, description="A model already loaded "
        "(AutoModelForCausalLM.from_pretrained(...)) to run instead of loading model_name; "
        "local engine only.")
    tokenizer_name: str | None = Field(
        default=None, description="Where to load the tokenizer from (a hub id or folder); "
        "None: the model's own.")
    device_map: str | dict[str, Any] | None = Field(
        default=None, description="Where Transformers places the weights ('auto', "
        "'cuda:0', a layer map): model_kwargs['device_map'], instead of device.")
    api_key: str | None = Field(
        default=None, description="Bearer token for base_url.", exclude=True, repr=False)
    max_new_tokens: int = Field(default=256, gt=0, description="Upper bound on answer "
                                "tokens.")
    context_window: int | None = Field(
        default=None, description="Override the model's context window.")
    is_chat_model: bool | None = Field(
        default=None, description="Use the chat template; None: when the model has one "
        "(a server's cannot be seen from here: it counts as a chat model).")

    _given_generator: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "model_path" in data and data.get("base_url"):
            # The old name was a folder on this machine, which a server cannot load.
            raise ValueError("model_path (use model_name for the served model) cannot be "
                             "used where calls run on 'vllm-server'")
        # The warning names the caller's line: past NGramTrieLLM's and CustomLLM's
        # __init__ and pydantic's.
        return cls.renamed(data, stacklevel=7)

    @field_validator("max_new_tokens", "context_window", mode="before")
    @classmethod
    def _budget_is_not_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        return not_bool(str(info.field_name), value)

    @field_validator("model_name", "tokenizer_name", mode="before")
    @classmethod
    def _paths_as_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("model", mode="before")
    @classmethod
    def _model_is_loaded(cls, value: Any) -> Any:
        if value is None or is_loaded(value):
            return value
        raise ValueError("model takes a loaded model (torch.nn.Module); pass a hub id, a "
                         f"folder or a .gguf path as model_name (got {type(value).__name__})")

    @field_serializer("model_name")
    def _loaded_models_name(self, value: str | None) -> str | None:
        # A dump of a wrapper over a loaded model names where it was loaded from.
        return loaded_name(self.model) if value is None and is_loaded(self.model) else value

    def backend_settings(self) -> BackendSettings:
        """Where calls run and what they run on: a loaded ``model``, else ``model_name``
        (a server is asked for it by that name; an engine here loads it)."""
        model = self.model if self.model is not None else self.model_name
        settings = self.backend_settings_for(model, self.api_key, self._given_generator)
        # A tokenizer named as the model is the model's own: the shared model serves it.
        if self.tokenizer is None and self.tokenizer_name not in (None, self.model_name):
            settings = replace(settings, tokenizer=self.tokenizer_name)
        return loading(settings, self.device_map)

    def settings_given(self) -> set[str]:
        """The fields set, and ``generator`` when one was passed (vLLM refuses it)."""
        given = super().settings_given()
        return given | {"generator"} if self._given_generator is not None else given

    def check_all(self) -> None:
        """The shared checks, then the model's: a loaded model runs on the local engine
        and takes no loader settings, a tokenizer is named once."""
        super().check_all()
        if self.tokenizer is not None and self.tokenizer_name is not None:
            raise ValueError("tokenizer and tokenizer_name both name the tokenizer: give one")
        check_loading(self.runs_on, self.model, {
            "device": self.device, "dtype": self.dtype, "model_kwargs": self.model_kwargs,
            "quantization": self.quantization,
            "device_map": self.device_map, "tokenizer": self.tokenizer,
            "tokenizer_kwargs": self.tokenizer_kwargs, "tokenizer_name": self.tokenizer_name,
        }, local_only=("tokenizer_name", "device_map"))

    @property
    def model_label(self) -> str:
        """The model's name in metadata: ``model_name``, else where a loaded model was
        loaded from, else the engine's (a server's answer, the generator's name)."""
        if self.model_name is not None:
            return self.model_name
        if is_loaded(self.model) and self._given_generator is None:
            return loaded_name(self.model)
        return self.active_backend.model_name

    @property
    def generator(self) -> SpeculativeGenerator:
        """The local engine's generator, loaded on first access (to share it:
        ``NGramTrieLLM(generator=llm.generator, ...)``)."""
        from ngram_trie_rag.backends import LocalBackend

        backend = self.active_backend
        if not isinstance(backend, LocalBackend):
            raise RuntimeError(f"calls run on {self.runs_on!r}, not on this package's engine")
        return backend.generator

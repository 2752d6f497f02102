"""The settings only LlamaIndex's ``NGramTrieLLM`` has, beside the ones every wrapper
shares (:class:`~ngram_trie_rag.wrapper.WrapperSettings`), and the backend they name.

LlamaIndex names the model by its local folder (``model_path``) and reports
``model_name``; for a vLLM server ``model_name`` is the served model, which a folder on
this machine cannot name. The token budget keeps the core's name, ``max_new_tokens``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr, ValidationInfo, field_validator
from ngram_trie_rag.backends.settings import BackendSettings
from ngram_trie_rag.validation import not_bool
from ngram_trie_rag.wrapper import WrapperSettings

if TYPE_CHECKING:
    from ngram_trie_rag import SpeculativeGenerator


class NGramTrieSettings(WrapperSettings):
    """The LlamaIndex-specific fields, and the backend settings built from all of them.

    ``generator`` is an init argument, not a field: an already loaded
    ``SpeculativeGenerator`` is an object to run on, not a setting to serialise.
    """

    model_path: str | None = Field(
        default=None, description="Local Hugging Face model folder; None: the packaged "
        "default.")
    model_name: str | None = Field(
        default=None, description="Name reported in metadata; default: the model's. With "
        "base_url: the served model name (None asks the server).")
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

    @field_validator("max_new_tokens", "context_window", mode="before")
    @classmethod
    def _budget_is_not_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        return not_bool(str(info.field_name), value)

    def backend_settings(self) -> BackendSettings:
        """Where calls run: a server is asked for ``model_name``, an engine in this
        process loads ``model_path``."""
        model = self.model_name if self.base_url is not None else self.model_path
        return self.backend_settings_for(model, self.api_key, self._given_generator)

    def settings_given(self) -> set[str]:
        """The fields set, and ``generator`` when one was passed (vLLM refuses it)."""
        given = super().settings_given()
        return given | {"generator"} if self._given_generator is not None else given

    def check_all(self) -> None:
        """The shared checks, after refusing ``model_path`` for a server: the server
        loaded its model, and only its served name reaches it."""
        if self.runs_on == "vllm-server" and self.model_path is not None:
            raise ValueError("model_path (use model_name for the served model) cannot be "
                             "used where calls run on 'vllm-server'")
        super().check_all()

    @property
    def generator(self) -> SpeculativeGenerator:
        """The local engine's generator, loaded on first access (to share it:
        ``NGramTrieLLM(generator=llm.generator, ...)``)."""
        from ngram_trie_rag.backends import LocalBackend

        engine = self.engine
        if not isinstance(engine, LocalBackend):
            raise RuntimeError(f"calls run on {self.runs_on!r}, not on this package's engine")
        return engine.generator

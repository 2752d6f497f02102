"""Which backend a wrapper's settings name, decided once, and the backend built from them.

* ``"local"``: this package's speculative generator (tree drafts, exact per-step stats);
* ``"vllm-server"``: a running vLLM OpenAI server (``base_url``), e.g. one started by
  ``ngram-trie-rag serve``; each request carries its documents;
* ``"vllm"``: vLLM's ``AsyncLLM`` in this process, shared per model and engine arguments.

Settings that only one place reads are refused elsewhere rather than silently ignored (a
pinned ``num_draft`` that vLLM never sees would mislead). The names here are the core's;
a wrapper passes its own spelling for messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..serving.openai_http import DEFAULT_TIMEOUT_S
from ..serving.server import DEFAULT_K
from ..wrappers.answer_scopes import SETTINGS as ANSWER_SETTINGS
from .protocol import Backend

Place = Literal["local", "vllm", "vllm-server"]
BACKENDS = ("local", "vllm")
# Settings (core names) that only one place reads; a server reads none of its own
# (api_key is not refused elsewhere: generic callers set one for all).
ONLY_FOR: dict[Place, tuple[str, ...]] = {
    "local": ("generator", "tokenizer", "device", "dtype", "model_kwargs", "tokenizer_kwargs",
              "chat_template_kwargs", "n", "prefix_len", "num_draft", "method",
              "repetition_stop", "engine", "capacity", "quantization", *ANSWER_SETTINGS),
    "vllm": ("vllm_engine_args", "num_speculative_tokens"),
    "vllm-server": (),
}
DESCRIBED = {"local": "this package's engine", "vllm": "vLLM in this process",
             "vllm-server": "a vLLM server"}


def place(backend: str, base_url: str | None, backend_was_set: bool) -> Place:
    """Where calls run, or a ValueError saying why these settings contradict."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use 'local' or 'vllm' (or base_url "
                         "for a running vLLM server)")
    if base_url is None:
        return "local" if backend == "local" else "vllm"
    if backend == "vllm" or backend_was_set:
        raise ValueError(f"base_url and backend={backend!r} exclude each other: base_url "
                         "sends requests to a running vLLM server, backend='vllm' starts "
                         "vLLM in this process and backend='local' runs this package's engine")
    return "vllm-server"


def check_settings(where: Place, given: Iterable[str],
                   names: Mapping[str, str] | None = None) -> None:
    """Refuse settings (core names, ``names`` their caller's spelling) that only another
    place reads."""
    names = names or {}
    given = set(given)
    foreign = sorted(names.get(name, name) for other, only in ONLY_FOR.items()
                     if other != where for name in only if name in given)
    if foreign:
        raise ValueError(f"{', '.join(foreign)} cannot be used where calls run on {where!r} "
                         f"({DESCRIBED[where]})")


@dataclass(frozen=True)
class BackendSettings:
    """What a wrapper knows about where its calls run (core names; see the wrappers'
    field docs). ``model``: a hub id, folder or ``.gguf`` path, or a loaded model (with
    ``tokenizer``, a loaded one or a name); ``generator``: an already built
    ``SpeculativeGenerator``, used as is (its own engine); ``engine`` and ``capacity``:
    what runs a generator built here (see
    :meth:`~ngram_trie_rag.generator.SpeculativeGenerator.from_pretrained`)."""

    model: Any = None
    backend: str = "local"
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    request_timeout: float = DEFAULT_TIMEOUT_S
    vllm_engine_args: Mapping[str, Any] | None = None
    num_speculative_tokens: int = DEFAULT_K
    device: str | None = None
    dtype: str | None = None
    tokenizer: Any = None
    model_kwargs: Mapping[str, Any] | None = None
    tokenizer_kwargs: Mapping[str, Any] | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    n: int = 13
    prefix_len: int = 3
    engine: str = "auto"
    capacity: int | None = None
    quantization: str | None = None
    generator: Any = None
    backend_was_set: bool = False

    @property
    def place(self) -> Place:
        return place(self.backend, self.base_url, self.backend_was_set)


def open_backend(settings: BackendSettings) -> Backend:
    """The backend these settings name. Nothing loads or connects until the first call
    (a local model loads once per process and is shared, see :func:`shared_generator`)."""
    where = settings.place
    if where == "local":
        from .local import LocalBackend

        if settings.generator is not None:
            return LocalBackend(settings.generator)

        def load() -> Any:
            if settings.tokenizer is not None or not isinstance(settings.model, str | None):
                # a loaded model, or a tokenizer of its own: this wrapper's alone
                return _own_generator(settings)
            from ..wrappers.shared import shared_generator

            return shared_generator(settings.model, device=settings.device,
                                    dtype=settings.dtype, n=settings.n,
                                    prefix_len=settings.prefix_len,
                                    engine=settings.engine, capacity=settings.capacity,
                                    quantization=settings.quantization,
                                    model_kwargs=settings.model_kwargs,
                                    tokenizer_kwargs=settings.tokenizer_kwargs,
                                    chat_template_kwargs=settings.chat_template_kwargs)

        return LocalBackend(load)
    from .vllm import VLLMBackend

    if settings.model is not None and not isinstance(settings.model, str):
        raise ValueError(f"{DESCRIBED[where]} takes a model by hub id or folder; a loaded "
                         "model object runs on backend='local'")
    if where == "vllm-server":
        from ..serving.openai_http import OpenAIHTTPBackend

        assert settings.base_url is not None
        return VLLMBackend(OpenAIHTTPBackend(settings.base_url, settings.model,
                                             api_key=settings.api_key,
                                             timeout=settings.request_timeout))
    from ..serving.vllm_local import shared_in_process_vllm

    return VLLMBackend(shared_in_process_vllm(
        settings.model, num_speculative_tokens=settings.num_speculative_tokens,
        engine_args=settings.vllm_engine_args))


def _own_generator(settings: BackendSettings) -> Any:
    """A generator over a model the caller loaded, or one loaded here with a tokenizer the
    caller chose (given, or loaded by name): not shared through the process-wide cache,
    which is keyed by names. Generators over one model object still share its engine
    (lock, forwards, latency curve): the one ``settings.engine`` names."""
    from ..engine.choice import make_engine
    from ..generator import SpeculativeGenerator
    from ..loading import load_model

    model, tokenizer = load_model(settings.model, tokenizer=settings.tokenizer,
                                  device=settings.device, dtype=settings.dtype,
                                  model_kwargs=settings.model_kwargs,
                                  tokenizer_kwargs=settings.tokenizer_kwargs,
                                  quantization=settings.quantization)
    return SpeculativeGenerator(model, tokenizer, n=settings.n, prefix_len=settings.prefix_len,
                                engine=make_engine(model, settings.engine, settings.capacity),
                                chat_template_kwargs=dict(settings.chat_template_kwargs or {}))

"""Fields and per-call options shared by the chat model and the string LLM.

Both classes turn a LangChain call into one ``SpeculativeGenerator`` request: resolve the
options (instance defaults, overridden per call), pick the draft documents, then generate or
stream. Keeping that here means the two front ends differ only in how they build the prompt
and package the answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from ngram_trie_rag import SpeculativeGenerator, shared_generator
from ngram_trie_rag.loading import DEFAULT_MODEL_NAME
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .documents import DraftDocuments, choose_documents
from .metadata import Answer
from .registry import install

PROVIDER = "ngram_trie"  # LangSmith provider name

# Per-call keywords that map onto generator options (LangChain's name -> the core's).
CALL_OPTIONS = {"max_tokens": "max_new_tokens", "temperature": "temperature",
                "top_p": "top_p", "top_k": "top_k", "seed": "seed", "num_draft": "num_draft",
                "draft_method": "method"}
# Keywords LangChain itself may pass along that carry no generation option.
IGNORED_KWARGS = {"stream"}


@dataclass
class Request:
    """One generation: the prompt, what to draft from, and the generator options."""

    prompt: Any
    draft: DraftDocuments
    options: dict[str, Any]


class NGramTrieSettings(BaseModel):
    """Model, trie and sampling settings; every sampling field can be overridden per call
    (``invoke(..., max_tokens=..., temperature=...)`` or ``bind``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    model: str | None = None
    """A local Hugging Face causal-LM folder; ``None`` loads the packaged
    SmolLM2-135M-Instruct. Loaded on first use, then shared process-wide."""
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

    @model_validator(mode="after")
    def _check_trie_shape(self) -> NGramTrieSettings:
        if self.prefix_len >= self.n:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be below n ({self.n})")
        return self

    def model_post_init(self, context: Any, /) -> None:
        # A chain can only run a model that exists, so registering the retrieved-documents
        # handler here is early enough, and importing the package registers nothing.
        install()
        super().model_post_init(context)

    # ---- the generator --------------------------------------------------------------------
    def load_generator(self) -> SpeculativeGenerator:
        """The generator (loads the model on first use; slow once, then cached)."""
        if self.generator is not None:
            return self.generator
        return shared_generator(self.model, device=self.device, dtype=self.dtype,
                                n=self.n, prefix_len=self.prefix_len)

    @property
    def model_label(self) -> str:
        """The model's name without loading it (for tracing parameters)."""
        if self.generator is not None:
            return self.generator.model_name
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
        return {"model": self.model_label, "device": self.device, "dtype": self.dtype,
                "n": self.n, "prefix_len": self.prefix_len, "num_draft": self.num_draft,
                "draft_method": self.draft_method,
                "max_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}

    # ---- one call ---------------------------------------------------------------------------
    def _request(self, prompt: Any, stop: list[str] | None, kwargs: Mapping[str, Any],
                 run_id: UUID | None, parent_run_id: UUID | None) -> Request:
        """Options from the instance and this call's keywords, and the draft documents."""
        unknown = set(kwargs) - set(CALL_OPTIONS) - IGNORED_KWARGS - {"documents"}
        if unknown:
            raise TypeError(f"unsupported keyword arguments {sorted(unknown)}; "
                            f"supported: {sorted([*CALL_OPTIONS, 'documents', 'stop'])}")
        options = {core: kwargs.get(name, getattr(self, name))
                   for name, core in CALL_OPTIONS.items()}
        options["stop"] = list(stop) if stop else (list(self.stop) if self.stop else None)
        draft = choose_documents(kwargs.get("documents"), run_id, parent_run_id,
                                 self.use_retrieved_documents)
        return Request(prompt, draft, options)

    def _deltas(self, request: Request) -> Iterator[tuple[str, Answer | None]]:
        """Blocking: ``(delta, None)`` for each non-empty text delta as it is verified,
        then ``("", answer)`` once finished. Closing it early stops generation and frees
        the model."""
        gen = self.load_generator()
        with gen.stream(request.prompt, request.draft.texts, **request.options) as stream:
            for delta in stream:
                if delta:
                    yield delta, None
        assert stream.result is not None
        yield "", Answer(gen.model_name, stream.result, request.draft)

    def _generate_one(self, request: Request) -> Answer:
        """Blocking: the whole answer."""
        for _, answer in self._deltas(request):
            if answer is not None:
                return answer
        raise AssertionError("a generation ends with its answer")

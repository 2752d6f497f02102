"""Refusals every framework wrapper inherits from the core's wrapper settings.

The LangChain and LlamaIndex classes share one validator
(:class:`~ngram_trie_rag.wrappers.settings.WrapperSettings`), so the cases it must refuse
are written once here and each wrapper's suite runs them on its own classes, beside the refusals
only
its framework's fields have."""

from __future__ import annotations

from typing import Any

import pytest

# A server address is only recorded at construction, never contacted.
URL = "http://127.0.0.1:8000/v1"


def assert_placement_refused(cls: type) -> None:
    """Where the model goes may be said once: ``device_map`` not twice, and not beside
    ``device``."""
    with pytest.raises(ValueError, match="device_map is given twice"):
        cls(device_map="auto", model_kwargs={"device_map": "cpu"})
    with pytest.raises(ValueError, match="device and device_map both place the model"):
        cls(device_map="auto", device="cpu")


def assert_loaded_model_refused_on_vllm(cls: type, model: Any) -> None:
    """A model object already in memory runs on this package's engine only: neither a vLLM
    server nor in-process vLLM can take it."""
    with pytest.raises(ValueError, match=r"a loaded model object runs on this package's "
                                         r"engine only .* 'vllm-server'"):
        cls(model=model, base_url=URL)
    with pytest.raises(ValueError, match=r"a loaded model object runs .* on 'vllm' "):
        cls(model=model, backend="vllm")

"""The model a wrapper runs: a name to load (hub id, folder or ``.gguf`` path) or a model
the caller already loaded (a ``torch.nn.Module``), the way langchain-huggingface's
``HuggingFacePipeline`` and LlamaIndex's ``HuggingFaceLLM`` take models.

What can be checked without loading anything is checked at construction: a loaded model
runs on the local engine only and takes no loader settings; ``device_map`` is given once.
Both framework wrappers use this module; the loading itself is
:func:`ngram_trie_rag.loading.load_model`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from ..backends.settings import DESCRIBED, BackendSettings

# Settings that load a model: they mean nothing for a model already loaded.
LOADER_SETTINGS = ("device", "dtype", "model_kwargs", "device_map", "quantization")
# Loader keywords holding a credential: never traced, shown or dumped.
SECRET_KEYS = frozenset({"token", "use_auth_token"})


def is_loaded(model: Any) -> bool:
    """A model object (rather than a name, or ``None``)."""
    return isinstance(model, torch.nn.Module)


def model_value(field: str, value: Any) -> Any:
    """``None``, a name (a ``str`` or path, as ``str``) or a loaded model, as given;
    anything else is a ``ValueError`` naming what ``field`` takes."""
    if value is None or is_loaded(value):
        return value
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise ValueError(f"{field} takes a hub id, a folder or a .gguf path (str), or a loaded "
                     f"transformers model (torch.nn.Module); got {type(value).__name__}")


def loaded_name(model: Any) -> str:
    """The name a loaded model was loaded from (``config._name_or_path``, else
    ``name_or_path``), else its class name."""
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None)
    return str(name) if name else type(model).__name__


def shown(value: Any) -> Any:
    """A setting as a repr or a dump shows it: a loaded model by its name, any other
    object (a tokenizer) by its class, names and plain values as they are."""
    if value is None or isinstance(value, str | int | float | bool | dict | list):
        return value
    if is_loaded(value):
        return loaded_name(value)
    return f"<{type(value).__name__}>"


def without_secrets(kwargs: Mapping[str, Any] | None,
                    mask: str | None = "***") -> dict[str, Any] | None:
    """Loader keywords with their credentials (``token``) masked, or left out when
    ``mask`` is ``None`` (a dump: a masked token would load nothing)."""
    if kwargs is None:
        return None
    return {key: value if key not in SECRET_KEYS else mask for key, value in kwargs.items()
            if key not in SECRET_KEYS or mask is not None}


def check_loading(where: str, model: Any, settings: Mapping[str, Any],
                  local_only: Sequence[str] = ("device_map",)) -> None:
    """Refuse, before anything loads, what loading would refuse or ignore. ``settings``:
    the loading settings (``device``, ``dtype``, ``model_kwargs``, ``device_map``,
    ``tokenizer``, ``tokenizer_kwargs``...) by the caller's names, ``None`` when unset;
    ``local_only``: those of them the core does not already refuse elsewhere."""
    if is_loaded(model) and where != "local":
        raise ValueError(
            f"a loaded model object runs on this package's engine only (backend='local'), "
            f"not where calls run on {where!r} ({DESCRIBED[where]}): pass the model's hub "
            "id or folder instead (for a server, the served model's name)")
    elsewhere = [name for name in local_only if settings.get(name) is not None]
    if elsewhere and where != "local":
        raise ValueError(f"{', '.join(elsewhere)} cannot be used where calls run on "
                         f"{where!r} ({DESCRIBED[where]})")
    if settings.get("device_map") is not None:
        if "device_map" in (settings.get("model_kwargs") or {}):
            raise ValueError("device_map is given twice (as device_map= and in "
                             "model_kwargs): give it once")
        if settings.get("device") is not None:
            raise ValueError("device and device_map both place the model: give one")
    if is_loaded(model):
        loader = [name for name in LOADER_SETTINGS if settings.get(name)]
        if loader:
            raise ValueError(f"{', '.join(loader)} cannot be used with a loaded model "
                             "object: loader settings apply to a model being loaded (move "
                             "or cast it yourself)")
    tokenizer = settings.get("tokenizer")
    if (settings.get("tokenizer_kwargs") and tokenizer is not None
            and not isinstance(tokenizer, str | os.PathLike)):
        raise ValueError("tokenizer_kwargs cannot be used with a loaded tokenizer object: "
                         "they apply to a tokenizer being loaded")


def loading(settings: BackendSettings, device_map: Any = None) -> BackendSettings:
    """``settings`` with ``device_map`` (a wrapper's own field) in its ``model_kwargs``."""
    if device_map is None:
        return settings
    return replace(settings, model_kwargs={**(settings.model_kwargs or {}),
                                           "device_map": device_map})

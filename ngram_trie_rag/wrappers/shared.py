"""One loaded model per (model, device, dtype, loader options), shared in the process.

The generators are here (:func:`shared_generator`), and the other models a process loads
for its answers, such as the retrieval side's embedder and cross-encoder
(:func:`shared_model`): every caller in the process, a resident worker's requests included,
finds them loaded after the first.

Framework objects are copied freely (LangChain's ``bind`` and ``with_config``, LlamaIndex's
engines each building their own LLM), and loading weights costs seconds and hundreds of
MB, so weights are loaded on first use, once, under a lock. Generators that differ only in
trie shape (``n``, ``prefix_len``) share the weights, the tokenizer, the latency curve and
the model's lock: requests for one model queue on one lock whatever their trie shape.
Generators that differ in engine (``engine``, ``capacity``) share the weights and the
tokenizer too; each engine is built once per loaded model, and requests queue on its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..engine.choice import make_engine
from ..engine.engine_names import check_capacity, check_engine
from ..engine.quant.names import check_scheme
from ..generator import SpeculativeGenerator
from ..loading import default_device, resolve_dtype

_LOCK = threading.Lock()
_BASE: dict[tuple, SpeculativeGenerator] = {}  # weights key -> the first generator loaded
_SHAPED: dict[tuple, SpeculativeGenerator] = {}  # (*that, n, prefix_len) -> its generator
_MODELS: dict[Hashable, Any] = {}
_MODELS_LOCK = threading.Lock()  # its own: an embedder's load never waits for a generator's
T = TypeVar("T")


def _key(model: str | None, device: str | None, dtype: str | None,
         loader: Mapping[str, Any], quantization: str | None = None) -> tuple:
    """Equal settings, equal key: an existing path absolute, a hub id as given, the
    device and dtype resolved, and the loader keywords (by their text: a quantization
    config or a device map compares by what it says)."""
    import torch

    if model is not None and Path(model).expanduser().exists():
        model = str(Path(model).expanduser().resolve())
    if loader.get("device_map") is not None:
        where = precision = None
    else:
        where = torch.device(device) if device else default_device()
        precision = dtype if dtype == "auto" else resolve_dtype(dtype, where)
    return (model, str(where), str(precision), quantization,
            tuple(sorted((k, repr(v)) for k, v in loader.items())))


def shared_generator(model: str | None = None, *, device: str | None = None,
                     dtype: str | None = None, n: int = 13, prefix_len: int = 3,
                     engine: str = "auto", capacity: int | None = None,
                     quantization: str | None = None,
                     model_kwargs: Mapping[str, Any] | None = None,
                     tokenizer_kwargs: Mapping[str, Any] | None = None,
                     chat_template_kwargs: Mapping[str, Any] | None = None,
                     ) -> SpeculativeGenerator:
    """The process-wide generator for this model, engine and trie shape, loading the
    weights on first use (once per model, whatever the engine).

    Args:
        model: a hub id, a local folder or a ``.gguf`` file; ``None`` is the default.
        device: as in ``SpeculativeGenerator.from_pretrained`` (``None``: CUDA if any).
        dtype: likewise (``None``: fp32 on CPU, bf16 on CUDA; ``"auto"``: the model's).
        n: the trie's window (paper: 13).
        prefix_len: the longest matched prefix L_p (paper: 3).
        engine: what runs the forwards, as in ``from_pretrained`` (default ``"auto"``).
        capacity: the cache positions a preallocating engine reserves (``None``: the
            engine's own size).
        quantization: ``"int8"`` / ``"int4"`` / ``"w8a8"``, or ``None`` (as loaded); part of
            what the weights are, so each is loaded once.
        model_kwargs: passed to ``AutoModelForCausalLM.from_pretrained``.
        tokenizer_kwargs: passed to ``AutoTokenizer.from_pretrained``.
        chat_template_kwargs: for the chat template of every prompt of this generator.
    """
    check_capacity(capacity, check_engine(engine))  # before a load, not after
    check_scheme(quantization)
    loader = {"model": dict(model_kwargs or {}), "tokenizer": dict(tokenizer_kwargs or {}),
              "template": dict(chat_template_kwargs or {})}
    key = _key(model, device, dtype, {**loader["model"], **{
        f"tokenizer.{k}": v for k, v in loader["tokenizer"].items()}, **{
        f"template.{k}": v for k, v in loader["template"].items()}}, quantization)
    engine_key = (*key, engine, capacity)
    with _LOCK:
        shaped = _SHAPED.get((*engine_key, n, prefix_len))
        if shaped is not None:
            return shaped
        base = _BASE.get(key)
        if base is None:
            base = SpeculativeGenerator.from_pretrained(
                key[0], device=device, dtype=dtype, engine=engine, capacity=capacity,
                quantization=quantization,
                model_kwargs=loader["model"], tokenizer_kwargs=loader["tokenizer"],
                chat_template_kwargs=loader["template"])
            _BASE[key] = base
        # every engine is built once per loaded model (make_engine keeps it), so another
        # engine over these weights loads nothing
        engine_now = make_engine(base.model, engine, capacity)
        if base.engine is engine_now and (base.config.n, base.config.prefix_len) == (n, prefix_len):
            shaped = base
        else:
            shaped = base.reshaped(engine=engine_now, n=n, prefix_len=prefix_len)
        _SHAPED[(*engine_key, n, prefix_len)] = shaped
        return shaped


def shared_model(key: Hashable, load: Callable[[], T]) -> T:
    """``load()``'s result, loaded once per ``key`` in the process (under a lock, so two
    threads never load it twice); a load that raises stores nothing, and the next call
    tries again. ``key`` names what ``load`` loads, e.g. ``("cross-encoder", name,
    device)``."""
    with _MODELS_LOCK:
        if key not in _MODELS:
            _MODELS[key] = load()
        return _MODELS[key]

"""Checks on what a caller passes in, made once at every public entry point.

Why one module: a bad value that slips past the entry point fails far from it, in a way
that names neither the option nor the value (``temperature=nan`` surfaced as torch's
"probability tensor contains inf, nan or element < 0", ``max_new_tokens=3.7`` as "slice
indices must be integers", a token id past the vocabulary as "index out of range in self"
once the drafter proposed it). Here every problem is a ``TypeError`` (wrong kind of value)
or a ``ValueError`` (right kind, wrong value) whose message names the option and the value.

Rules shared by every check:

* an integer option takes an ``int`` (NumPy integers too) and never a ``bool``: ``True``
  is an ``int`` to Python but never what a caller meant by ``max_new_tokens``;
* a real option takes an ``int`` or a ``float``, finite (no ``nan``, no ``inf``);
* bytes are never text: they are refused with a hint to decode them, because
  ``list(b"E2")`` is ``[69, 50]``, which would silently pass for token ids.

The generator (``generate``/``stream``), ``DraftConfig``, both framework integrations and
the command line call these; their names are the caller's (``max_tokens`` in LangChain).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Below this a temperature overflows the scaled logits to inf in float32 (then softmax
# gives nan); vLLM treats temperatures under 1e-5 as greedy for the same reason.
MIN_TEMPERATURE = 1e-5
# torch.Generator.manual_seed accepts exactly this range.
SEED_RANGE = (-(2**63), 2**64 - 1)
_BYTES = (bytes, bytearray, memoryview)


def _kind(value: Any) -> str:
    return type(value).__name__


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def integer(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]``; ``TypeError`` for a non-integer (a bool,
    a float such as 3.0 or 3.7, a string), ``ValueError`` when out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {_shown(value)} ({_kind(value)})")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def real(name: str, value: Any, *, low: float | None = None, high: float | None = None,
         low_open: bool = False) -> float:
    """``value`` as a finite ``float`` in ``[low, high]`` (``(low, high]`` when
    ``low_open``); ``TypeError`` for a non-number or a bool, ``ValueError`` for nan, inf or
    a value out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {_shown(value)} ({_kind(value)})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def flag(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``; a ``TypeError`` for anything else (``1``,
    ``"yes"``, ``None``), which a lax parser would read as a flag nobody meant to set."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_shown(value)} ({_kind(value)})")
    return value


def temperature(name: str, value: Any) -> float:
    """0 (greedy) or at least ``MIN_TEMPERATURE``: a smaller positive temperature turns the
    scaled logits into inf and the probabilities into nan."""
    value = real(name, value, low=0.0)
    if 0.0 < value < MIN_TEMPERATURE:
        raise ValueError(f"{name} must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {value}")
    return value


def stop_strings(name: str, value: Any) -> list[str]:
    """A string or a list of non-empty strings (an empty stop string would end every
    answer before its first character)."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (*_BYTES, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be a string or a list of strings, got {_kind(value)}")
    items = list(items)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} must hold strings, got {_shown(item)} ({_kind(item)})")
        if not item:
            raise ValueError(f"{name} must not contain an empty string")
    return items


def check_options(names: Mapping[str, str] | None = None, **options: Any) -> dict[str, Any]:
    """Check the generation options given (``None`` means "the default" and is skipped);
    the checked values, normalised (plain ``int`` and ``float``, stop strings a list).

    Known options: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
    ``num_draft``, ``stop``, ``method``. ``names`` maps an option to the caller's name for
    it, so a LangChain user reads ``max_tokens``, the name they passed.
    """
    names = names or {}
    checked = {}
    for option, value in options.items():
        if value is None:
            continue
        label = names.get(option, option)
        check = _OPTION_CHECKS.get(option)
        if check is None:
            raise TypeError(f"unknown generation option {label!r}")
        checked[option] = check(label, value)
    return checked


def _method(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {_shown(value)} ({_kind(value)})")
    return value


_OPTION_CHECKS = {
    "max_new_tokens": lambda name, v: integer(name, v, low=1),
    "temperature": temperature,
    "top_p": lambda name, v: real(name, v, low=0.0, high=1.0, low_open=True),
    "top_k": lambda name, v: integer(name, v, low=0),
    "seed": lambda name, v: integer(name, v, low=SEED_RANGE[0], high=SEED_RANGE[1]),
    "num_draft": lambda name, v: integer(name, v, low=1),
    "stop": stop_strings,
    "method": _method,
}


def check_prompt(prompt: Any) -> None:
    """The prompt's kind: a string, chat messages or token ids. Its content (empty, token
    ids in range, message keys) is checked when it is encoded."""
    if isinstance(prompt, _BYTES):
        raise TypeError("prompt is bytes: decode it to text first, e.g. "
                        "prompt=data.decode('utf-8')")
    if not isinstance(prompt, (str, Sequence)):
        raise TypeError("prompt must be a string, a list of chat messages or a list of token "
                        f"ids, got {_kind(prompt)}")


def check_documents(documents: Any, vocab_size: int | None = None
                    ) -> list[str | list[int]] | None:
    """Documents to draft from, settled: a list of texts and token-id lists; ``None`` stays
    ``None`` (draft from the prompt). Every entry point applies this one policy: the
    generator, and through it the local backend, and the vLLM backend, so both framework
    integrations pass what they retrieved as it is.

    * A wrong kind is a ``TypeError`` (bytes with a hint to decode them: ``list(b"E2")``
      would pass for token ids); text that is not valid Unicode, or a token id outside
      ``[0, vocab_size)`` (when given), is a ``ValueError``: the model has no row for it,
      and it would fail far from here once drafted.
    * Blank documents (empty or whitespace text, an empty token-id list) are dropped: a
      retriever that returns an empty chunk (an image node, an empty page) is doing nothing
      wrong, and there is nothing to draft from in it.
    * Repeats are dropped, first occurrences kept in order: a copy only doubles n-gram
      counts.

    An empty result, like ``None``, drafts from the prompt.
    """
    if documents is None:
        return None
    _document_list_kind(documents)
    settled: list[str | list[int]] = []
    seen: set[str | tuple[int, ...]] = set()
    for i, doc in enumerate(documents):
        checked = _document(i, doc, vocab_size)
        key = checked if isinstance(checked, str) else tuple(checked)
        if checked and key not in seen:
            seen.add(key)
            settled.append(checked)
    return settled


def _document_list_kind(documents: Any) -> None:
    """A ``TypeError`` unless ``documents`` is a collection of documents."""
    if isinstance(documents, _BYTES):
        raise TypeError("documents are bytes: decode them to text first, e.g. "
                        "documents=[data.decode('utf-8')]")
    if isinstance(documents, str):
        raise TypeError("documents must be a list of strings or token-id lists, not a string:"
                        " wrap it, documents=[text]")
    if isinstance(documents, Mapping) or not isinstance(documents, Iterable):
        raise TypeError("documents must be a list of strings or token-id lists, got "
                        f"{_kind(documents)}")


def _document(i: int, doc: Any, vocab_size: int | None) -> str | list[int]:
    """Document ``i`` checked; blank ones come back empty, for the caller to drop."""
    if isinstance(doc, str):
        return valid_text(doc, f"document {i}") if doc.strip() else ""
    if isinstance(doc, _BYTES):
        raise TypeError(f"document {i} is bytes ({_shown(bytes(doc), 30)}): decode it to text "
                        "first, e.g. doc.decode('utf-8')")
    if hasattr(doc, "tolist") and not isinstance(doc, Sequence):  # NumPy array, tensor
        doc = doc.tolist()
    if isinstance(doc, Mapping) or not isinstance(doc, Iterable):
        raise TypeError(f"document {i} must be a string or a list of token ids, got "
                        f"{_kind(doc)}")
    ids = list(doc)
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"document {i} must be a string or a list of token ids (ints); "
                            f"it holds {_shown(token)} ({_kind(token)})")
    ids = [int(t) for t in ids]
    bad = [t for t in ids if vocab_size is not None and not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"document {i} has token ids outside the vocabulary [0, {vocab_size}):"
                         f" {bad[:5]}")
    return ids


def vocab_size(model: Any) -> int:
    """Token ids the model can take and emit: the rows of its input embedding and of its
    output layer (the smaller, should they differ); the config's count when it has none."""
    rows = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        count = layer_rows(getattr(model, get, lambda: None)())
        if count is not None:
            rows.append(count)
    return min(rows) if rows else int(model.config.vocab_size)


def layer_rows(layer: Any) -> int | None:
    """The rows of an embedding or output layer (token ids in, or logits out), from its
    declared size (quantized layers hold no float ``weight``), else its weight's."""
    for size in ("num_embeddings", "out_features"):
        value = getattr(layer, size, None)
        if isinstance(value, int):
            return value
    weight = getattr(layer, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def check_draft_config(n: Any, prefix_len: Any, num_draft: Any, method: Any, adaptive: Any,
                       max_trie_tokens: Any) -> None:
    """Kinds and ranges of the drafting settings (``DraftConfig``); the relation between
    ``n`` and ``prefix_len`` is checked there."""
    integer("n", n)
    integer("prefix_len (L_p)", prefix_len, low=1)
    integer("num_draft", num_draft, low=1)
    integer("max_trie_tokens", max_trie_tokens, low=1)
    _method("method", method)
    flag("adaptive", adaptive)


def not_bool(name: str, value: Any) -> Any:
    """``value`` unless it is a bool given for a number (for pydantic ``before``
    validators: pydantic's lax mode reads ``True`` as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value}")
    return value


def valid_text(text: str, what: str) -> str:
    """Reject strings that cannot be encoded (lone surrogates) with a clear message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text ({exc.reason} at character "
                         f"{exc.start})") from None
    return text

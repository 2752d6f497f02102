"""Where a wrapper's model call runs, decided once from its settings, for every framework.

* ``"local"``: this package's speculative generator (tree drafts, exact per-step stats);
* ``"vllm-server"``: a running vLLM OpenAI server (``base_url``), e.g. one started by
  ``ngram-trie-rag serve``; each request carries its documents in ``vllm_xargs``;
* ``"vllm"``: vLLM's ``AsyncLLM`` in this process, shared per model and engine arguments.

Settings that only one place reads are refused elsewhere rather than silently ignored (a
pinned ``num_draft`` that vLLM never sees would mislead). Each wrapper names its own
fields; the rules are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .openai_http import GenerationOptions

Place = Literal["local", "vllm", "vllm-server"]
BACKENDS = ("local", "vllm")
# Fields only vLLM in this process reads (the same names in every wrapper); a server reads
# none of its own: api_key is not refused elsewhere, generic callers set one for all.
VLLM_ONLY = ("vllm_engine_args", "num_speculative_tokens")


def only_for(local_fields: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Place -> the fields it alone reads, given a wrapper's local-engine field names."""
    return {"local": local_fields, "vllm": VLLM_ONLY, "vllm-server": ()}


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


def foreign_fields(where: Place, given: Iterable[str],
                   only_for: Mapping[str, Iterable[str]]) -> list[str]:
    """The fields in ``given`` that only another place reads (``only_for``: place ->
    the fields it alone reads)."""
    given = set(given)
    return sorted(name for other, names in only_for.items() if other != where
                  for name in names if name in given)


def refuse_local_call_options(where: Place, names: Iterable[str]) -> None:
    """Per-call options (already filtered to those set) that only the local engine honours."""
    refused = sorted(set(names))
    if where != "local" and refused:
        raise ValueError(f"{', '.join(refused)} apply to the local engine only; vLLM drafts "
                         "with its own proposer settings")


def vllm_options(options: Mapping[str, Any]) -> GenerationOptions:
    """The local generator's options (core names) as vLLM request options."""
    return GenerationOptions(max_tokens=options["max_new_tokens"],
                             temperature=options["temperature"], top_p=options["top_p"],
                             top_k=options["top_k"], stop=tuple(options["stop"] or ()),
                             seed=options["seed"], grammar=options.get("grammar"))

"""Serving: drafting inside vLLM (one Drafter per request), clients that reach vLLM's
server or ours, and our own OpenAI-compatible server over the local engine.

Names are imported on first use (PEP 562): importing this package imports neither vLLM
nor the drafting code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..util.lazy import lazy_exports

_EXPORTS = {
    "RequestDrafters": ".request_drafters",
    "DOCUMENTS": ".vllm_proposer",
    "Delta": ".openai_http",
    "OpenAIHTTPBackend": ".openai_http",
    "ServerError": ".openai_http",
    "InProcessVLLM": ".vllm_local",
    "shared_in_process_vllm": ".vllm_local",
    "LocalServer": ".local_server",
}

if TYPE_CHECKING:
    from .local_server import LocalServer
    from .openai_http import Delta, OpenAIHTTPBackend, ServerError
    from .request_drafters import RequestDrafters
    from .vllm_local import InProcessVLLM, shared_in_process_vllm
    from .vllm_proposer import DOCUMENTS

__all__ = [
    "DOCUMENTS",
    "Delta",
    "OpenAIHTTPBackend",
    "RequestDrafters",
    "ServerError",
    "InProcessVLLM",
    "LocalServer",
    "shared_in_process_vllm",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

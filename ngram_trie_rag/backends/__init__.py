"""One seam for every engine: a :class:`Request` in, :class:`Delta` s and an
:class:`Answer` out, sync or async, from the local engine, vLLM in this process or a vLLM
server (see :mod:`.protocol`). Names are imported on first use: importing this package
imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..util.lazy import lazy_exports

_EXPORTS = {
    "Answer": ".types",
    "Backend": ".protocol",
    "BackendSettings": ".settings",
    "Delta": ".types",
    "LocalBackend": ".local",
    "Request": ".types",
    "VLLMBackend": ".vllm",
    "open_backend": ".settings",
}

if TYPE_CHECKING:
    from .local import LocalBackend
    from .protocol import Backend
    from .settings import BackendSettings, open_backend
    from .types import Answer, Delta, Request
    from .vllm import VLLMBackend

__all__ = ["Answer", "Backend", "BackendSettings", "Delta", "LocalBackend", "Request",
           "VLLMBackend", "open_backend"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

"""Optional dependencies, imported where they are first needed, with the fix in the error.

A feature that needs a package the user did not install (xgrammar for grammars, vLLM for
its engine) fails at the call that needs it, with one line naming the feature and the
install command, not with a bare ``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, feature: str, what: str, install: str, *,
            has: str | None = None) -> ModuleType:
    """``module``, imported; else an ImportError: "{feature} needs {what}: {install}".

    ``has``: an attribute the real package defines, so that a folder of the same name on
    the path (an empty namespace package) is not taken for it.
    """
    try:
        found = importlib.import_module(module)
        if has is not None:
            getattr(found, has)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"{feature} needs {what}: {install}") from exc
    return found

"""One message for a keyword nobody reads: name it, suggest the nearest, list the rest.

Every entry point that takes keywords (``SpeculativeGenerator.from_pretrained``, the
options object, both framework wrappers) refuses the ones it does not know instead of
dropping them: ``max_token=16`` silently ignored would run with the default length.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown_keywords(what: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """``"unknown <what> 'max_token' (did you mean 'max_tokens'?); supported: [...]"``."""
    unknown, known = sorted(unknown), sorted(set(known))
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return f"unknown {what} {', '.join(hints)}; supported: {known}"

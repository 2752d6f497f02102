"""How many cases a stress test runs: a few in ``make test``, many in ``make stress``."""

from __future__ import annotations

import os

FULL = os.environ.get("STRESS_FULL") == "1"


def scale(bounded: int, full: int) -> int:
    return full if FULL else bounded

"""Stress tests run bounded in ``make test`` and fully with ``make stress`` (STRESS_FULL=1)."""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("STRESS_FULL") == "1"


def scale(bounded: int, full: int) -> int:
    """How many cases to run: a few in ``make test``, many in ``make stress``."""
    return full if FULL else bounded


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/stress/" in str(item.fspath):
            item.add_marker(pytest.mark.stress)

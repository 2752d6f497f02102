"""Everything under tests/stress is marked ``stress``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/stress/" in str(item.fspath):
            item.add_marker(pytest.mark.stress)

"""Rows of the shared benchmark data (``../shared/data`` beside the project)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_jsonl(relative: str, limit: int | None = None) -> list[dict]:
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder sits beside the project)")
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit]

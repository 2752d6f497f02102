"""Large inputs: a passage count and a time estimate before the embedding, caps that stop
an oversized build before it embeds anything, and embedding batch by batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ngram_trie_rag.retrieval.batches as batches
from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.retrieval import Embedder, Passage, Retriever, VectorIndex
from ngram_trie_rag.retrieval.limits import InputTooLargeError, human_bytes

pytestmark = pytest.mark.usefixtures("one_thread")


def passages(n: int) -> list[Passage]:
    topics = ["espresso", "descaling", "grinder", "steam wand", "water tank", "error E2"]
    return [Passage(f"p{i}", f"Note {i} about the {topics[i % len(topics)]} of the Aurora K3.",
                    "notes.txt") for i in range(n)]


def test_batch_bounds_probe_then_full_batches() -> None:
    assert batches.batch_bounds(2100, probe=64, size=1024) == [(0, 64), (64, 1088), (1088, 2100)]
    assert batches.batch_bounds(10, probe=64, size=1024) == [(0, 10)]
    assert batches.batch_bounds(0) == []


def test_estimate_line_says_count_time_and_rate() -> None:
    line = batches.estimate_line(41_000, 64, 4.0, "MiniLM")
    assert line.startswith("embedding 41,000 passages with MiniLM: about 42 min")
    assert "16 passages/s" in line and "first 64" in line
    assert batches.duration(5400) == "1 h 30 min" and human_bytes(20 * 2**20) == "20.0 MB"


class Spy:
    """Records the size of every ``encode`` call of an embedder."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder, self.calls = embedder, []
        self.name, self.dim = embedder.name, embedder.dim

    def encode(self, texts, progress=None):
        self.calls.append(len(texts))
        return self.embedder.encode(texts, progress=False)

    def encode_queries(self, texts, progress=None):
        return self.embedder.encode_queries(texts, progress=False)


@pytest.mark.parametrize("factory", [None, "IVF4,Flat"])
def test_batches_match_one_shot_and_stay_small(embedder: Embedder, factory: str | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "PROBE_SIZE", 8)
    monkeypatch.setattr(batches, "BATCH_SIZE", 32)
    items = passages(150)
    spy = Spy(embedder)
    lines: list[str] = []
    batched = VectorIndex(spy, factory=factory)  # type: ignore[arg-type]
    batched.add(items, report=lines.append, progress=False)
    assert spy.calls == [8, 32, 32, 32, 32, 14]  # never the whole corpus in one call
    assert len(lines) == 1 and lines[0].startswith("embedding 150 passages")
    one_shot = VectorIndex(embedder, factory=factory)
    one_shot.add(items, embedder.encode([p.text for p in items], progress=False))
    query = embedder.encode_queries(["What does error E2 mean?"])
    assert batched.factory == one_shot.factory
    found = [[p.id for p in hits] for hits in batched.search(query, k=10)]
    expected = [[p.id for p in hits] for hits in one_shot.search(query, k=10)]
    if factory is None:
        assert found == expected
    else:  # IVF: trained on the first batches, not on everything: same top result
        assert found[0][0] == expected[0][0]


def test_caps_stop_before_anything_is_embedded(embedder: Embedder, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(embedder, "encode", lambda texts, **_: calls.append(len(texts)))
    with pytest.raises(InputTooLargeError, match="150 passages, over the limit of 100"):
        Retriever.build(passages(150), embedder=embedder, max_passages=100)
    (tmp_path / "big.txt").write_text("word " * 5000)
    with pytest.raises(InputTooLargeError, match="24.4 KB in 1 files, over the limit of 10.0 KB"):
        Retriever.build(tmp_path, embedder=embedder, max_bytes=10 * 1024)
    assert calls == []


def test_index_build_reports_count_and_estimate(tmp_path: Path, capsys) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text(" ".join(p.text for p in passages(600)))
    assert main(["index", "build", str(docs), "--out", str(tmp_path / "idx")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "passages" in line]
    assert err[0].startswith("1 files, ") and err[0].endswith(" passages")
    assert err[1].startswith("embedding ") and " about " in err[1]
    assert np.isfinite(float(err[1].split(" at ")[1].split()[0]))

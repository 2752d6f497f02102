"""VectorIndex: policy, training errors, search, incremental add, persistence and its failures.

Vectors are random unit vectors (fast, and exact-search results are then known); the
embedder is the real packaged MiniLM, whose identity the index records.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from retrieval_support import build_tiny_sentence_transformer

from ngram_trie_rag.retrieval import (
    Embedder,
    IndexBuildError,
    IndexLoadError,
    IndexSaveError,
    Passage,
    VectorIndex,
    choose_factory,
)
from ngram_trie_rag.retrieval import store as store_module
from ngram_trie_rag.retrieval.jsonl import jsonl_rows
from ngram_trie_rag.retrieval.policy import default_nprobe, nlist_for_count, pq_m_for_dim

DIM = 384


pytestmark = pytest.mark.usefixtures("one_thread")


def unit_vectors(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_passages(n: int, start: int = 0) -> list[Passage]:
    return [
        Passage(id=f"p{i}", text=f"passage {i}", source=f"doc{i % 7}.txt", metadata={"i": i})
        for i in range(start, start + n)
    ]


def build(embedder: Embedder, n: int, factory: str | None = None, seed: int = 0):
    vectors = unit_vectors(n, seed, dim=embedder.dim)
    index = VectorIndex(embedder, factory=factory)
    index.add(make_passages(n), vectors)
    return index, vectors


def ids(results: list[list[Passage]]) -> list[list[str]]:
    return [[p.id for p in row] for row in results]


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


# --- policy ---------------------------------------------------------------------------------


def test_policy_flat_below_10k_then_scaled_ivf_pq() -> None:
    assert choose_factory(1, DIM) == "Flat"
    assert choose_factory(9_999, DIM) == "Flat"
    assert choose_factory(10_000, DIM) == "IVF256,PQ64"  # 10000/39 = 256.4
    assert choose_factory(50_000, DIM) == "IVF1024,PQ64"
    assert choose_factory(170_000, DIM) == "IVF4096,PQ64"  # the paper's, from ~160k
    assert choose_factory(10_000_000, DIM) == "IVF4096,PQ64"  # capped
    assert choose_factory(200_000, 1024) == "IVF4096,PQ64"  # bge-m3: 1024/64 = 16
    assert choose_factory(200_000, 100) == "IVF4096,PQ50"  # m must divide dim


def test_policy_helpers() -> None:
    assert nlist_for_count(38) == 1 and nlist_for_count(3_600) == 64
    assert pq_m_for_dim(384) == 64 and pq_m_for_dim(100) == 50 and pq_m_for_dim(7) == 7
    assert default_nprobe("IVF4096,PQ64") == 16 and default_nprobe("IVF8,Flat") == 8
    assert default_nprobe("Flat") is None


def test_small_corpus_gets_exact_flat(embedder: Embedder) -> None:
    index, vectors = build(embedder, 500)
    assert index.factory == "Flat" and index.nprobe is None
    found = index.search(vectors[:20], k=3)
    assert [row[0].id for row in found] == [f"p{i}" for i in range(20)]
    assert found[0][0].score == pytest.approx(1.0, abs=1e-5)
    assert found[0][0].metadata == {"i": 0}


@pytest.mark.slow
def test_10k_vectors_get_ivf_pq(tmp_path: Path) -> None:
    """The policy's first IVF-PQ size, trained and searched. MiniLM's 384 dimensions get
    the paper's PQ64, whose training costs FAISS about 0.4 s per sub-quantizer on one
    thread (27 s in all); an embedder of 16 dimensions gets PQ16, the same code path."""
    assert choose_factory(10_000, DIM) == "IVF256,PQ64"
    small = Embedder(build_tiny_sentence_transformer(tmp_path / "tiny", dim=16))
    index, vectors = build(small, 10_000)
    assert index.factory == "IVF256,PQ16" and index.nprobe == 16
    found = index.search(vectors[:5], k=10)
    assert all(len(row) == 10 for row in found)
    assert all(row[0].score >= row[-1].score for row in found)


# --- explicit factories and training errors ----------------------------------------------------


def test_ivf_pq_training_error_when_too_few_vectors(embedder: Embedder) -> None:
    index = VectorIndex(embedder, factory="IVF64,PQ16")
    with pytest.raises(IndexBuildError, match="needs at least 64") as excinfo:
        index.add(make_passages(40), unit_vectors(40))
    assert "\n" not in str(excinfo.value)
    # 8-bit PQ needs 256 training points even when nlist is satisfied.
    with pytest.raises(IndexBuildError, match="256"):
        index.add(make_passages(100), unit_vectors(100))
    assert len(index) == 0  # failed trainings leave the index empty and usable
    index.add(make_passages(1_000), unit_vectors(1_000))
    assert len(index) == 1_000 and index.factory == "IVF64,PQ16" and index.nprobe == 16


def test_invalid_factory_string(embedder: Embedder) -> None:
    index = VectorIndex(embedder, factory="NotAnIndex42")
    with pytest.raises(IndexBuildError, match="invalid FAISS factory"):
        index.add(make_passages(10), unit_vectors(10))


def test_search_edge_cases(embedder: Embedder) -> None:
    empty = VectorIndex(embedder)
    assert empty.search(unit_vectors(2), k=5) == [[], []]
    index, vectors = build(embedder, 3)
    assert len(index.search(vectors[0], k=100)[0]) == 3  # 1-D query, k > count: no -1 ids
    with pytest.raises(ValueError, match="shape"):
        index.search(np.ones((1, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="passages but"):
        index.add(make_passages(2), unit_vectors(3))


def test_ivf_drops_padding_ids(embedder: Embedder) -> None:
    index = VectorIndex(embedder, factory="IVF16,Flat", nprobe=1)
    index.add(make_passages(400), unit_vectors(400))
    (row,) = index.search(unit_vectors(1, seed=9), k=400)
    assert 0 < len(row) < 400  # one list of 16 searched: FAISS pads with -1, dropped
    assert all(isinstance(p, Passage) for p in row)


# --- incremental add ----------------------------------------------------------------------------


def test_incremental_add_matches_single_add(embedder: Embedder) -> None:
    vectors = unit_vectors(300, seed=1)
    passages = make_passages(300)
    whole = VectorIndex(embedder)
    whole.add(passages, vectors)
    parts = VectorIndex(embedder)
    for start in (0, 100, 250):
        end = {0: 100, 100: 250, 250: 300}[start]
        parts.add(passages[start:end], vectors[start:end])
    queries = unit_vectors(10, seed=2)
    assert len(parts) == 300
    assert ids(parts.search(queries, k=20)) == ids(whole.search(queries, k=20))


def test_incremental_add_after_ivf_training(embedder: Embedder) -> None:
    index = VectorIndex(embedder, factory="IVF16,Flat", nprobe=16)
    index.add(make_passages(800), unit_vectors(800))
    more = unit_vectors(50, seed=5)
    index.add(make_passages(50, start=800), more)  # no retraining: appended to the lists
    assert len(index) == 850
    assert [row[0].id for row in index.search(more[:5], k=1)] == [f"p{i}" for i in range(800, 805)]


def test_add_embeds_text_when_no_vectors(embedder: Embedder) -> None:
    index = VectorIndex(embedder)
    index.add([
        Passage("a", "The Eiffel Tower is in Paris.", "x"),
        Passage("b", "Photosynthesis happens in chloroplasts.", "y"),
    ])
    query = embedder.encode_queries(["Where is the Eiffel Tower?"])
    assert index.search(query, k=1)[0][0].id == "a"


# --- persistence --------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [None, "IVF16,PQ16"])
def test_save_load_round_trip(embedder: Embedder, tmp_path: Path, factory: str | None) -> None:
    index, _ = build(embedder, 600, factory=factory)
    queries = unit_vectors(15, seed=3)
    before = index.search(queries, k=10)
    index.save(tmp_path / "idx")
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == [
        "index.faiss", "manifest.json", "passages.jsonl",
    ]
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["count"] == 600
    assert manifest["embedder"] == embedder.name and manifest["dim"] == DIM
    assert manifest["factory"] == (factory or "Flat")
    assert set(manifest["files"]) == {"index.faiss", "passages.jsonl"}

    loaded = VectorIndex.load(tmp_path / "idx", embedder)
    after = loaded.search(queries, k=10)
    assert ids(after) == ids(before)
    assert [p.score for r in after for p in r] == pytest.approx(
        [p.score for r in before for p in r], abs=1e-6
    )
    assert after[0][0].metadata == before[0][0].metadata
    assert loaded.nprobe == index.nprobe and loaded.factory == index.factory
    # Loaded indexes keep growing.
    loaded.add(make_passages(5, start=600), unit_vectors(5, seed=4))
    assert len(loaded) == 605


def test_load_without_embedder_recreates_it_lazily(embedder: Embedder, tmp_path: Path) -> None:
    index, vectors = build(embedder, 50)
    index.save(tmp_path / "idx")
    loaded = VectorIndex.load(tmp_path / "idx")
    assert loaded.embedder.name == embedder.name and loaded.embedder._model is None
    assert loaded.search(vectors[:1], k=1)[0][0].id == "p0"


def test_empty_index_round_trip(embedder: Embedder, tmp_path: Path) -> None:
    VectorIndex(embedder, factory="IVF16,Flat").save(tmp_path / "idx")
    loaded = VectorIndex.load(tmp_path / "idx", embedder)
    assert len(loaded) == 0 and loaded.factory == "IVF16,Flat"
    loaded.add(make_passages(500), unit_vectors(500))  # trains on first add, as when new
    assert len(loaded) == 500


def test_mismatched_embedder_is_refused(embedder: Embedder, tmp_path: Path) -> None:
    index, _ = build(embedder, 20)
    index.save(tmp_path / "idx")
    before = folder_digest(tmp_path / "idx")
    other = Embedder(build_tiny_sentence_transformer(tmp_path / "tiny", dim=32))
    with pytest.raises(IndexLoadError, match="built with embedder") as excinfo:
        VectorIndex.load(tmp_path / "idx", other)
    assert "all-MiniLM-L6-v2" in str(excinfo.value) and "\n" not in str(excinfo.value)
    assert folder_digest(tmp_path / "idx") == before


@pytest.fixture
def saved(embedder: Embedder, tmp_path: Path) -> Path:
    index, _ = build(embedder, 40)
    index.save(tmp_path / "idx")
    return tmp_path / "idx"


def _corrupt_flip_byte(folder: Path) -> None:
    path = folder / "index.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate_passages(folder: Path) -> None:
    path = folder / "passages.jsonl"
    path.write_bytes(path.read_bytes()[:-30])


def _truncate_index(folder: Path) -> None:
    path = folder / "index.faiss"
    path.write_bytes(path.read_bytes()[:100])


def _delete_index_file(folder: Path) -> None:
    (folder / "index.faiss").unlink()


def _delete_manifest(folder: Path) -> None:
    (folder / "manifest.json").unlink()


def _future_version(folder: Path) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 99
    path.write_text(json.dumps(manifest))


def _garbage_manifest(folder: Path) -> None:
    (folder / "manifest.json").write_text("{ not json")


def _wrong_dim(folder: Path) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["dim"] = 1024
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_corrupt_flip_byte, "checksum mismatch .*index.faiss"),
        (_truncate_index, "corrupted or truncated"),
        (_truncate_passages, "checksum mismatch .*passages.jsonl"),
        (_delete_index_file, "index file missing"),
        (_delete_manifest, "manifest.json is missing"),
        (_future_version, "unsupported index format version 99"),
        (_garbage_manifest, "corrupted manifest"),
        (_wrong_dim, "inconsistent"),
    ],
)
def test_damaged_index_gives_clear_error_and_is_untouched(saved: Path, damage, expected) -> None:
    damage(saved)
    before = folder_digest(saved)
    with pytest.raises(IndexLoadError, match=expected) as excinfo:
        VectorIndex.load(saved)
    assert "\n" not in str(excinfo.value)
    assert folder_digest(saved) == before


def test_missing_index_folder(tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError, match="index not found"):
        VectorIndex.load(tmp_path / "nowhere")


# --- atomic save ------------------------------------------------------------------------------


def test_crash_mid_save_keeps_previous_index(
    embedder: Embedder, saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = folder_digest(saved)
    previous = VectorIndex.load(saved, embedder).search(unit_vectors(3, seed=7), k=5)
    bigger, _ = build(embedder, 80, seed=1)

    real_write = store_module._write_file

    def crash_on_passages(path: Path, data: bytes) -> dict:
        if path.name == "passages.jsonl":
            path.write_bytes(data[: len(data) // 2])  # half-written, then the "crash"
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(store_module, "_write_file", crash_on_passages)
    with pytest.raises(OSError, match="No space left"):
        bigger.save(saved)
    monkeypatch.undo()

    assert folder_digest(saved) == before
    after = VectorIndex.load(saved, embedder).search(unit_vectors(3, seed=7), k=5)
    assert ids(after) == ids(previous)
    assert sorted(p.name for p in saved.parent.iterdir()) == ["idx"]  # no temp leftovers


def test_overwrite_replaces_and_cleans_up(embedder: Embedder, saved: Path) -> None:
    bigger, _ = build(embedder, 80, seed=1)
    bigger.save(saved)
    assert len(VectorIndex.load(saved, embedder)) == 80
    assert sorted(p.name for p in saved.parent.iterdir()) == ["idx"]


def test_refuses_to_overwrite_a_non_index_folder(embedder: Embedder, tmp_path: Path) -> None:
    docs = tmp_path / "my_documents"
    docs.mkdir()
    (docs / "precious.txt").write_text("do not delete", encoding="utf-8")
    index, _ = build(embedder, 5)
    with pytest.raises(IndexSaveError, match="not an index"):
        index.save(docs)
    assert (docs / "precious.txt").read_text(encoding="utf-8") == "do not delete"
    shutil.rmtree(docs)
    index.save(docs)  # a fresh path is fine
    assert (docs / "manifest.json").is_file()


def _faiss_index(data: bytes) -> object:
    import faiss

    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


def _passages(data: bytes) -> list[Passage]:
    rows = jsonl_rows(data.decode("utf-8").splitlines(), store_module.PASSAGES_FILE)
    return [Passage.from_dict(row) for _, row in rows]


# How each saved file is read: its own format's parser, none of which runs code.
SAVED_FILE_READERS = {
    store_module.MANIFEST: lambda data: json.loads(data.decode("utf-8")),
    store_module.PASSAGES_FILE: _passages,
    store_module.INDEX_FILE: _faiss_index,
}


def _looks_pickled(data: bytes) -> bool:
    """A pickle of protocol 2 or later opens with PROTO (0x80) and the protocol number."""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def test_no_pickle_in_saved_files(saved: Path) -> None:
    """Every file a save writes -- whatever files it writes -- is read by its own
    format's parser, and none is a pickle."""
    import pickle

    assert _looks_pickled(pickle.dumps({"passages": []}))  # the check knows a pickle
    files = sorted(p for p in saved.rglob("*") if p.is_file())
    assert {p.name for p in files} >= set(SAVED_FILE_READERS)
    for path in files:
        data = path.read_bytes()
        assert not _looks_pickled(data), f"{path.name} is a pickle"
        reader = SAVED_FILE_READERS.get(path.name)
        assert reader is not None, f"{path.name}: a saved file with no reader checked here"
        reader(data)  # raises if the file is not in its format
    stored = store_module.read_index_dir(saved)  # and the folder loads as a whole
    assert stored.index.ntotal == len(stored.passages) == 40

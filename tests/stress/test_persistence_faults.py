"""Damaged, foreign and half-written index folders.

A saved index is read back from disk that may have been truncated, bit-rotted, partly
deleted, hand-edited or written by another version. Loading must then fail with the
package's own ``IndexLoadError`` (which the CLI prints as one line and the index cache
answers by rebuilding), never with another exception or a crash, and must not modify the
folder. A save that dies before its final rename must leave the previous index in place.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from data_files import read_jsonl
from stress_scale import scale

from ngram_trie_rag.retrieval import Embedder, IndexLoadError, Passage, Retriever
from ngram_trie_rag.retrieval.store import (
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST,
    PASSAGES_FILE,
    REQUIRED_KEYS,
)

PASSAGES = 50
FILES = (INDEX_FILE, PASSAGES_FILE, MANIFEST)
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Saved:
    """A pristine saved index: its folder, file bytes and what loading it must give."""

    folder: Path
    files: dict[str, bytes]
    passages: list[dict[str, Any]]
    vectors: np.ndarray


def content(retriever: Retriever) -> tuple[list[dict[str, Any]], np.ndarray]:
    """What an index holds: its passages and its stored vectors."""
    index = retriever.index
    vectors = index._index.reconstruct_n(0, index._index.ntotal)
    return [p.to_dict() for p in index.passages], vectors


def wiki_passages(start: int, stop: int) -> list[Passage]:
    rows = read_jsonl("wiki_passages/passages.jsonl", stop)[start:stop]
    return [Passage(id=r["id"], text=r["contents"], source="wiki") for r in rows]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Saved:
    folder = tmp_path_factory.mktemp("pristine") / "index"
    retriever = Retriever.build(wiki_passages(0, PASSAGES), embedder=embedder)
    retriever.save(folder)
    passages, vectors = content(retriever)
    assert len(passages) == PASSAGES
    return Saved(folder, {name: (folder / name).read_bytes() for name in FILES}, passages,
                 vectors)


def fresh_copy(saved: Saved, tmp_path: Path, name: str = "index") -> Path:
    folder = tmp_path / name
    shutil.copytree(saved.folder, folder)
    return folder


# ---- faults: each damages a copy and returns the names of the files it touched ----------------
def truncate(folder: Path, rng: random.Random) -> set[str]:
    name = rng.choice(FILES)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: rng.randrange(len(data))])
    return {name}


def flip_bytes(folder: Path, rng: random.Random) -> set[str]:
    name = rng.choice(FILES)
    data = bytearray((folder / name).read_bytes())
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)  # never a no-op
    (folder / name).write_bytes(bytes(data))
    return {name}


def delete_file(folder: Path, rng: random.Random) -> set[str]:
    name = rng.choice(FILES)
    (folder / name).unlink()
    return {name}


def edit_manifest(folder: Path, **fields: Any) -> set[str]:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest.update(fields)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return {MANIFEST}


def other_version(folder: Path, rng: random.Random) -> set[str]:
    versions = [0, FORMAT_VERSION + 1, FORMAT_VERSION + 99, -1, str(FORMAT_VERSION), None,
                "latest", [FORMAT_VERSION], {"major": FORMAT_VERSION}]
    return edit_manifest(folder, format_version=rng.choice(versions))


def other_embedder(folder: Path, rng: random.Random) -> set[str]:
    names = ["BAAI/bge-m3", "sentence-transformers/all-mpnet-base-v2", "all-MiniLM-L12-v2",
             "/models/minilm", "", f"org/model-{rng.randrange(10**6)}"]
    return edit_manifest(folder, embedder=rng.choice(names))


def garbage_json(folder: Path, rng: random.Random) -> set[str]:
    text = (folder / MANIFEST).read_text(encoding="utf-8")
    manifest = json.loads(text)
    dropped = rng.choice(REQUIRED_KEYS)
    variants = [
        lambda: bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))),
        lambda: text[: rng.randrange(len(text))].encode("utf-8"),
        lambda: rng.choice(["[]", "{}", "null", "42", '"manifest"', "true", "NaN"]).encode(),
        lambda: json.dumps({k: v for k, v in manifest.items() if k != dropped}).encode(),
        lambda: json.dumps({**manifest, "files": rng.choice([{}, [], None, "x"])}).encode(),
        lambda: json.dumps({**manifest, "format": "faiss"}).encode(),
        lambda: (text + rng.choice(["}", "\x00", ",", "{}"])).encode("utf-8"),
    ]
    (folder / MANIFEST).write_bytes(rng.choice(variants)())
    return {MANIFEST}


FAULTS = [truncate, flip_bytes, delete_file, other_version, other_embedder, garbage_json]


@pytest.mark.parametrize("seed", range(scale(20, 200)))
def test_random_fault_is_an_index_load_error_and_leaves_other_files_alone(
        seed: int, saved: Saved, embedder: Embedder, tmp_path: Path) -> None:
    """Fault ``seed`` is ``FAULTS[seed % 6]`` with ``random.Random(seed)``: reproducible."""
    rng = random.Random(seed)
    fault = FAULTS[seed % len(FAULTS)]
    folder = fresh_copy(saved, tmp_path)
    touched = fault(folder, rng)
    after_fault = {p.name: p.read_bytes() for p in folder.iterdir()}
    try:
        loaded = Retriever.load(folder, embedder=embedder)
    except IndexLoadError as exc:
        assert str(folder) in str(exc)  # the message names the index it refused
    else:
        # The manifest carries no checksum of itself, so a flipped byte in a field that
        # loading ignores (a timestamp, a byte count, indentation) changes nothing.
        assert fault is flip_bytes and touched == {MANIFEST}, f"{fault.__name__} loaded"
        passages, vectors = content(loaded)
        assert passages == saved.passages and np.array_equal(vectors, saved.vectors)
    for name in set(FILES) - touched:
        assert (folder / name).read_bytes() == saved.files[name]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == after_fault  # read-only


def test_pristine_copy_loads_with_its_content(saved: Saved, embedder: Embedder,
                                              tmp_path: Path) -> None:
    """The baseline the faults are measured against."""
    loaded = Retriever.load(fresh_copy(saved, tmp_path), embedder=embedder)
    passages, vectors = content(loaded)
    assert passages == saved.passages and np.array_equal(vectors, saved.vectors)
    query = saved.passages[7]["text"][:200]
    assert loaded.retrieve(query, top_n=1)[0].id == saved.passages[7]["id"]


# ---- consistent but invalid content: found by the faults above, kept as reproductions ---------
def rewrite_with_checksum(folder: Path, name: str, data: bytes) -> None:
    """Replace a data file and record its new checksum, as a hand edit or a buggy writer
    would: the checksum no longer protects the parser behind it."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def load_error_only(folder: Path, embedder: Embedder) -> None:
    with pytest.raises(IndexLoadError):
        Retriever.load(folder, embedder=embedder)


def test_deeply_nested_manifest_is_an_index_load_error(saved: Saved, embedder: Embedder,
                                                       tmp_path: Path) -> None:
    folder = fresh_copy(saved, tmp_path)
    (folder / MANIFEST).write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    load_error_only(folder, embedder)


@pytest.mark.parametrize("edit", [(b'"score": null', b'"score": "high"'),
                                  (b'"metadata": {}', b'"metadata": "none"')])
def test_passage_record_with_wrong_types_is_an_index_load_error(
        edit: tuple[bytes, bytes], saved: Saved, embedder: Embedder, tmp_path: Path) -> None:
    folder = fresh_copy(saved, tmp_path)
    old, new = edit
    assert old in saved.files[PASSAGES_FILE]
    rewrite_with_checksum(folder, PASSAGES_FILE, saved.files[PASSAGES_FILE].replace(old, new, 1))
    load_error_only(folder, embedder)


@pytest.mark.parametrize("fields", [{"factory": "IVF16,Flat", "nprobe": 4},
                                    {"factory": "IVF16,Flat", "nprobe": "four"}])
def test_manifest_recipe_that_does_not_fit_the_index_is_an_index_load_error(
        fields: dict[str, Any], saved: Saved, embedder: Embedder, tmp_path: Path) -> None:
    folder = fresh_copy(saved, tmp_path)
    edit_manifest(folder, **fields)
    load_error_only(folder, embedder)


# ---- interrupted saves -------------------------------------------------------------------------
def only_entries(parent: Path) -> list[str]:
    """Everything in the parent folder: no temporary or set-aside copies may remain."""
    return sorted(p.name for p in parent.iterdir())


@pytest.mark.parametrize("step", ["move_old_aside", "final_rename", "write"])
def test_interrupted_save_keeps_the_previous_index(step: str, saved: Saved, embedder: Embedder,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The save's last renames (or a write before them) fail as a crash or a full disk
    would; the target still holds the old index, byte for byte."""
    target = fresh_copy(saved, tmp_path)
    newer = Retriever.build(wiki_passages(PASSAGES, PASSAGES + 10), embedder=embedder)
    rename, fsync = Path.rename, os.fsync
    calls = {"fsync": 0}

    def failing_rename(self: Path, destination: Any) -> Any:
        moving_old = self == target
        moving_new = self.name.startswith(f".{target.name}.tmp-")
        if (step == "move_old_aside" and moving_old) or (step == "final_rename" and moving_new):
            raise OSError(f"simulated crash renaming {self.name}")
        return rename(self, destination)

    def failing_fsync(fd: int) -> None:
        calls["fsync"] += 1
        if calls["fsync"] == len(FILES):  # the manifest, the last file written
            raise OSError("simulated full disk")
        fsync(fd)

    monkeypatch.setattr(Path, "rename", failing_rename)
    if step == "write":
        monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="simulated"):
        newer.save(target)
    monkeypatch.undo()

    assert only_entries(tmp_path) == [target.name]
    assert {name: (target / name).read_bytes() for name in FILES} == saved.files
    passages, vectors = content(Retriever.load(target, embedder=embedder))
    assert passages == saved.passages and np.array_equal(vectors, saved.vectors)
    newer.save(target)  # and the next save goes through
    assert content(Retriever.load(target, embedder=embedder))[0] == content(newer)[0]


def test_interrupted_first_save_leaves_nothing(embedder: Embedder, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    retriever = Retriever.build(wiki_passages(0, 5), embedder=embedder)
    rename = Path.rename

    def failing_rename(self: Path, destination: Any) -> Any:
        if self.name.startswith(".index.tmp-"):
            raise OSError("simulated crash")
        return rename(self, destination)

    monkeypatch.setattr(Path, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        retriever.save(tmp_path / "index")
    assert only_entries(tmp_path) == []


# ---- no pickle anywhere a saved file is read -------------------------------------------------
PICKLING_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve",
                    "marshal"}


def pickle_uses(path: Path) -> list[str]:
    """Imports of pickling modules, ``torch.load`` and ``allow_pickle=`` in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call):
            names = [ast.unparse(node.func)]
            names += ["allow_pickle" for k in node.keywords if k.arg == "allow_pickle"]
        for name in names:
            if (name.split(".")[0] in PICKLING_MODULES or name == "allow_pickle"
                    or name.endswith("torch.load")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_package_source_never_unpickles() -> None:
    sources = [p for top in ("ngram_trie_rag", "integrations") for p in (ROOT / top).rglob("*.py")
               if "tests" not in p.relative_to(ROOT).parts]
    assert ROOT / "ngram_trie_rag" / "retrieval" / "store.py" in sources
    assert any("langchain_ngram_trie" in p.parts for p in sources)
    assert any("ngram_trie" in p.parts and "llms" in p.parts for p in sources)
    assert [use for path in sources for use in pickle_uses(path)] == []

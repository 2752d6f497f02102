"""On-disk index format: a folder with ``index.faiss``, ``passages.jsonl``, ``manifest.json``.

Why this shape:
* No pickle: the FAISS index is FAISS's own serialisation, passages are JSON lines, the
  manifest is JSON. Loading a folder from someone else cannot execute code.
* The manifest records the embedder (name, dim) and the index recipe (factory, nprobe), so
  an index is never searched with vectors from a different model, and sha256 checksums, so
  a truncated or corrupted file is reported instead of crashing FAISS.
* Saves are atomic: everything is written into a temporary sibling folder, flushed, then
  renamed into place (``swap``). A crash mid-save leaves the previous index (or nothing)
  at the target path, never a half-written one.
* Saves never delete what they did not write: an existing folder is replaced only when its
  manifest is really one of ours (format, version, listed files), and then only the
  index's own files; a user's file inside an index folder survives a rebuild.
* Saves into one folder take turns under a lock beside it (``build_lock``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .build_lock import build_lock
from .errors import IndexLoadError, IndexSaveError
from .jsonl import JsonlError, jsonl_rows
from .passage import Passage
from .policy import factory_nlist
from .swap import new_tmp, publish, recover

FORMAT_NAME = "ngram-trie-rag-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"
REQUIRED_KEYS = ("embedder", "dim", "factory", "nprobe", "count", "files")
OWNED_FILES = frozenset({MANIFEST, INDEX_FILE, PASSAGES_FILE})
# How long a save waits for another save into the same folder (one holds it for seconds;
# ``index build`` holds it while embedding and fails at once instead).
SAVE_WAIT_S = 600.0


@dataclass
class StoredIndex:
    """What a saved folder holds, after validation."""

    index: Any  # faiss.Index
    passages: list[Passage]
    manifest: dict[str, Any]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes) -> dict[str, Any]:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return {"sha256": sha256_bytes(data), "bytes": len(data)}


def _passages_jsonl(passages: list[Passage]) -> bytes:
    lines = (json.dumps(p.to_dict(), ensure_ascii=False) for p in passages)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def owned_files(folder: Path) -> frozenset[str] | None:
    """The files an index of ours at ``folder`` owns (its manifest and the files the
    manifest lists), or ``None`` when ``folder`` holds no such index.

    A file named ``manifest.json`` alone proves nothing (web apps and browser extensions
    have one): the manifest must name this format and version and list exactly the files
    this version writes. Only then may a save replace those files, and only those.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        return None
    files = manifest.get("files")
    if manifest.get("format_version") != FORMAT_VERSION or not isinstance(files, dict):
        return None
    if set(files) != set(OWNED_FILES) - {MANIFEST}:
        return None
    return OWNED_FILES


def check_target(target: Path) -> None:
    """Refuse a target that is a file, or a non-empty folder that is not our index."""
    if target.exists() and not target.is_dir():
        raise IndexSaveError(f"cannot save index to {target}: it is a file")
    if target.is_dir() and owned_files(target) is None and any(target.iterdir()):
        raise IndexSaveError(
            f"refusing to save index to {target}: folder exists and is not an index (no "
            f"{FORMAT_NAME} {MANIFEST}); nothing was changed, choose an empty or new folder"
        )


def write_index_dir(
    path: str | os.PathLike,
    index: Any,
    passages: list[Passage],
    fields: dict[str, Any],
    *,
    wait_s: float = SAVE_WAIT_S,
) -> Path:
    """Atomically write ``index`` (a CPU faiss index) + passages + manifest to ``path``.

    ``fields`` go into the manifest (embedder, dim, factory, nprobe, and any extras).
    Refuses to replace an existing non-empty folder that is not an index, so a mistyped
    ``--out`` can never delete someone's documents; in an existing index folder only the
    index's own files are replaced, anything else in it is kept (see ``swap``). Saves into
    one folder take turns (see ``build_lock``), waiting up to ``wait_s`` seconds.
    """
    import faiss

    target = Path(os.path.realpath(path))  # a symlink's folder, not the link, is replaced
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target, wait_s):
        recover(target, OWNED_FILES)
        check_target(target)  # again: another build may have finished meanwhile
        tmp = new_tmp(target)
        try:
            files = {
                INDEX_FILE: _write_file(tmp / INDEX_FILE, faiss.serialize_index(index).tobytes()),
                PASSAGES_FILE: _write_file(tmp / PASSAGES_FILE, _passages_jsonl(passages)),
            }
            manifest = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                **fields,
                "count": len(passages),
                "metric": "inner_product",
                "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "files": files,
            }
            _write_file(tmp / MANIFEST, json.dumps(manifest, indent=2).encode("utf-8"))
            publish(tmp, target, owned_files(target) or frozenset())
        finally:
            if tmp.exists():  # only index files inside: never a user's
                recover(target, OWNED_FILES)
    return target


def _read_manifest(folder: Path) -> dict[str, Any]:
    if not folder.exists():
        raise IndexLoadError(f"index not found: {folder}")
    if not folder.is_dir():
        raise IndexLoadError(f"index path {folder} is not a folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise IndexLoadError(f"{folder} is not an index: {MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8
        raise IndexLoadError(f"cannot read {path}: corrupted manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexLoadError(f"{path} is not an ngram-trie-rag index manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexLoadError(
            f"unsupported index format version {version!r} in {folder} (this version reads "
            f"{FORMAT_VERSION}); rebuild the index"
        )
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise IndexLoadError(f"{path} lacks {', '.join(missing)}: corrupted manifest")
    return manifest


def _read_checked(folder: Path, name: str, manifest: dict[str, Any]) -> bytes:
    """File bytes, verified against the manifest's sha256 before anything parses them."""
    entry = manifest["files"].get(name) if isinstance(manifest["files"], dict) else None
    if not isinstance(entry, dict) or "sha256" not in entry:
        raise IndexLoadError(f"{folder / MANIFEST} has no checksum for {name}: corrupted")
    path = folder / name
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index file missing: {path}; rebuild the index") from exc
    except OSError as exc:
        raise IndexLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if sha256_bytes(data) != entry["sha256"]:
        raise IndexLoadError(
            f"checksum mismatch for {path} ({len(data)} bytes, expected "
            f"{entry.get('bytes', '?')}): the file is corrupted or truncated; rebuild the index"
        )
    return data


def read_index_dir(path: str | os.PathLike) -> StoredIndex:
    """Validate and load a saved index folder; every failure is an ``IndexLoadError``."""
    import faiss

    folder = Path(path)
    manifest = _read_manifest(folder)
    index_bytes = _read_checked(folder, INDEX_FILE, manifest)
    passages_bytes = _read_checked(folder, PASSAGES_FILE, manifest)
    try:
        index = faiss.deserialize_index(np.frombuffer(index_bytes, dtype=np.uint8))
    except RuntimeError as exc:
        raise IndexLoadError(f"FAISS cannot read {folder / INDEX_FILE}: {exc}") from exc
    try:
        lines = passages_bytes.decode("utf-8").splitlines()
        passages = [Passage.from_dict(row)
                    for _, row in jsonl_rows(lines, folder / PASSAGES_FILE)]
    except JsonlError as exc:
        raise IndexLoadError(f"cannot parse {exc}") from exc
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise IndexLoadError(f"cannot parse {folder / PASSAGES_FILE}: {exc}") from exc
    count, dim = manifest["count"], manifest["dim"]
    if index.ntotal != count or len(passages) != count or index.d != dim:
        raise IndexLoadError(
            f"index {folder} is inconsistent: manifest says {count} vectors of dim {dim}, "
            f"found {index.ntotal} vectors of dim {index.d} and {len(passages)} passages"
        )
    _check_recipe(folder, manifest, index)
    return StoredIndex(index=index, passages=passages, manifest=manifest)


def _check_recipe(folder: Path, manifest: dict[str, Any], index: Any) -> None:
    """The manifest's ``factory`` and ``nprobe`` are applied to the loaded index, so they
    must describe it: a string whose IVF list count is the index's own, and nprobe a
    positive int (IVF only) or null."""
    import faiss

    factory, nprobe = manifest["factory"], manifest["nprobe"]
    if factory is not None and not isinstance(factory, str):
        raise IndexLoadError(f"{folder / MANIFEST}: factory {factory!r} is not a string")
    expected = factory_nlist(factory or "")
    ivf = faiss.try_extract_index_ivf(index)
    nlist = None if ivf is None else int(ivf.nlist)
    # An empty index is stored as a Flat placeholder and re-created by the first add.
    if index.ntotal and expected != nlist:
        raise IndexLoadError(
            f"index {folder} is inconsistent: manifest factory {factory!r} does not describe "
            f"the stored index ({'IVF' + str(nlist) if nlist else 'not IVF'}); rebuild the index"
        )
    bad_nprobe = nprobe is not None and (
        isinstance(nprobe, bool) or not isinstance(nprobe, int) or nprobe < 1 or expected is None
    )
    if bad_nprobe:
        raise IndexLoadError(
            f"{folder / MANIFEST}: nprobe {nprobe!r} does not fit the index (a positive int "
            "for IVF indexes, null otherwise); rebuild the index"
        )

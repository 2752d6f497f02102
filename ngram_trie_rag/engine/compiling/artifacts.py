"""What compiling produced, stored once per machine and model shape, for the next process.

Compiling the static engine's step shapes costs minutes (Inductor's code generation and
C++ or Triton builds: 709 s for seven shapes of the default model on two cores, 531 s for
the six of ``engine="auto"``). Torch can hand out what its caches gained in a process as
one portable blob (:func:`torch.compiler.save_cache_artifacts`: Inductor's generated
graphs, with their Triton kernels on a GPU, and AOTAutograd's entries) and put it back
into another process's caches (:func:`torch.compiler.load_cache_artifacts`). On a CPU the
blob does not carry the C++ kernels' builds: those stay in Inductor's own cache folder
(``TORCHINDUCTOR_CACHE_DIR``, a folder under the system's temporary directory by
default), so a process on a machine whose folder still holds them only traces (126 s for
the seven shapes on two cores), and one whose folder was emptied builds the C++ again
(minutes). The blob is
stored here, under ``<cache>/compiled/<key>/`` (``$NGRAM_TRIE_RAG_CACHE`` overrides the
cache folder), with the compiled steps' measured costs and the linear layout the graphs
bake in beside it (``meta.json``), so the next process neither measures the layout again
nor drafts without the costs.

The key is what a compiled graph depends on: the architecture and its sizes, dtype,
device, the host (machine, CPU, cores, torch, transformers, GPUs and driver), the cache
size and step shapes, and how the step is compiled. Weights are not in the key: the
graphs take them as inputs. Torch checks each graph's own key again when it looks one up,
so a stale blob costs a compile, never a changed answer. A blob whose checksum does not
match, or that torch refuses, is deleted and compiled again. The store keeps at most
``$NGRAM_TRIE_RAG_COMPILED_CAP_MB`` (default 2048) MB: the entries used longest ago go
first. ``ngram-trie-rag calibrate --clear-compiled`` (or deleting the folder) clears it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...util.cache_paths import cache_dir
from ..costs.curve_cache import host

log = logging.getLogger(__name__)
FORMAT = 1
CAP_ENV = "NGRAM_TRIE_RAG_COMPILED_CAP_MB"
DEFAULT_CAP_MB = 2048


@dataclass(frozen=True)
class Stored:
    """What an entry holds besides the blob: the compiled steps' costs (padded node
    count -> seconds) and the step sizes (rows) whose linear layers run transposed."""

    costs: dict[int, float]
    transposed_rows: frozenset[int]


def quantization_of(model: torch.nn.Module) -> str | None:
    from ..quant import quantization_of as of

    return of(model)


def store_dir() -> Path:
    """``<cache>/compiled``: one folder per key."""
    return cache_dir() / "compiled"


def artifact_key(model: torch.nn.Module, capacity: int, step_sizes: Sequence[int],
                 mode: str) -> str:
    """A short hash of everything a compiled step depends on besides the weights and
    the layout (stored in the entry: the next process takes it as stored)."""
    cfg = model.config
    what = [FORMAT, type(model).__name__, cfg.to_json_string(use_diff=False),
            str(model.dtype), str(model.device), host(), capacity, list(step_sizes), mode,
            quantization_of(model)]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def exists(key: str, folder: Path | None = None) -> bool:
    """Whether an entry is stored under ``key`` (this machine compiled it before)."""
    return ((folder or store_dir()) / key / "meta.json").is_file()


def load(key: str, folder: Path | None = None) -> Stored | None:
    """Put the stored blob of ``key`` into this process's compile caches; what the entry
    says besides, or None when nothing usable is stored (a damaged entry is deleted)."""
    entry = (folder or store_dir()) / key
    blob_path, meta_path = entry / "artifacts.bin", entry / "meta.json"
    if not blob_path.is_file() or not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        blob = blob_path.read_bytes()
        if meta.get("format") != FORMAT or hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
            raise ValueError("checksum or format mismatch")
        torch.compiler.load_cache_artifacts(blob)
    except Exception as exc:  # noqa: BLE001 - any damage: drop it, compile again
        log.warning("ngram-trie-rag: the stored compiled steps in %s are unusable (%s); "
                    "compiling again", entry, exc)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    os.utime(meta_path)  # used now: the last to be evicted
    return Stored({int(q): float(s) for q, s in meta.get("costs", {}).items()},
                  frozenset(int(q) for q in meta.get("transposed_rows", [])))


def save(key: str, costs: Mapping[int, float], transposed_rows: Sequence[int],
         folder: Path | None = None) -> Path | None:
    """Store what this process's compile caches hold (every graph compiled so far), the
    compiled steps' ``costs`` and layout under ``key``; then trim the store to its cap.
    None when torch has nothing to give or the folder cannot be written."""
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        return None
    blob = artifacts[0]
    root = folder or store_dir()
    entry = root / key
    meta = {"format": FORMAT, "sha256": hashlib.sha256(blob).hexdigest(),
            "created": time.time(), "torch": torch.__version__, "bytes": len(blob),
            "costs": {str(q): s for q, s in sorted(costs.items())},
            "transposed_rows": sorted(transposed_rows)}
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        (staging / "artifacts.bin").write_bytes(blob)
        (staging / "meta.json").write_text(json.dumps(meta, indent=1))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)  # whole or not at all: a reader never sees half
    except OSError as exc:
        log.warning("ngram-trie-rag: could not store the compiled steps in %s (%s)", root, exc)
        return None
    trim(root)
    return entry


def trim(folder: Path | None = None, cap_mb: float | None = None) -> list[Path]:
    """Delete the entries used longest ago until the store holds at most ``cap_mb`` MB
    (``$NGRAM_TRIE_RAG_COMPILED_CAP_MB``, else 2048). Returns the deleted folders."""
    root = folder or store_dir()
    if cap_mb is None:
        cap_mb = float(os.environ.get(CAP_ENV) or DEFAULT_CAP_MB)
    entries = []
    for meta in root.glob("*/meta.json"):
        size = sum(f.stat().st_size for f in meta.parent.iterdir() if f.is_file())
        entries.append((meta.stat().st_mtime, size, meta.parent))
    entries.sort()  # oldest use first
    total = sum(size for _, size, _ in entries)
    deleted = []
    for _, size, entry in entries:
        if total <= cap_mb * 2**20:
            break
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
        deleted.append(entry)
    return deleted


def clear(folder: Path | None = None) -> int:
    """Delete every stored entry; the number deleted."""
    root = folder or store_dir()
    entries = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    for entry in entries:
        shutil.rmtree(entry, ignore_errors=True)
    return len(entries)

"""Latency curves kept on disk, so that a new process need not re-measure one.

Measuring a curve (:func:`ngram_trie_rag.latency.latency_curve`) costs fifteen to
twenty-five seconds for the default model on two cores: more than a whole answer, paid
by every ``ngram-trie-rag ask``, notebook kernel and server start. A stored curve is
only a candidate: the generator re-times a plain step and a draft
(:func:`ngram_trie_rag.latency.curve_holds`, about a second) and measures afresh when
they moved, so a curve taken on a busy machine is replaced by the next quiet process.

One JSON file per (model, dtype, device, threads, engine) and host (machine, CPU,
core count, torch build), under ``<cache>/latency/`` (``$NGRAM_TRIE_RAG_CACHE``
overrides the cache folder). Deleting the folder forces a fresh measurement. A file
that cannot be read, names another key or is older than ``MAX_AGE_S`` is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from .latency import LatencyCurve

FORMAT = 1
MAX_AGE_S = 7 * 24 * 3600  # kernels, drivers and libraries change; re-measure weekly
LAYOUTS = ("stock", "transposed", "prepacked")


def host() -> list:
    """What the timings depend on besides the model: machine, CPU, cores, torch build."""
    return [platform.machine(), platform.processor() or _cpu_model(), os.cpu_count(),
            torch.__version__, torch.backends.mkldnn.is_available()]


def path_for(key: tuple, folder: Path | None = None) -> Path:
    """The file of ``key`` (the generator's curve key) on this host."""
    if folder is None:
        from .loading import cache_dir

        folder = cache_dir() / "latency"
    digest = hashlib.sha256(json.dumps([FORMAT, list(key), host()]).encode()).hexdigest()
    return folder / f"{digest[:20]}.json"


def load(key: tuple, folder: Path | None = None) -> LatencyCurve | None:
    """The stored curve of ``key`` on this host, or None (absent, unreadable, another
    key, too old)."""
    path = path_for(key, folder)
    try:
        doc = json.loads(path.read_text())
        if (doc["format"] != FORMAT or doc["key"] != list(key) or doc["host"] != host()
                or not 0 <= time.time() - float(doc["measured_at"]) <= MAX_AGE_S):
            return None
        seconds = {int(q): float(s) for q, s in doc["seconds"].items()}
        layouts = {int(q): lay for q, lay in doc["layouts"].items()}
        if (not seconds or min(seconds.values()) <= 0
                or any(lay not in LAYOUTS for lay in layouts.values())
                or not isinstance(doc["pack_single"], bool)):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return LatencyCurve(seconds, layouts, doc["pack_single"])


def save(key: tuple, curve: LatencyCurve, folder: Path | None = None) -> Path | None:
    """Write ``curve`` for ``key`` atomically (concurrent processes may race; the last
    complete file wins). Returns the path, or None when the cache is not writable."""
    path = path_for(key, folder)
    doc = {"format": FORMAT, "key": list(key), "host": host(), "measured_at": time.time(),
           "seconds": curve.seconds, "layouts": curve.layouts,
           "pack_single": curve.pack_single}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return None
    return path


def _cpu_model() -> str:
    """The CPU's model name (``platform.processor()`` is empty on most Linux systems)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""

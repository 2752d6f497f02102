"""The one cache of latency curves: in the process, then on disk; measured when neither holds.

Measuring a curve (:func:`ngram_trie_rag.engine.latency.latency_curve`) costs fifteen to
twenty-five seconds for the default model on two cores: more than a whole answer, paid
by every ``ngram-trie-rag ask``, notebook kernel and server start. So :func:`curve_for`,
the only place that decides when to measure, looks in two layers of one cache:

1. this process: one curve per :func:`curve_key` (every load of the same model shares it);
2. disk: one JSON file per key and host (machine, CPU, core count, torch build) under
   ``<cache>/latency/`` (``$NGRAM_TRIE_RAG_CACHE`` overrides the cache folder). A stored
   curve is only a candidate: a plain step and a draft are re-timed
   (:func:`~ngram_trie_rag.engine.latency.curve_holds`, about a second) and the curve is
   measured afresh when they moved, so one taken on a busy machine is replaced by the
   next quiet process. A file that cannot be read, names another key or is older than
   ``MAX_AGE_S`` is ignored; deleting the folder forces a fresh measurement.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import torch

from .attention_windows import AttentionWindows
from .latency import LatencyCurve, curve_holds, latency_curve
from .llama_step import LlamaStep

FORMAT = 1
MAX_AGE_S = 7 * 24 * 3600  # kernels, drivers and libraries change; re-measure weekly
LAYOUTS = ("stock", "transposed", "prepacked")
_CURVES: dict[tuple, LatencyCurve] = {}  # the process layer, by curve_key
_GUARD = threading.Lock()


def curve_key(model: torch.nn.Module, step: LlamaStep | None) -> tuple:
    """What a curve depends on in the process: the architecture and size, dtype, device,
    threads, and whether forwards run the Llama step."""
    cfg = model.config
    return (type(model).__name__, cfg.model_type, model.num_parameters(), str(model.dtype),
            str(model.device), torch.get_num_threads(), cfg.num_hidden_layers,
            cfg.hidden_size, step is not None)


def curve_for(model: torch.nn.Module, *, step: LlamaStep | None, packed_gqa: bool,
              windows: AttentionWindows | None, lock: threading.Lock | None = None
              ) -> LatencyCurve:
    """The model's curve: from this process, else from disk if it still holds, else
    measured and stored. ``lock``: the model's generation lock, taken while timing so
    that no generation shares the cores (for at most ten seconds: a thread that holds
    it itself, an unfinished stream of its own, must not deadlock)."""
    key = curve_key(model, step)
    with _GUARD:
        if key in _CURVES:
            return _CURVES[key]
    held = lock.acquire(timeout=10) if lock is not None else False
    try:
        with _GUARD:
            known = _CURVES.get(key)
        curve = known or stored_or_measured(model, key, step=step, packed_gqa=packed_gqa,
                                            windows=windows)
        with _GUARD:
            return _CURVES.setdefault(key, curve)
    finally:
        if held:
            lock.release()


def stored_or_measured(model: torch.nn.Module, key: tuple, *, step: LlamaStep | None,
                       packed_gqa: bool, windows: AttentionWindows | None,
                       folder: Path | None = None) -> LatencyCurve:
    """The stored curve of ``key`` if it still holds on this machine now, else a fresh
    measurement, stored for the next process."""
    setting = {"packed_gqa": packed_gqa, "windows": windows, "step": step}
    stored = load(key, folder)
    if stored is not None and curve_holds(model, stored, **setting):
        return stored
    curve = latency_curve(model, **setting)
    save(key, curve, folder)
    return curve


def host() -> list:
    """What the timings depend on besides the model: machine, CPU, cores, torch build."""
    return [platform.machine(), platform.processor() or _cpu_model(), os.cpu_count(),
            torch.__version__, torch.backends.mkldnn.is_available()]


def path_for(key: tuple, folder: Path | None = None) -> Path:
    """The file of ``key`` (a :func:`curve_key`) on this host."""
    if folder is None:
        from ..loading import cache_dir

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

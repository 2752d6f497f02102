"""The one cache of latency curves: in the process, then on disk, else a quick probe.

A full measurement (:func:`ngram_trie_rag.engine.costs.latency.latency_curve`) costs fifteen to
twenty-five seconds for the default model on two cores: more than a whole answer. No
generation waits for one. :func:`curve_for` gives a process its curve from

1. this process: one curve per :func:`curve_key` (every load of the same model shares it);
2. disk: one JSON file per key and host (machine, CPU, core count, torch build) under
   ``<cache>/latency/`` (``$NGRAM_TRIE_RAG_CACHE`` overrides the cache folder), used as
   stored. A file that cannot be read, names another key or is older than ``MAX_AGE_S``
   is ignored;
3. else a probe of a few forwards (:func:`~ngram_trie_rag.engine.costs.latency.default_curve`,
   a second or two), stored for the next process.

Real steps then refine the seconds (the draft budget's timings, folded in by
:func:`refine` when a generation ends) and the refined curve is stored, at most every
``SAVE_INTERVAL_S``, so the next process starts from what this one learned. Only
:func:`calibrate` (``ngram-trie-rag calibrate``) measures every size and picks the
linear layouts and packed attention per size. Each file says where its seconds came
from (``source``): a default never replaces a stored curve, and refined seconds update
a measured curve's seconds and keep its layouts.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from ..cpu import rowwise_linear
from ..cpu.llama_step import LlamaStep
from ..models.attention_windows import AttentionWindows
from .latency import SOURCES, LatencyCurve, default_curve, latency_curve

FORMAT = 2  # 2: curves may name the rowwise layout (a probe chooses it)
MAX_AGE_S = 7 * 24 * 3600  # kernels, drivers and libraries change; a week-old file is dropped
SAVE_INTERVAL_S = 30.0  # refined curves are written at most this often per key and process
NOTICE_AFTER_S = 1.0  # a wait longer than this is announced on stderr
LAYOUTS = ("stock", "transposed", "prepacked", "rowwise")
_CURVES: dict[tuple, LatencyCurve] = {}  # the process layer, by curve_key
_SAVED_AT: dict[tuple, float] = {}  # when this process last stored a refined curve, by key
_GUARD = threading.Lock()


def curve_key(model: torch.nn.Module, step: LlamaStep | None) -> tuple:
    """What a curve depends on in the process: the architecture and size, dtype, device,
    threads, whether forwards run the Llama step, and how the weights are quantized (w8a8
    with or without its VNNI kernel, int8 / int4 with bf16 or fp32 activations, row-wise
    or fp64 attention, fused decoder layers or modules: each costs its own per row), and
    for a float model whether its step can run the rowwise layout (a curve that names it
    is never given to a process whose kernels did not build)."""
    from ..quant import quantization_of, vnni
    from ..quant.apply import SUMMARY

    cfg = model.config
    quantization = quantization_of(model)
    if quantization == "w8a8" and model.device.type == "cpu" and vnni.kernel() is not None:
        quantization = "w8a8+vnni"
    summary = getattr(model, SUMMARY, {})
    if quantization in ("int8", "int4") and summary.get("activations") == str(torch.float32):
        quantization += "+w8a32" if quantization == "int8" else "+w4a32"
    if summary.get("attention") == "rowwise":
        quantization += "+rowwise"
    if summary.get("fused_layers"):
        quantization += "+fused"
    if quantization is None and step is not None and rowwise_linear.applies(model):
        quantization = "rowwise-layout"  # a float model whose step can run its kernels
    return (type(model).__name__, cfg.model_type, model.num_parameters(), str(model.dtype),
            str(model.device), torch.get_num_threads(), cfg.num_hidden_layers,
            cfg.hidden_size, step is not None, quantization)


def curve_for(model: torch.nn.Module, *, step: LlamaStep | None, packed_gqa: bool,
              windows: AttentionWindows | None, lock: threading.Lock | None = None
              ) -> LatencyCurve:
    """The model's curve: from this process, else as stored on disk, else a quick probe
    (stored for the next process). Nothing here re-measures a curve it has.

    ``lock``: the model's generation lock, taken while probing so that no generation
    shares the cores (for at most ten seconds: a thread that holds it itself, an
    unfinished stream of its own, must not deadlock)."""
    key = curve_key(model, step)
    with _GUARD:
        if key in _CURVES:
            return _CURVES[key]
    curve = load(key)
    if curve is None:
        curve = _probed(model, key, step=step, packed_gqa=packed_gqa, windows=windows,
                        lock=lock)
    with _GUARD:
        return _CURVES.setdefault(key, curve)


def _probed(model: torch.nn.Module, key: tuple, *, step: LlamaStep | None,
            packed_gqa: bool, windows: AttentionWindows | None,
            lock: threading.Lock | None) -> LatencyCurve:
    """The default curve, timed under the model's lock (unless another thread got the
    process a curve meanwhile) and stored unless another process stored one."""
    held = lock.acquire(timeout=10) if lock is not None else False
    try:
        with _GUARD:
            known = _CURVES.get(key)
        if known is not None:
            return known
        with notice_after(NOTICE_AFTER_S, "timing the model (first run on this machine; "
                          "`ngram-trie-rag calibrate` measures it fully) ..."):
            curve = default_curve(model, packed_gqa=packed_gqa, windows=windows, step=step)
    finally:
        if held:
            lock.release()
    store(key, curve)
    return curve


def refine(model: torch.nn.Module, step: LlamaStep | None, seconds: Mapping[int, float],
           folder: Path | None = None) -> LatencyCurve | None:
    """Fold ``seconds`` (forward size -> seconds, as real steps timed them) into the
    process's curve of the model, layouts kept, and store it when this process has not
    stored one for ``SAVE_INTERVAL_S``. Returns the updated curve, or None when the
    process holds none (nothing to refine)."""
    key = curve_key(model, step)
    now = time.monotonic()
    with _GUARD:
        current = _CURVES.get(key)
        if current is None or not seconds:
            return current
        updated = _CURVES[key] = _with_seconds(current, seconds)
        due = now - _SAVED_AT.get(key, float("-inf")) >= SAVE_INTERVAL_S
        if due:
            _SAVED_AT[key] = now
    if due:
        stored = load(key, folder)
        base = stored if stored is not None and stored.source != "default" else updated
        store(key, _with_seconds(base, seconds), folder)
    return updated


def calibrate(model: torch.nn.Module, *, step: LlamaStep | None, packed_gqa: bool,
              windows: AttentionWindows | None, lock: threading.Lock | None = None,
              folder: Path | None = None) -> tuple[LatencyCurve, Path | None]:
    """Measure the model's full curve now (every size, every variant), store it as
    measured and make it this process's. Returns the curve and its file (None when
    the cache is not writable)."""
    key = curve_key(model, step)
    held = lock.acquire(timeout=10) if lock is not None else False
    try:
        curve = latency_curve(model, packed_gqa=packed_gqa, windows=windows, step=step)
    finally:
        if held:
            lock.release()
    path = save(key, curve, folder)
    with _GUARD:
        _CURVES[key] = curve
    return curve, path


def stored(model: torch.nn.Module, step: LlamaStep | None,
           folder: Path | None = None) -> tuple[LatencyCurve | None, Path]:
    """The curve stored for the model on this host (None if none holds) and its file."""
    key = curve_key(model, step)
    return load(key, folder), path_for(key, folder)


def store(key: tuple, curve: LatencyCurve, folder: Path | None = None) -> Path | None:
    """:func:`save`, except that a default curve never replaces a stored one: one
    measured (or refined) by another process meanwhile is worth more."""
    if curve.source == "default" and load(key, folder) is not None:
        return None
    return save(key, curve, folder)


def _with_seconds(curve: LatencyCurve, seconds: Mapping[int, float]) -> LatencyCurve:
    """``curve`` with the seconds of its own sizes among ``seconds`` replaced, marked
    refined; its layouts and packing stay."""
    new = {q: float(s) for q, s in seconds.items() if q in curve.seconds and s > 0}
    return replace(curve, seconds={**curve.seconds, **new}, source="refined")


@contextmanager
def notice_after(seconds: float, message: str) -> Iterator[None]:
    """Say on stderr what a wait is for once it has lasted ``seconds``: a user staring
    at a silent first answer learns why, a quick run prints nothing."""
    timer = threading.Timer(seconds, lambda: print(f"ngram-trie-rag: {message}",
                                                   file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def host() -> list:
    """What the timings depend on besides the model: machine, CPU, cores, the torch and
    transformers builds, and each visible GPU's name with the CUDA build and driver
    (a curve timed on one GPU says nothing of another, or of a new driver)."""
    import transformers

    return [platform.machine(), platform.processor() or _cpu_model(), os.cpu_count(),
            torch.__version__, torch.backends.mkldnn.is_available(),
            transformers.__version__, *_gpus()]


def _gpus() -> list:
    """Name and driver of each visible CUDA device, and torch's CUDA version ([] without)."""
    if not torch.cuda.is_available():
        return []
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [*names, torch.version.cuda, _nvidia_driver()]


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version, as the kernel module reports it."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def path_for(key: tuple, folder: Path | None = None) -> Path:
    """The file of ``key`` (a :func:`curve_key`) on this host."""
    if folder is None:
        from ...util.cache_paths import cache_dir

        folder = cache_dir() / "latency"
    digest = hashlib.sha256(json.dumps([FORMAT, list(key), host()]).encode()).hexdigest()
    return folder / f"{digest[:20]}.json"


def load(key: tuple, folder: Path | None = None) -> LatencyCurve | None:
    """The stored curve of ``key`` on this host, or None (absent, unreadable, another
    key, too old). A file without a ``source`` was written by a full measurement."""
    path = path_for(key, folder)
    try:
        doc = json.loads(path.read_text())
        if (doc["format"] != FORMAT or doc["key"] != list(key) or doc["host"] != host()
                or not 0 <= time.time() - float(doc["measured_at"]) <= MAX_AGE_S):
            return None
        seconds = {int(q): float(s) for q, s in doc["seconds"].items()}
        layouts = {int(q): lay for q, lay in doc["layouts"].items()}
        source = doc.get("source", "measured")  # absent: written by a full measurement
        chosen = doc.get("variants_chosen", source == "measured")
        if (not seconds or min(seconds.values()) <= 0
                or any(lay not in LAYOUTS for lay in layouts.values())
                or not isinstance(doc["pack_single"], bool) or source not in SOURCES
                or not isinstance(chosen, bool)):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return LatencyCurve(seconds, layouts, doc["pack_single"], source, chosen)


def save(key: tuple, curve: LatencyCurve, folder: Path | None = None) -> Path | None:
    """Write ``curve`` for ``key`` atomically (concurrent processes may race; the last
    complete file wins). Returns the path, or None when the cache is not writable."""
    path = path_for(key, folder)
    doc = {"format": FORMAT, "key": list(key), "host": host(), "measured_at": time.time(),
           "seconds": curve.seconds, "layouts": curve.layouts,
           "pack_single": curve.pack_single, "source": curve.source,
           "variants_chosen": curve.variants_chosen}
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


class ModelCurve:
    """The latency curve an engine's draft budgets read, held for one model's forwards
    as that engine runs them (``step``: the direct Llama step, else the modules).

    Both engines hold one (composition, not a shared base class). ``pinned``: used as
    given, never looked up, probed or refined (tests of each variant). ``refines``:
    whether real steps' timings are folded in; an engine whose steps are not the ones
    the stored curve times (padded, over a preallocated cache) keeps it as looked up,
    and each generator's draft budget still learns from the steps it runs."""

    def __init__(self, model: torch.nn.Module, lock: threading.Lock, *,
                 step: LlamaStep | None, packed_gqa: bool, windows: AttentionWindows,
                 pinned: LatencyCurve | None = None, refines: bool = True) -> None:
        self.model, self.lock, self.step = model, lock, step
        self.packed_gqa, self.windows = packed_gqa, windows
        self._curve = pinned
        self._pinned = pinned is not None
        self._refines = refines and not self._pinned

    @property
    def curve(self) -> LatencyCurve:
        """See :meth:`load`."""
        return self.load()

    @property
    def pinned(self) -> bool:
        """Whether the curve is used as given (never looked up, probed or refined)."""
        return self._pinned

    def adopt(self, curve: LatencyCurve) -> None:
        """Use ``curve`` (measured elsewhere, e.g. by the background measurement) from the
        next forward on, in this process's layer too; a pinned curve stays as given. The
        caller holds the model's lock, so no request changes variants mid-way."""
        if self._pinned:
            return
        with _GUARD:
            _CURVES[curve_key(self.model, self.step)] = curve
        self._curve = curve

    def measure_in_background(self) -> None:
        """Choose the forward variants in the idle time between answers, where no full
        measurement chose them (see :mod:`.background_measure`)."""
        from . import background_measure

        background_measure.start(self)

    def load(self) -> LatencyCurve:
        """This process's curve, else the stored one, else a quick probe (which takes
        the model's lock); never a full measurement."""
        if self._curve is None:
            self._curve = curve_for(self.model, step=self.step, packed_gqa=self.packed_gqa,
                                    windows=self.windows, lock=self.lock)
        return self._curve

    def stored(self) -> tuple[LatencyCurve | None, Path]:
        """The curve stored on this host for these forwards (None if none), its file."""
        return stored(self.model, self.step)

    def calibrate(self) -> Path | None:
        """Measure the full curve now (every size, every variant: the fastest variants
        are only chosen from a measured curve), store it and use it from here on; a
        pinned curve stays as given. Returns the curve's file (None: not stored)."""
        curve, path = calibrate(self.model, step=self.step, packed_gqa=self.packed_gqa,
                                windows=self.windows, lock=self.lock)
        if not self._pinned:
            self._curve = curve
        return path

    def refine(self, seconds: Mapping[int, float]) -> None:
        """Fold real steps' timings (forward size -> seconds) into the curve, for the
        budgets of later generations and, stored, of later processes."""
        if not self._refines or self._curve is None or not seconds:
            return
        refined = refine(self.model, self.step, seconds)
        if refined is not None:
            self._curve = refined


class CurveVerbs:
    """The cost-curve verbs of :class:`~ngram_trie_rag.engine.protocol.Engine`, for an
    engine that holds its curve in ``self.costs`` (a :class:`ModelCurve`)."""

    costs: ModelCurve

    @property
    def curve(self) -> LatencyCurve:
        """The latency curve its draft budgets read (see :meth:`ModelCurve.load`)."""
        return self.costs.curve

    def load_curve(self) -> None:
        """Look the curve up, or probe it, before a request holds the lock."""
        self.costs.load()

    def stored_curve(self) -> tuple[LatencyCurve | None, Path]:
        """The curve stored for these forwards on this host (None if none), its file."""
        return self.costs.stored()

    def calibrate(self) -> Path | None:
        """See :meth:`ModelCurve.calibrate`."""
        return self.costs.calibrate()

    def refine_curve(self, seconds: Mapping[int, float]) -> None:
        """Take real steps' timings (forward size -> seconds, e.g. a draft budget's
        :meth:`~ngram_trie_rag.drafting.budget.DraftBudget.refined`) into the curve,
        where it refines (see :class:`ModelCurve`)."""
        self.costs.refine(seconds)

"""Measure the forward variants in the background, so that nobody needs ``calibrate``.

Only a full measurement (:func:`~ngram_trie_rag.engine.costs.latency.latency_curve`)
chooses the linear layouts and the plain step's attention per forward size; a process
without a stored one runs the stock variants, whose steps of a few nodes cost about 1.5x
more on two cores. Measured on the default model, 8 Spec-Bench RAG prompts: the trie
decoded at 1.95x ``generate`` on the probed curve and 2.61x after ``calibrate``.

So once a process on a CPU has finished its first answer (it is one that answers more:
a wrapper in an app, the resident ``ask`` worker, ``chat``), and its curve has no
chosen variants, :func:`start` measures them in **another process**:

- a process, not a thread: a second thread that runs forwards keeps its own OpenMP
  team, and with more OpenMP threads than cores libgomp stops spinning between parallel
  regions, which slowed every step of the answers beside it and inflated the timings
  it took (see :mod:`~ngram_trie_rag.engine.compiling.background_compile`); a process
  has its own runtime and its own cores' share;
- it loads the same weights from the same folder (a hub id from its cached snapshot),
  in the same dtype, attention implementation and thread count, so its curve has the
  same key, and stores it as ``calibrate`` does (nice 19);
- it is **paused** (SIGSTOP) whenever the model's lock is held, so it never competes
  with an answer of this process, and resumed after ``IDLE_S`` without one: it measures
  in the idle time between answers. A forward timed across a pause is timed again (the
  process counts its resumptions: a pause in a timing once made a 100 ms forward
  measure 15 s and chose a layout by it);
- when it has stored the curve, this process takes it between two answers (under the
  model's lock: a request never changes variants mid-way), and so does every later
  process on this machine, from disk.

Nothing runs where it cannot pay or cannot be done safely: a pinned curve, a curve whose
variants were chosen, a model not on a CPU, weights that would not fit in memory twice
(over half of what is available), a model with no folder another process can load
(a ``.gguf`` file, an object built in memory), ``NGRAM_TRIE_RAG_MEASURE=off`` (a test
suite, a benchmark timing other code), or a process that said :func:`disable` (a
one-shot command). Plain ``model.generate`` calls do not take the model's lock, so a
program timing them beside a measurement should call :func:`disable` first (``bench``
and ``demo`` do).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

import torch

from ..quant import SCHEMES, model_bytes, quantization_of

if TYPE_CHECKING:
    from .curve_cache import ModelCurve

ENV = "NGRAM_TRIE_RAG_MEASURE"  # "off": never measure in the background; unset/"on": do
IDLE_S = 0.2  # the lock free this long resumes a paused measurement
POLL_S = 0.02  # how often the lock is looked at
MEMORY_SHARE = 0.5  # the weights may take at most this share of the available memory
log = logging.getLogger(__name__)

_DISABLED = False
_EXITING = threading.Event()  # set at interpreter exit: the measurements are ended
_STARTED: set[tuple] = set()  # curve keys measured (or being measured) by this process
_RUNNING: list[subprocess.Popen] = []
_GUARD = threading.Lock()


def check_setting() -> bool:
    """Whether background measurement is on in the environment; ValueError for a value
    other than ``on``, ``off`` or empty, so a typo is not silently ignored."""
    value = os.environ.get(ENV, "")
    if value not in ("", "on", "off"):
        raise ValueError(f"{ENV}={value!r}: set it to 'off' (never measure the forward "
                         "variants in the background), 'on', or leave it unset")
    return value != "off"


def disable() -> None:
    """No background measurement in this process from now on (a one-shot command, a
    benchmark: its timed runs must not share the cores)."""
    global _DISABLED
    _DISABLED = True


def start(costs: ModelCurve) -> threading.Thread | None:
    """Measure ``costs``' model's variants in another process and adopt the result
    (see the module's notes). Returns the thread that watches it, or None where nothing
    was started (already measured or measuring, or it cannot run here)."""
    from .curve_cache import curve_key

    if _DISABLED or not check_setting() or costs.pinned or costs.curve.variants_chosen:
        return None
    key = curve_key(costs.model, costs.step)
    with _GUARD:
        if key in _STARTED:
            return None
        _STARTED.add(key)
    why = why_not(costs.model)
    if why is not None:
        log.debug("forward variants not measured in the background: %s", why)
        return None
    folder = source_folder(costs.model)
    if folder is None:
        log.debug("forward variants not measured in the background: no folder holds "
                  "this model's weights")
        return None
    argv = [sys.executable, "-m", __name__, json.dumps(child_settings(costs.model, folder))]
    errors = tempfile.TemporaryFile()  # a pipe nobody reads until the end could fill up
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=errors, preexec_fn=_lowest_priority)
    with _GUARD:
        _RUNNING.append(proc)
    log.info("measuring the forward variants in the background (process %d, paused "
             "while answering)", proc.pid)
    watcher = threading.Thread(target=_watch, args=(proc, errors, costs, key), daemon=True,
                               name="ngram-trie-rag-measure")
    watcher.start()
    return watcher


def running() -> list[int]:
    """The process ids of the measurements running now."""
    with _GUARD:
        return [proc.pid for proc in _RUNNING]


def why_not(model: torch.nn.Module) -> str | None:
    """Why this model's variants cannot be measured in another process here, or None."""
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, not a CPU"
    if not hasattr(signal, "SIGSTOP"):
        return "no SIGSTOP on this platform (a measurement could not be paused)"
    scheme = quantization_of(model)
    if scheme is not None and scheme not in SCHEMES:
        return f"its weights are quantized by {scheme} (another process would not load them alike)"
    weights = model_bytes(model)
    available = _available_memory()
    if available is not None and weights > MEMORY_SHARE * available:
        return (f"the weights ({weights / 2**30:.1f} GiB) would take over half of the "
                f"available memory ({available / 2**30:.1f} GiB) a second time")
    return None


def source_folder(model: torch.nn.Module) -> Path | None:
    """A folder another process loads the same weights from: the model's own (it holds
    ``config.json`` and weights), or its hub id's cached snapshot; None otherwise."""
    name = str(getattr(model.config, "_name_or_path", "") or "")
    if not name:
        return None
    folder = Path(name)
    if not folder.is_dir():
        from ...loading import cached_snapshot

        try:
            folder = cached_snapshot(name)
        except Exception:  # noqa: BLE001 - not a hub id at all: nothing to load
            return None
        if folder is None:
            return None
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    return folder if (folder / "config.json").is_file() and has_weights else None


def child_settings(model: torch.nn.Module, folder: Path) -> dict:
    """What the measuring process needs to load the model as this one runs it (the curve
    key: architecture and size, dtype, device, threads, the forward it takes)."""
    from ..cpu import gqa_attention
    from ..quant import attention as quant_attention

    attention = getattr(model.config, "_attn_implementation", None)
    if attention in (gqa_attention.NAME, quant_attention.NAME):
        attention = "sdpa"  # as loaded; the engine, or quantizing, installs its own again
    return {"folder": str(folder), "dtype": str(model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "attn_implementation": attention,
            "quantization": quantization_of(model)}


def _watch(proc: subprocess.Popen, errors: IO[bytes], costs: ModelCurve, key: tuple
           ) -> None:
    """Pause the measuring process while the model's lock is held, resume it once the
    lock has been free for ``IDLE_S``; when it has stored the curve, adopt it."""
    lock, paused, idle_since = costs.lock, False, None
    while proc.poll() is None:
        if lock.locked():
            idle_since = None
            if not paused:
                paused = _signal(proc, signal.SIGSTOP)
        else:
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            if paused and now - idle_since >= IDLE_S:
                paused = not _signal(proc, signal.SIGCONT)
        time.sleep(POLL_S)
    with _GUARD:
        if proc in _RUNNING:
            _RUNNING.remove(proc)
    errors.seek(0)
    said = errors.read().decode(errors="replace").strip()
    errors.close()
    if _EXITING.is_set():  # ended by this process's exit: nothing failed, nothing to adopt
        return
    if proc.returncode != 0:
        last = said.splitlines()[-1] if said else f"exit status {proc.returncode}"
        log.warning("the background measurement of the forward variants failed: %s", last)
        return
    from .curve_cache import load

    with lock:  # between two answers: no request changes variants mid-way
        curve = load(key)
        if curve is None or not curve.variants_chosen:
            log.warning("the background measurement stored no curve for this model")
            return
        costs.adopt(curve)
    chosen = {q: lay for q, lay in sorted(curve.layouts.items())}
    log.info("forward variants measured in the background: %s", chosen or "stock")


def _signal(proc: subprocess.Popen, sig: signal.Signals) -> bool:
    """Send ``sig``; False when the process has already ended."""
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        return False
    return True


def _lowest_priority() -> None:
    """In the child before it runs: the lowest CPU priority."""
    os.nice(19)


def _available_memory() -> int | None:
    """Bytes of memory available to new work (Linux's MemAvailable), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@atexit.register
def _stop_all() -> None:
    """End the measurements still running: a process that exits takes them along (a
    stopped process ends on SIGKILL too)."""
    _EXITING.set()
    with _GUARD:
        running = list(_RUNNING)
    for proc in running:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def _measure(settings: dict) -> None:
    """The measuring process: load the model as the parent runs it, measure its full
    curve and store it (what ``ngram-trie-rag calibrate`` does)."""
    from transformers import AutoModelForCausalLM

    from ..eager import engine_for
    from ..quant import quantize_model
    from .latency import note_resumed

    signal.signal(signal.SIGCONT, note_resumed)  # a forward timed across a pause is redone
    torch.set_num_threads(int(settings["threads"]))
    kwargs = {"dtype": getattr(torch, settings["dtype"])}
    if settings.get("attn_implementation"):
        kwargs["attn_implementation"] = settings["attn_implementation"]
    model = AutoModelForCausalLM.from_pretrained(settings["folder"], **kwargs).eval()
    if settings.get("quantization"):
        quantize_model(model, settings["quantization"])
    disable()  # this process measures; it never starts another
    if engine_for(model).calibrate() is None:
        raise SystemExit("the latency cache is not writable")


if __name__ == "__main__":
    _measure(json.loads(sys.argv[1]))

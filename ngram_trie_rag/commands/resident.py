"""`ngram-trie-rag ask` through a resident worker: the model stays loaded between asks.

A fresh Python process pays seconds before it can answer: importing torch and
Transformers' model code (5-7 s on a 2-core CPU), then loading the weights. So the console
script's ``ask`` hands its command line to a worker process that keeps the model in
memory for ``--keep-alive`` seconds after its last answer (the way Ollama keeps a model
loaded), and starts one when none is running. This side imports neither torch nor
Transformers: it connects, passes its own stdout and stderr, so the worker prints
straight to the terminal (streaming, colours and exit code as if in-process), and waits
for the exit code.

A worker serves one user (its socket lives in a folder only that user can open), one
model (the key below: model, device, dtype, engine and capacity, the Python and package
it runs, and the environment that changes how models load), and one request at a time.
When the client goes away mid-answer (Ctrl-C, a killed shell), the worker exits rather
than write into a terminal nobody reads; the next ask starts a new one. A worker runs
``--engine auto`` as asked; an ``ask`` that answers in its own process runs it as
``eager`` (see :func:`in_worker`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from ..util.cache_paths import cache_dir

KEEP_ALIVE_ENV = "NGRAM_TRIE_RAG_KEEP_ALIVE"
DEFAULT_KEEP_ALIVE = 300.0  # seconds a worker waits for the next ask
# Variables that change what a model load finds or does; a worker started under other
# values would not answer the way this process would.
ENV_PREFIXES = ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "NGRAM_TRIE_RAG_", "CUDA_",
                "PYTORCH_", "OMP_", "MKL_", "XDG_CACHE_HOME", "HOME")
# Not the key: how long a worker waits, and what torch sets in its own process (a Python
# parent that imported torch passes it on to the command it runs).
ENV_IGNORED = (KEEP_ALIVE_ENV, "CUDA_MODULE_LOADING")
SOCKET_PATH_MAX = 100  # AF_UNIX paths stop at 107 bytes on Linux
START_TIMEOUT_S = 120.0  # a worker binds before it imports anything heavy
HEADER = struct.Struct("!Q")  # the request's length, then the request as JSON
# Unix sockets that carry file descriptors: Linux and macOS; elsewhere ``ask`` answers in
# its own process.
AVAILABLE = os.name == "posix" and hasattr(socket, "send_fds")
_IN_WORKER = False  # set once, by the worker process (become_worker)


class ResidentError(OSError):
    """The worker could not be started or died mid-answer (its log says why)."""


def keep_alive_seconds(text: str | None) -> float:
    """``--keep-alive``'s value, or ``$NGRAM_TRIE_RAG_KEEP_ALIVE``, or 300; 0 turns the
    worker off."""
    raw = text if text is not None else os.environ.get(KEEP_ALIVE_ENV)
    if raw is None or raw == "":
        return DEFAULT_KEEP_ALIVE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"keep-alive must be a number of seconds >= 0, got {raw!r}")
    return value


def become_worker() -> None:
    """Mark this process as a resident worker: it answers ask after ask, so an engine
    that compiles its step gets to run it (see :func:`in_worker`)."""
    global _IN_WORKER
    _IN_WORKER = True


def in_worker() -> bool:
    """Whether this process is a resident worker, rather than one that answers once."""
    return _IN_WORKER


def worker_key(model: str | None, device: str | None, dtype: str | None,
               engine: str = "auto", capacity: int | None = None,
               quantization: str | None = None) -> str:
    """What a worker must share with this process to answer exactly as it would: a
    worker holds its engine's compiled shapes and preallocated cache, so another engine
    or capacity gets a worker of its own. A capacity that does not fit the engine is a
    ValueError here, before a worker starts."""
    from ..engine.engine_names import check_capacity, check_engine

    check_capacity(capacity, check_engine(engine))
    if model is not None and Path(model).expanduser().exists():
        model = str(Path(model).expanduser().resolve())
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED)
    payload = [model, device, dtype, engine, capacity, quantization, sys.executable,
               _package_fingerprint(), env]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:20]


def _package_fingerprint() -> list:
    """The package's newest source file and its count: an edited or upgraded package
    gets a new worker, never the old code."""
    root = Path(__file__).resolve().parents[1]
    stamps = [p.stat().st_mtime_ns for p in root.rglob("*.py")]
    return [str(root), len(stamps), max(stamps)]


def runtime_dir() -> Path:
    """A folder only this user can open, for the sockets, locks and logs."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "ngram-trie-rag" if base else cache_dir() / "run"
    if len(str(folder)) > SOCKET_PATH_MAX - 30:
        folder = Path("/tmp") / f"ngram-trie-rag-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ResidentError(f"{folder} is open to other users; remove it or set "
                            f"{KEEP_ALIVE_ENV}=0")
    return folder


def ask(argv: list[str], key: str, keep_alive: float, quiet: bool = False) -> int:
    """Run ``ngram-trie-rag <argv>`` in the resident worker for ``key``; its exit code.
    Starting a worker says so on stderr (unless ``quiet``): a process that outlives the
    command should not come as a surprise."""
    folder = runtime_dir()
    paths = {kind: folder / f"{key}.{kind}" for kind in ("sock", "lock", "log")}
    request = {"argv": argv, "cwd": os.getcwd(), "keep_alive": keep_alive}
    for _ in range(3):  # a worker may be closing as we connect: start a new one
        conn = _connect(paths["sock"]) or _start(paths, keep_alive, quiet)
        try:
            return _exchange(conn, request, paths["log"])
        except _NotStarted:
            continue
        finally:
            conn.close()
    raise ResidentError(f"the resident worker did not take the request; see {paths['log']}")


class _NotStarted(Exception):
    """The worker closed the connection before it began the request."""


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return None
    return conn


def _start(paths: dict[str, Path], keep_alive: float, quiet: bool) -> socket.socket:
    """Start a worker and connect to it; two clients starting at once share one (the
    second worker finds the lock held and leaves)."""
    if not quiet:
        print(f"starting a background process that keeps the model loaded for "
              f"{keep_alive:g} s after each answer (--keep-alive 0: none) ...",
              file=sys.stderr, flush=True)
    with open(paths["log"], "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ngram_trie_rag.commands.worker", str(paths["sock"]),
             str(paths["lock"]), str(keep_alive)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        conn = _connect(paths["sock"])
        if conn is not None:
            return conn
        if proc.poll() is not None and not _locked(paths["lock"]):
            raise ResidentError(f"the resident worker exited with {proc.returncode} before "
                                f"it listened: {_tail(paths['log'])}")
        time.sleep(0.01)
    proc.kill()
    raise ResidentError(f"the resident worker did not listen within {START_TIMEOUT_S:.0f} s; "
                        f"see {paths['log']}")


def _locked(lock: Path) -> bool:
    """Whether a live worker holds ``lock``."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _exchange(conn: socket.socket, request: dict, log: Path) -> int:
    """Send the request with this process's stdout and stderr; wait for the code."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    body = json.dumps(request).encode()
    frame = HEADER.pack(len(body)) + body
    sent = socket.send_fds(conn, [frame], [1, 2])
    conn.sendall(frame[sent:])
    reader = conn.makefile("rb")
    started = reader.readline()
    if not started:
        raise _NotStarted
    reply = reader.readline()  # Ctrl-C here closes the socket: the worker stops too
    if not reply:
        raise ResidentError(f"the resident worker died mid-answer; see {log}")
    return int(json.loads(reply)["code"])


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"

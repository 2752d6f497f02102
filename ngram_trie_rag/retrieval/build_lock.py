"""One writer per index folder: builds into the same ``--out`` take turns or fail clearly.

Without it two builds into one folder both "succeed" and one result silently replaces the
other, or worse, one build's cleanup runs while the other swaps its folder in.

The lock is ``fcntl.flock`` on ``.NAME.lock`` beside the folder (not inside it: the folder
itself is renamed during a save). ``flock`` belongs to the open file, so the kernel drops it
when its process dies, however it dies: a lock file left by a killed build is never
"stale", the next build simply takes it. The holder writes its pid into the file for the
error message, and deletes the file on release while still holding the lock; a waiter that
then gets the lock on the deleted file notices (its file is no longer the one at the path)
and tries again, so two holders can never coexist.

The lock is re-entrant within a thread: ``index build`` takes it before embedding (so a
second build fails at once, not after minutes of embedding) and the save inside takes it
again. Other threads of the same process contend like other processes do. Where ``fcntl``
does not exist (Windows) saves are not serialised.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import IndexSaveError

POLL_S = 0.05
_local = threading.local()


class IndexBusyError(IndexSaveError):
    """Another build holds the folder's lock and did not finish within the wait."""


def lock_path(target: Path) -> Path:
    """``.NAME.lock`` in the folder's parent."""
    return target.parent / f".{target.name}.lock"


def _held() -> dict[str, int]:
    if not hasattr(_local, "held"):
        _local.held = {}
    return _local.held


@contextmanager
def build_lock(target: str | os.PathLike, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the lock of index folder ``target`` for the block; wait up to ``wait_s``
    seconds for another holder, then raise :class:`IndexBusyError` naming its pid.
    Spellings of one folder (relative, through a symlink) share one lock."""
    target = Path(os.path.realpath(target))
    path = lock_path(target)
    key, held = str(path), _held()
    if held.get(key):  # this thread holds it already
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, target, wait_s)
    held[key] = 1
    try:
        yield
    finally:
        del held[key]
        _release(path, fd)


def _acquire(path: Path, target: Path, wait_s: float) -> int | None:
    try:
        import fcntl
    except ImportError:  # no flock on this platform
        return None
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                raise IndexBusyError(
                    f"another build is writing the index {target}{holder}; wait for it to "
                    "finish or choose another folder"
                ) from None
            time.sleep(POLL_S)
            continue
        if _is_current(fd, path):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the holder released and deleted that file; take the new one


def _is_current(fd: int, path: Path) -> bool:
    """Whether the locked file is still the one at ``path``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _release(path: Path, fd: int | None) -> None:
    if fd is None:
        return
    try:
        path.unlink()  # still locked: nobody can take this file between unlink and close
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)

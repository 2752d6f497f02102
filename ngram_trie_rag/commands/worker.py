"""The resident worker behind the console script's ``ask`` (see ``resident``).

``python -m ngram_trie_rag.commands.worker SOCKET LOCK KEEP_ALIVE``: holds ``LOCK`` for
its lifetime (a second worker for the same key leaves at once), listens on ``SOCKET``
before importing anything heavy, then runs each request's command line as the CLI would,
printing to the client's own stdout and stderr; the models a request loads stay loaded
for the next (the process's one cache, :mod:`ngram_trie_rag.wrappers.shared`). It leaves after
``KEEP_ALIVE`` idle seconds, and at once when a client goes away mid-answer.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import socket
import sys
import threading
from pathlib import Path

from .resident import HEADER, become_worker

MAX_FDS = 2  # the client's stdout and stderr


def main(argv: list[str]) -> int:
    sock_path, lock_path, keep_alive = Path(argv[0]), Path(argv[1]), float(argv[2])
    become_worker()  # its asks keep the engine the user named ("auto" included)
    lock = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another worker serves this key
        os.close(lock)
        return 0
    try:
        return _listen(sock_path, keep_alive)
    finally:
        os.close(lock)  # after the socket is gone: no new worker finds it


def _listen(sock_path: Path, keep_alive: float) -> int:
    """Serve requests until ``keep_alive`` seconds pass without one (the lock held)."""
    sock_path.unlink(missing_ok=True)  # a dead worker's; the lock says none is alive
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(16)
    try:
        while True:
            server.settimeout(keep_alive)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return 0
            conn.settimeout(None)
            with conn:
                keep_alive = _serve(conn, keep_alive)
    finally:
        sock_path.unlink(missing_ok=True)
        server.close()


def _serve(conn: socket.socket, keep_alive: float) -> float:
    """Run one request; the keep-alive it asks for from now on."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 16, MAX_FDS)
    try:
        if len(fds) != MAX_FDS or len(message) < HEADER.size:
            return keep_alive  # a client that went away before sending
        (size,) = HEADER.unpack_from(message)
        body = message[HEADER.size:]
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return keep_alive
            body += chunk
        request = json.loads(body)
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(conn, done), daemon=True)
        watcher.start()
        code = _run(request["argv"], request["cwd"], fds)
        done.set()
        try:
            conn.sendall(json.dumps({"code": code}).encode() + b"\n")
            conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher, whatever the client does
        except OSError:  # the client left as the answer ended
            pass
        watcher.join()
        return float(request["keep_alive"])
    finally:
        for fd in fds:
            os.close(fd)


def _watch(conn: socket.socket, done: threading.Event) -> None:
    """Leave when the client goes away mid-answer: nobody reads what follows, and an
    answer cut at an arbitrary point must not leave state behind for the next one."""
    try:
        conn.recv(1)
    except OSError:
        pass
    if not done.is_set():
        os._exit(130)


def _run(argv: list[str], cwd: str, fds: list[int]) -> int:
    """``ngram-trie-rag <argv>`` in ``cwd``, printing to the client's streams."""
    from .cli import main as cli_main

    saved = [os.dup(1), os.dup(2)]
    streams = sys.stdout, sys.stderr
    here = os.getcwd()
    try:
        os.chdir(cwd)
        for fd, target in zip(fds, (1, 2), strict=True):
            os.dup2(fd, target)
        sys.stdout, sys.stderr = _text(1, streams[0]), _text(2, streams[1])
        return cli_main(argv)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe on the client's side
                pass
        sys.stdout, sys.stderr = streams
        for fd, target in zip(saved, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(here)


def _text(fd: int, like: io.TextIOBase) -> io.TextIOWrapper:
    """A text stream on ``fd``, line-buffered on a terminal as Python's own would be."""
    return io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False),
                            encoding=getattr(like, "encoding", None) or "utf-8",
                            errors=getattr(like, "errors", None) or "strict",
                            line_buffering=os.isatty(fd), write_through=True)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # skip tearing down torch's module graph (see cli.entry)

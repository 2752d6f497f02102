"""Starting vLLM's OpenAI server with ``ngram-trie-rag serve`` for the tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Small limits so the server starts in seconds on a CPU and fits beside the tests.
SERVER_ARGS = ["--max-model-len", "4096", "--enforce-eager",
               "--kv-cache-memory-bytes", str(1 << 30), "--seed", "0"]


@dataclass(frozen=True)
class Server:
    base_url: str  # ".../v1", what OpenAI clients take
    model: str  # the served model name
    model_dir: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model_dir: str, name: str, log: Path, *options: str) -> tuple[subprocess.Popen, int]:
    """``ngram-trie-rag serve`` on a free port, in float32; returns once healthy."""
    port = free_port()
    argv = [sys.executable, "-m", "ngram_trie_rag.commands.cli", "serve", "--model", model_dir,
            "--port", str(port), "--dtype", "float32", "--served-model-name", name,
            *options, "--", *SERVER_ARGS]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, log, timeout_s=300)
    except BaseException:
        stop(proc)
        raise
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n"
                               + log.read_text()[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"no healthy server after {timeout_s} s:\n" + log.read_text()[-3000:])

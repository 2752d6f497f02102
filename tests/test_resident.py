"""`ngram-trie-rag ask` through its resident worker: the same answer as in-process, the
model loaded once for several asks, one-line errors, a thin client that imports neither
torch nor Transformers, and a worker that leaves when its client does or when idle."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ngram_trie_rag.commands import resident, worker
from ngram_trie_rag.commands.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"
QUESTION = "What does error code E2 mean on the Aurora K3?"


@pytest.fixture
def runtime(monkeypatch) -> Path:
    """A short, private XDG_RUNTIME_DIR (socket paths stop at 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="ntr-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.delenv(resident.KEEP_ALIVE_ENV, raising=False)
    return folder


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ngram_trie_rag.commands.cli", *args]


def _ask(cache: Path, *flags: str, question: str = QUESTION) -> list[str]:
    return _cli("ask", str(SAMPLE), question, "--rerank", "none", "--cache-dir", str(cache),
                *flags)


def _lock(runtime: Path) -> Path:
    """The one worker's lock file under ``runtime``."""
    (lock,) = (runtime / "ngram-trie-rag").glob("*.lock")
    return lock


def _gone(lock: Path, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not resident._locked(lock):
            return True
        time.sleep(0.05)
    return False


def test_asks_share_one_loaded_model_and_answer_as_in_process(runtime: Path, tmp_path: Path,
                                                              capsys) -> None:
    cache = tmp_path / "indexes"
    flags = ("--json", "--max-new-tokens", "16", "--keep-alive", "120")
    first = subprocess.run(_ask(cache, *flags), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(_ask(cache, *flags), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    one, two = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (first, second))
    assert "background process" not in first.stderr  # --json: no notice of the worker
    lock = _lock(runtime)
    assert resident._locked(lock)  # still serving
    # The second ask found the model loaded: no load of its own (the stage's timer still
    # reads the reused objects, 0.1 ms on a loaded host), the same answer.
    assert one["timings"]["load"] > 0.05 and two["timings"]["load"] < 0.01
    assert one["answer"] == two["answer"] and one["tokens"] == 16

    code = main(["ask", str(SAMPLE), QUESTION, "--rerank", "none", "--cache-dir", str(cache),
                 *flags])
    here = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and here["answer"] == one["answer"] and here["sources"] == one["sources"]

    # A user's mistake is one line on the asking terminal, and the worker stays.
    bad = subprocess.run(_cli("ask", str(tmp_path / "missing"), QUESTION, "--keep-alive",
                              "120"), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].startswith("error: ")
    assert "missing: no such file or folder" in bad.stderr and resident._locked(lock)

    # A client killed mid-answer takes the worker with it: nobody reads the rest.
    client = subprocess.Popen(_ask(cache, "--max-new-tokens", "256", "--no-repetition-stop",
                                   "--keep-alive", "120"),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert client.stdout is not None and client.stdout.read(1)  # the answer is streaming
    client.send_signal(signal.SIGKILL)
    client.wait(timeout=30)
    assert _gone(lock, within_s=30)


def test_the_client_builds_its_parser_without_torch() -> None:
    code = ("import sys; from ngram_trie_rag.commands import cli, resident; "
            "cli.build_parser(); resident.worker_key(None, None, None); "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_idle_worker_leaves_and_a_second_one_defers_to_the_first(runtime: Path) -> None:
    folder = resident.runtime_dir()
    sock, lock = folder / "k.sock", folder / "k.lock"
    start = time.monotonic()
    assert worker.main([str(sock), str(lock), "0.2"]) == 0  # nobody asked: it leaves
    assert time.monotonic() - start < 30 and not sock.exists() and not resident._locked(lock)

    holder = subprocess.Popen([sys.executable, "-m", "ngram_trie_rag.commands.worker",
                               str(sock), str(lock), "60"])
    try:
        deadline = time.monotonic() + 60
        while resident._connect(sock) is None:
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.05)
        # A second worker for the same key finds the lock held and leaves at once,
        # leaving the first one's socket in place.
        assert worker.main([str(sock), str(lock), "60"]) == 0
        assert sock.exists() and resident._locked(lock)
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)


def test_a_request_from_a_client_that_left_before_sending_is_dropped(runtime: Path) -> None:
    left, right = socket.socketpair()
    left.close()
    assert worker._serve(right, keep_alive=7.0) == 7.0  # nothing run, nothing kept
    right.close()


@pytest.mark.parametrize("text,seconds", [("0", 0.0), ("2.5", 2.5), ("300", 300.0)])
def test_keep_alive_takes_seconds(text: str, seconds: float) -> None:
    assert resident.keep_alive_seconds(text) == seconds


@pytest.mark.parametrize("text", ["-1", "soon", "nan", "inf"])
def test_a_bad_keep_alive_is_a_one_line_usage_error(text: str, capsys, monkeypatch) -> None:
    with pytest.raises(ValueError, match="keep-alive must be"):
        resident.keep_alive_seconds(text)
    assert main(["ask", str(SAMPLE), QUESTION, "--keep-alive", text]) == 2
    assert "keep-alive must be" in capsys.readouterr().err
    monkeypatch.setenv(resident.KEEP_ALIVE_ENV, text)
    assert main(["ask", str(SAMPLE), QUESTION], resident=True) == 2
    assert "keep-alive must be" in capsys.readouterr().err


def test_the_key_changes_with_what_a_load_depends_on(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    base = resident.worker_key(None, None, None)
    assert base == resident.worker_key(None, None, None)
    assert len({base, resident.worker_key("org/model", None, None),
                resident.worker_key(None, "cpu", None),
                resident.worker_key(None, None, "bfloat16")}) == 4
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resident.worker_key(None, None, None) != base
    monkeypatch.setenv(resident.KEEP_ALIVE_ENV, "5")  # how long a worker waits is not its key
    offline = resident.worker_key(None, None, None)
    monkeypatch.setenv(resident.KEEP_ALIVE_ENV, "50")
    assert resident.worker_key(None, None, None) == offline
    # A relative model folder names the folder, wherever the command runs.
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resident.worker_key("m", None, None) == resident.worker_key(
        str(tmp_path / "m"), None, None)


def test_a_runtime_folder_open_to_others_is_refused(runtime: Path) -> None:
    folder = resident.runtime_dir()
    os.chmod(folder, 0o755)
    with pytest.raises(resident.ResidentError, match="open to other users"):
        resident.runtime_dir()

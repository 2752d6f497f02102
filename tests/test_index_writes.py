"""Index saves never lose data: a foreign folder stays untouched, a user's file inside an
index survives a rebuild, concurrent builds take turns, a killed build leaves the previous
index loadable. FAISS indexes over a few random vectors, no embedder: every test is fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.retrieval import store
from ngram_trie_rag.retrieval.build_lock import IndexBusyError, build_lock, lock_path
from ngram_trie_rag.retrieval.errors import IndexSaveError
from ngram_trie_rag.retrieval.passage import Passage
from ngram_trie_rag.retrieval.store import read_index_dir, write_index_dir

DIM = 8
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"
ROOT = Path(__file__).resolve().parents[1]


def save(target: Path, n: int, *, wait_s: float = 30.0) -> Path:
    """An index of ``n`` passages whose texts say ``n`` (to tell saves apart)."""
    import faiss

    rng = np.random.default_rng(n)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    faiss.normalize_L2(vectors)
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    passages = [Passage(f"p{i}", f"save {n} passage {i}", "test") for i in range(n)]
    fields = {"embedder": "test", "dim": DIM, "factory": "Flat", "nprobe": None}
    return write_index_dir(target, index, passages, fields, wait_s=wait_s)


def texts(target: Path) -> set[str]:
    return {p.text.split(" passage")[0] for p in read_index_dir(target).passages}


def siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir())


def test_foreign_manifest_folder_is_untouched(tmp_path: Path, capsys) -> None:
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name": "ext"}')
    (webapp / "src" / "app.js").write_text("x")
    with pytest.raises(IndexSaveError, match="not an index"):
        save(webapp, 3)
    assert main(["index", "build", str(SAMPLE), "--out", str(webapp)]) == 2
    assert "not an index" in capsys.readouterr().err
    assert (webapp / "manifest.json").read_text() == '{"name": "ext"}'
    assert (webapp / "src" / "app.js").read_text() == "x"
    assert siblings(webapp) == ["webapp"]


@pytest.mark.parametrize("manifest", [
    {"format": "ngram-trie-rag-index", "format_version": 99, "files": {}},
    {"format": "ngram-trie-rag-index", "format_version": 1, "files": {"src/app.js": {}}},
    {"format": "something-else", "format_version": 1},
])
def test_manifest_that_is_almost_ours_is_refused(tmp_path: Path, manifest: dict) -> None:
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "index.faiss").write_text("not ours to delete")
    with pytest.raises(IndexSaveError, match="not an index"):
        save(folder, 3)
    assert (folder / "index.faiss").read_text() == "not ours to delete"


def test_users_files_inside_an_index_survive_a_rebuild(tmp_path: Path) -> None:
    target = save(tmp_path / "idx", 3)
    (target / "notes.txt").write_text("mine")
    (target / "src").mkdir()
    (target / "src" / "app.js").write_text("also mine")
    save(target, 5)
    assert texts(target) == {"save 5"}
    assert (target / "notes.txt").read_text() == "mine"
    assert (target / "src" / "app.js").read_text() == "also mine"
    assert siblings(target) == ["idx"]  # no temporary, set-aside or lock files left


def test_empty_folder_and_symlinked_target(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    save(tmp_path / "link", 4)
    assert (tmp_path / "link").is_symlink() and texts(tmp_path / "real") == {"save 4"}


def test_concurrent_saves_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads save into one folder at the same moment, each write slowed so they
    overlap: both succeed one after the other, and the folder holds one whole index."""
    target = tmp_path / "idx"
    real_write = store._write_file

    def slow_write(path: Path, data: bytes) -> dict:
        threading.Event().wait(0.2)
        return real_write(path, data)

    monkeypatch.setattr(store, "_write_file", slow_write)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            save(target, n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in (3, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert texts(target) in ({"save 3"}, {"save 7"})
    assert siblings(target) == ["idx"]


def test_a_busy_folder_fails_clearly_when_not_waiting(tmp_path: Path) -> None:
    target = tmp_path / "idx"
    holder_ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        with build_lock(target):
            holder_ready.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    holder_ready.wait(30)
    try:
        with pytest.raises(IndexBusyError, match=f"another build is writing .*pid {os.getpid()}"):
            save(target, 3, wait_s=0.2)
    finally:
        release.set()
        thread.join()
    save(target, 3, wait_s=0)  # free again
    assert texts(target) == {"save 3"}


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from ngram_trie_rag.retrieval.build_lock import build_lock
    with build_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


def test_second_cli_build_into_a_busy_folder_exits_2_at_once(tmp_path: Path, capsys) -> None:
    """Another process builds into ``idx``: ``index build`` fails before embedding, in one
    line naming that process, and changes nothing."""
    target = save(tmp_path / "idx", 3)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(target)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["index", "build", str(SAMPLE), "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: another build is writing the index")
        assert f"pid {holder.pid}" in err[-1]
    finally:
        holder.kill()
        holder.wait()
    assert texts(target) == {"save 3"}
    save(target, 4, wait_s=0)  # the dead holder's lock is no obstacle
    assert texts(target) == {"save 4"} and siblings(target) == ["idx"]


KILLED_MIDWAY = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from ngram_trie_rag.retrieval import store
    from test_index_writes import save
    real = store._write_file
    def stall(path, data):
        out = real(path, data)
        print("half-written", flush=True)  # index.faiss is on disk, the rest is not
        time.sleep(60)
        return out
    store._write_file = stall
    save(store.Path(sys.argv[1]), 9)
""")


def test_build_killed_midway_leaves_the_previous_index(tmp_path: Path) -> None:
    target = save(tmp_path / "idx", 3)
    (target / "notes.txt").write_text("mine")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MIDWAY, str(target),
                             str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    assert proc.stdout.readline().strip() == "half-written"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert texts(target) == {"save 3"}  # loadable, with its content
    assert (target / "notes.txt").read_text() == "mine"
    assert any(".tmp-" in name for name in siblings(target))  # the dead build's folder
    save(target, 5, wait_s=0)  # the lock died with it; the leftover is cleaned up
    assert texts(target) == {"save 5"} and (target / "notes.txt").read_text() == "mine"
    assert siblings(target) == ["idx"]


def test_killed_between_the_renames_is_recovered(tmp_path: Path) -> None:
    """A save killed after moving the old folder aside: the next save puts it back (with
    the user's files) before replacing the index."""
    target = save(tmp_path / "idx", 3)
    (target / "notes.txt").write_text("mine")
    target.rename(tmp_path / ".idx.old-0123abcd")  # as the kill left it
    save(target, 5)
    assert texts(target) == {"save 5"} and (target / "notes.txt").read_text() == "mine"
    assert siblings(target) == ["idx"]


def test_lock_file_lives_beside_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "idx"
    with build_lock(target):
        assert lock_path(target).is_file()
        with build_lock(target):  # re-entrant in one thread
            pass
    assert not lock_path(target).exists()

"""Every subcommand, walked through a user's usual mistakes: a bad path, a bad number, a
bad model folder (and a symlink loop, a question longer than the context window). Each
must exit 2 with one ``error`` line on stderr and no traceback; ``--debug`` shows it.

The CLI runs in-process through ``main(argv)``; one case runs the installed command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ngram_trie_rag.commands.cli import build_parser, main

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths the table refers to: a small docs folder, its index, a data file, a folder
    with a config but no weights, a folder with a symlink loop."""
    root = tmp_path_factory.mktemp("cli")
    docs = root / "docs"
    docs.mkdir()
    (docs / "note.txt").write_text("The Aurora K3 shows error E2 when the water tank is empty.")
    loop = root / "loop"
    loop.mkdir()
    (loop / "ok.txt").write_text("fine")
    (loop / "self.txt").symlink_to(loop / "self.txt")
    weightless = root / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps({"model_type": "llama"}))
    data = root / "data.jsonl"
    data.write_text(json.dumps({"docs": ["E2 means the tank is empty."],
                                "query": "What is E2?"}) + "\n")
    index = root / "index"
    assert main(["index", "build", str(docs), "--out", str(index)]) == 0
    return {"DOCS": str(docs), "LOOP": str(loop), "WEIGHTLESS": str(weightless),
            "DATA": str(data), "INDEX": str(index), "MISSING": str(root / "missing"),
            "CACHE": str(root / "cache"), "OUT": str(root / "out.json")}


# (subcommand, what is wrong, argv with PLACEHOLDERS, a word the error line must hold)
CASES = [
    # bad paths
    ("ask", "path", "ask MISSING q? --cache-dir CACHE", "no such file"),
    ("chat", "path", "chat MISSING --cache-dir CACHE", "no such file"),
    ("index build", "path", "index build MISSING --out OUT", "not found"),
    ("index build", "out", "index build DOCS --out DATA", "is a file"),
    ("index query", "path", "index query MISSING q?", "index not found"),
    ("bench", "path", "bench --data MISSING --out OUT", "does not exist"),
    ("sweep", "path", "sweep --data MISSING --out OUT", "does not exist"),
    ("bench-serve", "path", "bench-serve --data MISSING", "does not exist"),
    ("cost-curve", "path", "cost-curve --shapes tiny-llama --oracle MISSING",
     "oracle_by_max_draft"),
    ("ask", "symlink loop", "ask LOOP q? --cache-dir CACHE --rerank none", "symbolic links"),
    ("index build", "symlink loop", "index build LOOP --out OUT", "symbolic links"),
    # bad numbers
    ("demo", "number", "demo --max-new-tokens 0", "at least 1"),
    ("demo", "number", "demo --max-new-tokens 3.7", "integer"),
    ("ask", "number", "ask DOCS q? --k 0", "--k"),
    ("ask", "number", "ask DOCS q? --max-new-tokens -5", "--max-new-tokens"),
    ("chat", "number", "chat DOCS --candidates x", "--candidates"),
    ("ask", "number", "ask DOCS q? --max-bytes lots", "--max-bytes"),
    ("index build", "number", "index build DOCS --out OUT --chunk-size 0", "--chunk-size"),
    ("index build", "number", "index build DOCS --out OUT --overlap -1", "--overlap"),
    ("index build", "number", "index build DOCS --out OUT --max-passages 0", "--max-passages"),
    ("index query", "number", "index query INDEX q? --k -2", "--k"),
    ("index query", "number", "index query INDEX q? --nprobe 0", "--nprobe"),
    ("bench", "number", "bench --data DATA --out OUT --max-new-tokens x", "--max-new-tokens"),
    ("sweep", "number", "sweep --data DATA --out OUT --n 3,x", "--n"),
    ("bench-serve", "number", "bench-serve --data DATA --concurrency x", "--concurrency"),
    ("bench-serve", "quantize", "bench-serve --data DATA --methods vllm,local --quantize w8a8",
     "applies to the local methods"),
    ("serve", "number", "serve --port x", "--port"),
    ("cost-curve", "number", "cost-curve --sizes 4,x", "--sizes"),
    ("cost-curve", "number", "cost-curve --shapes tiny-llama --repeats 0", ">= 1"),
    ("cost-curve", "shape", "cost-curve --shapes huge-model", "unknown shape"),
    # caps
    ("index build", "cap", "index build DOCS --out OUT --max-bytes 10", "max-bytes"),
    ("ask", "cap", "ask DOCS q? --cache-dir CACHE --max-passages 1 --max-bytes 10",
     "max-bytes"),
    # bad models
    ("ask", "model", "ask DOCS q? --model WEIGHTLESS --cache-dir CACHE --rerank none",
     "cannot load a model"),
    ("ask", "model", "ask DOCS q? --model MISSING --cache-dir CACHE", "does not exist"),
    ("index query", "model", "index query INDEX q? --rerank llm --model WEIGHTLESS",
     "cannot load a model"),
    ("bench", "model", "bench --data DATA --out OUT --model MISSING", "does not exist"),
    ("calibrate", "model", "calibrate --model MISSING", "does not exist"),
    ("calibrate", "model", "calibrate --model WEIGHTLESS", "cannot load a model"),
    ("sweep", "model", "sweep --data DATA --out OUT --model WEIGHTLESS --replay",
     "cannot load a model"),
    ("bench-serve", "model", "bench-serve --data DATA --model MISSING", "missing"),
    ("serve", "model", "serve --model MISSING", "vllm"),
]


def _argv(template: str, place: dict[str, str]) -> list[str]:
    return [place.get(word, word) for word in template.split()]


@pytest.mark.parametrize(("command", "problem", "template", "word"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_user_errors_are_one_line_exit_2(command: str, problem: str, template: str,
                                          word: str, place: dict[str, str], capsys) -> None:
    code = main(_argv(template, place))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err  # progress lines may come first; one error line
    assert word.lower() in errors[0].lower(), errors[0]


def test_every_subcommand_is_in_the_table() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) == {c[0].split()[0] for c in CASES}


def test_question_longer_than_the_context_window(place: dict[str, str], capsys) -> None:
    question = "why " * 9000  # more tokens than SmolLM2's 8192-token window
    code = main(["ask", place["DOCS"], question, "--rerank", "none", "--cache-dir",
                 place["CACHE"]])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "context window" in err.splitlines()[-1] and "--k" in err.splitlines()[-1]


def test_debug_shows_the_traceback(place: dict[str, str]) -> None:
    from ngram_trie_rag.retrieval import IndexLoadError

    for argv in (["--debug", "index", "query", place["MISSING"], "q?"],
                 ["index", "query", place["MISSING"], "q?", "--debug"],
                 ["ask", place["MISSING"], "q?", "--debug"]):
        with pytest.raises((IndexLoadError, ValueError)):
            main(argv)


def test_installed_command_prints_no_traceback(place: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "ngram_trie_rag.commands.cli", "index",
                           "build", place["DOCS"], "--out", place["DOCS"]],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: refusing to save index")


def test_the_command_exits_with_its_code_and_all_its_output(tmp_path) -> None:
    """The console script skips Python's teardown: its output must still be complete,
    piped or not, the exit code the command's, and a thread it started waited for."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, threading, time\n"
        "from ngram_trie_rag.commands import cli\n"
        "def late():\n"
        "    time.sleep(0.3)\n"
        "    print('thread done', flush=False)\n"
        "def main(resident=False):\n"
        "    threading.Thread(target=late).start()\n"
        "    print('x' * 200000, end='')\n"
        "    print('bye', file=sys.stderr, end='')\n"
        "    return 3\n"
        "cli.main = main\n"
        "cli.entry()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 3
    assert done.stdout == "x" * 200000 + "thread done\n"
    assert done.stderr.endswith("bye")
    version = subprocess.run([sys.executable, "-m", "ngram_trie_rag.commands.cli",
                              "--version"], capture_output=True, text=True, cwd=ROOT,
                             timeout=300)
    assert version.returncode == 0 and version.stdout.startswith("ngram-trie-rag ")

"""The GPU host's script, run here at tiny sizes on the CPU, so that a GPU run is never
the first run of its code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ngram_trie_rag.loading import default_model_dir
from ngram_trie_rag.util.cache_paths import data_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir() / "spec_bench" / "rag.jsonl"


def test_gpu_session_runs_every_random_weight_part_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_session.py"), "--out", str(out),
         "--device", "cpu", "--quick", "--parts", "env,curve,smoke,compiled",
         "--meta", str(default_model_dir()), "--data", str(DATA)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FAILED" not in done.stdout, done.stdout[-2000:]
    assert json.loads((out / "env.json").read_text())["device"] == "cpu"
    assert "| tiny-llama |" in (out / "curve.md").read_text()
    smoke = json.loads((out / "smoke.json").read_text())["methods"]
    assert smoke["chain"]["exact_match_rate"] == smoke["trie"]["exact_match_rate"] == 1.0
    assert set(json.loads((out / "compiled.json").read_text())) >= {"dynamic", "static-2nd"}


def test_the_one_command_runs_on_the_cpu_and_writes_one_report(tmp_path: Path) -> None:
    """``scripts/gpu_session.sh --device cpu --quick OUT``: every part it runs without
    real weights (env, the gpu tests, which skip here, the compiled static step at tiny
    sizes), then the report."""
    out = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "--device", "cpu",
                           "--quick", str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FAILED" not in done.stdout, done.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert "## env" in report and "## tests" in report and "## static" in report
    assert set(json.loads((out / "report.json").read_text())) >= {"env", "static"}
    assert "skipped" in (out / "tests.txt").read_text()  # no CUDA: each test says why


def test_carried_weights_are_kept_until_every_part_has_come(tmp_path: Path) -> None:
    """``scripts/gpu_carry.py`` cuts the weights into parts, one per transfer; the session
    script keeps each part it is given, and joins and checks them once all are there."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_carry import split
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    weights = tmp_path / "model.gguf"
    weights.write_bytes(os.urandom(3000))
    parts = tmp_path / "parts"
    assert split(weights, parts, 1024) == 3
    stage = tmp_path / "stage"
    # the staging is the shell script's own work: the Python parts it then starts are
    # checked above, so `true` stands in for the interpreter here
    env = {**os.environ, "TMPDIR": str(tmp_path), "STAGE": str(stage), "PYTHON": "true"}
    for k, carried in enumerate((["part-1"], ["part-2", "part-3"])):
        carry = tmp_path / f"carry-{k}"
        for name in carried:
            shutil.copytree(parts / name, carry / name)
        done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "--device",
                               "cpu", "--carry", str(carry), "--only", "env",
                               str(tmp_path / f"out-{k}")],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if k == 0:
            assert "1 of 3 parts here" in done.stdout
            assert not (stage / "model.gguf").exists()
    assert (stage / "model.gguf").read_bytes() == weights.read_bytes()
    # a part that does not belong: the join is refused
    (stage / "model.gguf.3").write_bytes(b"x")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "--device", "cpu",
                           "--carry", str(tmp_path / "carry-none"), "--only", "env",
                           str(tmp_path / "out-bad")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3 and "sha256" in done.stderr

"""The GPU host's script, run here at tiny sizes on the CPU, so that a GPU run is never
the first run of its code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ngram_trie_rag.loading import default_model_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "spec_bench" / "rag.jsonl"


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

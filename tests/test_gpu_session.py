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

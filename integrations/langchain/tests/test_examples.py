"""The LangChain example runs end to end as a user would run it, and prints what it
promises: two answers, equal, the drafted one with more than one token per step, the
passages drafted from, and a streamed answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "langchain_rag.py"
TOKENS = 24
TIMING = re.compile(r"^--- (?P<label>[a-z ]+): [\d.]+ s, (?P<rate>[\d.]+) tokens/step$")


def test_langchain_rag_example_prints_equal_answers_and_speculative_stats():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(EXAMPLE), "--max-tokens", str(TOKENS)],
                         cwd=EXAMPLE.parents[1], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    rates = {m["label"]: float(m["rate"]) for m in map(TIMING.match, lines) if m}
    assert rates.keys() == {"plain decoding", "drafted from documents"}
    assert rates["plain decoding"] == 1.0  # no drafts: one token per forward
    assert rates["drafted from documents"] > 1.0  # the answer copies from the manual
    answers = [lines[i + 1] for i, line in enumerate(lines) if TIMING.match(line)]
    assert answers[0].strip() and answers[0] == answers[1]
    assert "same answer: True" in lines
    drafted = next(line for line in lines if line.startswith("drafted from: "))
    assert "aurora_k3" in drafted
    streamed = next(line for line in lines if line.startswith("streamed: "))
    assert streamed.removeprefix("streamed: ").strip()

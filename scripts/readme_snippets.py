#!/usr/bin/env python
"""Run every ```python block of the README, each in a fresh interpreter.

    python scripts/readme_snippets.py --python /path/to/venv/bin/python [--readme README.md]

Each block is written to a file in a new temporary folder and run there with the given
interpreter, so it imports the installed packages, never this checkout's sources. The
environment is passed on unchanged (``make test-wheels`` sets ``HF_HUB_OFFLINE=1``). One line
per block: ``ok`` or ``FAIL``, its line in the README, its first line and the time taken; a
failed block's output follows it. The exit status is 1 when any block failed (or none was
found), else 0. Blocks fenced as ```py, ```pycon or ```text are not run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPENING = re.compile(r"^```python\s*$")
CLOSING = re.compile(r"^```\s*$")


@dataclass(frozen=True)
class Snippet:
    line: int
    """1-based line of the README where the code starts (after the fence)."""
    code: str

    @property
    def first_line(self) -> str:
        return next((s.strip() for s in self.code.splitlines() if s.strip()), "")


def extract(text: str) -> list[Snippet]:
    """The README's ```python blocks, in order."""
    snippets: list[Snippet] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if OPENING.match(lines[i]):
            start = i + 1
            end = start
            while end < len(lines) and not CLOSING.match(lines[end]):
                end += 1
            if end == len(lines):
                raise ValueError(f"line {i + 1}: ```python block is never closed")
            snippets.append(Snippet(start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return snippets


def run(snippet: Snippet, python: str, timeout: float) -> tuple[bool, str, float]:
    """Run one block in a fresh folder: (passed, its output, seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="readme-snippet-") as folder:
        script = Path(folder) / f"readme_line_{snippet.line}.py"
        script.write_text(snippet.code)
        try:
            done = subprocess.run([python, str(script)], cwd=folder, capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + _text(exc.stderr)
            return False, f"{output}\ntimed out after {timeout:.0f} s", timeout
    elapsed = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        output += f"\nexit status {done.returncode}"
    return done.returncode == 0, output, elapsed


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter to run the blocks with (default: this one)")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per block")
    parser.add_argument("--show-output", action="store_true",
                        help="print each block's output, not only a failed block's")
    parser.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    args = parser.parse_args(argv)

    name = args.readme.name
    snippets = extract(args.readme.read_text(encoding="utf-8"))
    if not snippets:
        print(f"no ```python blocks in {args.readme}", file=sys.stderr)
        return 1
    if args.list:
        for snippet in snippets:
            print(f"{name}:{snippet.line}  {snippet.first_line}")
        return 0
    python = args.python if os.sep not in args.python else str(Path(args.python).absolute())

    failed = 0
    for snippet in snippets:
        passed, output, seconds = run(snippet, python, args.timeout)
        status = "ok  " if passed else "FAIL"
        print(f"{status} {name}:{snippet.line}  {snippet.first_line}  ({seconds:.1f} s)",
              flush=True)
        if not passed or args.show_output:
            tail = output.strip().splitlines()[-60:]
            print("\n".join(f"    | {line}" for line in tail), flush=True)
        failed += not passed
    print(f"{len(snippets) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

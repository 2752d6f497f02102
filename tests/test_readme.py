"""The README's Python blocks are complete programs, and the distributions ship the license.

Running the blocks needs the model and installed wheels: ``make test-wheels`` does that.
These checks are static and take a second.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "readme_snippets.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("readme_snippets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


readme_snippets = _load_script()
SNIPPETS = readme_snippets.extract((ROOT / "README.md").read_text(encoding="utf-8"))


def _ruff() -> str | None:
    here = Path(sys.executable).with_name("ruff")
    return str(here) if here.exists() else shutil.which("ruff")


def test_readme_has_the_library_and_both_framework_blocks() -> None:
    code = "\n".join(s.code for s in SNIPPETS)
    for name in ("SpeculativeGenerator", "ChatNGramTrie", "NGramTrieLLM"):
        assert name in code, f"no ```python block of the README uses {name}"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"README.md:{s.line}")
def test_block_compiles(snippet) -> None:
    compile(snippet.code, f"README.md:{snippet.line}", "exec")


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"README.md:{s.line}")
def test_block_defines_every_name_it_uses(snippet) -> None:
    """Each block runs on its own: no name from another block or from the prose."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [ruff, "check", "--isolated", "--no-cache", "--select", "F821,F401,F811",
         "--output-format", "concise", "--stdin-filename", f"readme_line_{snippet.line}.py",
         "-"],
        input=snippet.code, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_extract_finds_python_blocks_only() -> None:
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```py\nb = 2\n```\n```python\nc = 3\n```\n"
    assert [(s.line, s.code) for s in readme_snippets.extract(text)] == [
        (3, "a = 1\n"), (12, "c = 3\n")]
    with pytest.raises(ValueError, match="never closed"):
        readme_snippets.extract("```python\na = 1\n")


def test_runner_names_the_failing_block(tmp_path: Path, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("```python\nprint('fine')\n```\n\n"
                      "```python\nraise SystemExit(undefined)\n```\n")
    assert readme_snippets.main(["--readme", str(readme), "--python", sys.executable]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok   README.md:2  print('fine')")
    assert out[1].startswith("FAIL README.md:6  raise SystemExit(undefined)")
    assert any("NameError" in line for line in out)
    assert out[-1] == "1 passed, 1 failed"


def test_every_distribution_ships_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text
    for folder in ("integrations/langchain", "integrations/llama_index"):
        assert (ROOT / folder / "LICENSE").read_text() == text, f"{folder}/LICENSE differs"

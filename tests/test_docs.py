"""The documentation site builds in strict mode (broken links and missing pages fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists() and shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    cmd = [str(mkdocs if mkdocs.exists() else "mkdocs"), "build", "--strict",
           "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_readme_shows_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make demo") < readme.index("make test") < readme.index("## Use it")


def test_module_map_names_every_module() -> None:
    """docs/how-it-works.md's module map lists every module of the core packages."""
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    block = text.split("## 0. Module map", 1)[1].split("```", 2)[1]
    package = ROOT / "ngram_trie_rag"
    modules = [*package.glob("*.py"), *package.glob("drafting/*.py"),
               *package.glob("engine/**/*.py"), *package.glob("backends/*.py"),
               *package.glob("serving/*.py"), *package.glob("commands/*.py"),
               *package.glob("decoding/*.py"), *package.glob("wrappers/*.py"),
               *package.glob("util/*.py")]
    missing = [str(p.relative_to(package)) for p in modules
               if p.name != "__init__.py" and p.name not in block]
    assert not missing, f"not in the module map: {missing}"
    packages = [p.parent.name for p in package.glob("engine/*/__init__.py")]
    assert all(f"{name}/" in block for name in packages), "an engine sub-package is unlisted"


def test_the_package_roots_stay_small() -> None:
    """At most 12 loose modules at the package root and at the engine's root: everything
    else lives in a sub-package named for its idea."""
    package = ROOT / "ngram_trie_rag"
    for folder in (package, package / "engine"):
        loose = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
        assert len(loose) <= 12, f"{folder.name}: {loose}"

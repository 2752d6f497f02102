"""Benchmarks: plain greedy vs prompt lookup vs the chain and tree drafters, Spec-Bench style.

Python API::

    from ngram_trie_rag.bench import BenchConfig, run_benchmark
    results = run_benchmark(BenchConfig(data="rag.jsonl", limit=10, max_new_tokens=128))

Command line: ``ngram-trie-rag bench --data FILE.jsonl --out results.json`` and
``ngram-trie-rag sweep --data FILE.jsonl --out sweep.json [--replay]``.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from ..util.lazy import lazy_exports

_EXPORTS = {
    "METHODS": ".config",
    "BenchConfig": ".config",
    "SweepConfig": ".config",
    "BenchItem": ".data",
    "DataFormatError": ".data",
    "load_items": ".data",
    "bench_table": ".report",
    "sweep_tables": ".report",
    "write_json": ".report",
    "run_benchmark": ".runner",
    "run_sweep": ".sweep",
}

if TYPE_CHECKING:
    from .config import METHODS, BenchConfig, SweepConfig
    from .data import BenchItem, DataFormatError, load_items
    from .report import bench_table, sweep_tables, write_json
    from .runner import run_benchmark
    from .sweep import run_sweep

__all__ = [
    "METHODS",
    "BenchConfig",
    "BenchItem",
    "DataFormatError",
    "SweepConfig",
    "bench_table",
    "load_items",
    "run_benchmark",
    "run_sweep",
    "sweep_tables",
    "write_json",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

"""Decode speed-up projected from a verification cost curve and oracle accepted lengths.

A step that verifies up to K draft tokens costs ``ratio(K)`` plain steps (the cost
curve, :mod:`~ngram_trie_rag.bench.cost_curve`) and commits ``oracle(K)`` tokens for the
best drafter that copies from the context (the oracle replay of real greedy answers,
bonus token included; a benchmark's ``oracle_by_max_draft``). Decoding then runs
``oracle(K) / ratio(K)`` times as fast as plain decoding, before drafting time, and the
K that maximises it is the one worth verifying. It is a ceiling for the trie, whose
accepted length stays below the oracle's (the benchmark's "of oracle" column), and the
on-paper answer for model sizes that do not run here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .cost_curve import Point

PAPER = "the paper: 3.48x on Spec-Bench RAG, accepted length 5.19 (Vicuna-7B on a GPU)"


@dataclass(frozen=True)
class Projection:
    """The best draft size for one (shape, context, kind) and what it projects."""

    shape: str
    context: int
    kind: str  # "chain" or "tree"
    best_k: int
    accept: float  # oracle accepted length at best_k
    ratio: float  # cost of that step over a plain one
    speedup: float  # accept / ratio


def read_oracle(path: str | Path) -> dict[int, float]:
    """Oracle accepted length per draft cap K from a ``bench`` results JSON."""
    try:
        meta = json.loads(Path(path).read_text())["meta"]
        return {int(k): float(v) for k, v in meta["oracle_by_max_draft"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a bench results file with meta.oracle_by_max_draft "
                         f"({exc})") from exc


def _oracle_at(oracle: dict[int, float], k: int) -> float | None:
    """The oracle for a cap of ``k``: at the largest cap measured not above it (a larger
    cap never accepts less, so this is a lower bound)."""
    caps = [c for c in oracle if c <= k]
    return oracle[max(caps)] if caps else None


def project(points: list[Point], oracle: dict[int, float]) -> list[Projection]:
    """The best K per (shape, context, kind) of ``points``."""
    best: dict[tuple[str, int, str], Projection] = {}
    for p in points:
        accept = _oracle_at(oracle, p.draft) if p.draft else None
        if accept is None or p.ratio <= 0:
            continue
        candidate = Projection(p.shape, p.context, p.kind, p.draft, accept, p.ratio,
                               accept / p.ratio)
        key = (p.shape, p.context, p.kind)
        if key not in best or candidate.speedup > best[key].speedup:
            best[key] = candidate
    return list(best.values())


def table(projections: list[Projection]) -> str:
    """Markdown: one row per (shape, context, kind), with the paper's figure below."""
    lines = ["| shape | context | kind | best K | oracle accept | step cost | projected "
             "speed-up |", "|---|---|---|---|---|---|---|"]
    for p in projections:
        lines.append(f"| {p.shape} | {p.context} | {p.kind} | {p.best_k} | {p.accept:.2f} | "
                     f"{p.ratio:.2f}x | {p.speedup:.2f}x |")
    lines.append(f"\nBefore drafting time; an upper bound for the trie. For comparison, {PAPER}.")
    return "\n".join(lines)


def as_json(projections: list[Projection]) -> list[dict]:
    return [asdict(p) for p in projections]

#!/usr/bin/env python
"""Retrieval quality and speed: Flat vs IVF-PQ vs IVF-PQ + LLM rerank on NQ-open, and the
paper's IVF4096,PQ64 (nprobe 16) on ~170k synthetic vectors.

Corpus: the 1,000 passages of ``wiki_passages/passages.jsonl`` plus the gold passage of
every NQ-open question in ``nq_open/nq-open-oracle.jsonl.gz`` (deduplicated on the passage
text), embedded as "title\\ntext" with the packaged MiniLM. Each question has exactly one
gold passage; recall@k is the share of questions whose gold passage is in the top k.

    .venv/bin/python scripts/retrieval_eval.py --questions 500 --rerank-methods \\
        --skip-synthetic                                   # Flat vs IVF-PQ, 500 questions
    .venv/bin/python scripts/retrieval_eval.py --threads 1 --rerank-questions 150 \\
        --rerank-depth 20 --rerank-methods query_likelihood --skip-synthetic   # + LLM rerank
    .venv/bin/python scripts/retrieval_eval.py --only-synthetic --synthetic 170000

Embeddings of the corpus are cached in --embed-cache (default: the system temp dir), so
reruns skip embedding 3,588 passages (67 s on a quiet 2-core CPU, ~5 min on a busy one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ngram_trie_rag.retrieval import Embedder, LLMReranker, Passage, VectorIndex  # noqa: E402
from ngram_trie_rag.retrieval.corpus import PassageCorpus  # noqa: E402
from ngram_trie_rag.retrieval.jsonl import read_jsonl  # noqa: E402
from ngram_trie_rag.retrieval.policy import (  # noqa: E402
    choose_factory,
    nlist_for_count,
    pq_m_for_dim,
)
from ngram_trie_rag.util.cache_paths import data_dir  # noqa: E402

NQ = data_dir() / "nq_open" / "nq-open-oracle.jsonl.gz"
WIKI = data_dir() / "wiki_passages" / "passages.jsonl"


def load_corpus() -> tuple[list[Passage], list[dict], list[str]]:
    """(passages, NQ rows, gold passage id per NQ row)."""
    corpus = PassageCorpus()
    corpus.add_file(WIKI, prefix="wiki")
    rows = [row for _, row in read_jsonl(NQ)]
    gold = [
        corpus.add(f"nq:{i}", r["ctxs"][0]["title"], r["ctxs"][0]["text"], "nq_gold")
        for i, r in enumerate(rows)
    ]
    return corpus.passages, rows, gold


def corpus_vectors(embedder: Embedder, passages: list[Passage], cache: Path) -> np.ndarray:
    """Embeddings of the corpus, cached on disk keyed by embedder + every passage text."""
    digest = hashlib.sha256(embedder.name.encode())
    for p in passages:
        digest.update(p.text.encode("utf-8") + b"\0")
    path = cache / f"retrieval_eval_{digest.hexdigest()[:16]}.npy"
    if path.exists():
        return np.load(path)
    start = time.perf_counter()
    vectors = embedder.encode([p.text for p in passages], progress=True)
    print(f"embedded {len(passages)} passages in {time.perf_counter() - start:.1f} s")
    np.save(path, vectors)
    return vectors


def recall(results: list[list[Passage]], gold_ids: list[str], k: int) -> float:
    hits = sum(gold in [p.id for p in row[:k]] for row, gold in zip(results, gold_ids, strict=True))
    return hits / len(gold_ids)


def timed_search(index: VectorIndex, queries: np.ndarray, k: int) -> tuple[list, float]:
    """Results and mean ms per query, searching one query at a time (interactive use)."""
    index.search(queries[:5], k=k)  # warm-up
    start = time.perf_counter()
    results = [index.search(q, k=k)[0] for q in queries]
    return results, 1000 * (time.perf_counter() - start) / len(queries)


def nq_eval(args: argparse.Namespace) -> dict:
    embedder = Embedder()
    passages, rows, gold = load_corpus()
    vectors = corpus_vectors(embedder, passages, Path(args.embed_cache))
    n, dim = vectors.shape
    questions = [r["question"] for r in rows[: args.questions]]
    gold_ids = gold[: args.questions]
    query_vectors = embedder.encode_queries(questions)
    print(f"corpus {n} passages (dim {dim}); {len(questions)} questions")

    report: dict = {"corpus": n, "questions": len(questions), "indexes": []}
    factories = ["Flat", *args.ivf_factories]
    built: dict[str, VectorIndex] = {}
    for factory in factories:
        index = VectorIndex(embedder, factory=factory)
        start = time.perf_counter()
        index.add(passages, vectors)
        build_s = time.perf_counter() - start
        results, ms = timed_search(index, query_vectors, k=100)
        row = {
            "factory": factory,
            "nprobe": index.nprobe,
            "build_s": round(build_s, 2),
            "recall@5": recall(results, gold_ids, 5),
            "recall@20": recall(results, gold_ids, 20),
            "recall@100": recall(results, gold_ids, 100),
            "search_ms_per_query": round(ms, 3),
        }
        report["indexes"].append(row)
        built[factory] = index
        print(json.dumps(row))

    if not args.rerank_methods:
        return report
    rerank_factory = args.ivf_factories[0]
    index = built[rerank_factory]
    m = min(args.rerank_questions, len(questions))
    first_stage = [index.search(q, k=args.rerank_depth)[0] for q in query_vectors[:m]]
    subset_gold = gold_ids[:m]
    report["rerank"] = {
        "index": rerank_factory,
        "questions": m,
        "depth": args.rerank_depth,
        "before": {
            "recall@1": recall(first_stage, subset_gold, 1),
            "recall@5": recall(first_stage, subset_gold, 5),
            f"recall@{args.rerank_depth}": recall(first_stage, subset_gold, args.rerank_depth),
        },
        "methods": [],
    }
    reranker = None
    for method in args.rerank_methods:
        reranker = (
            LLMReranker(method=method)
            if reranker is None
            else LLMReranker(reranker.model, reranker.tokenizer, method=method)
        )
        reranker.score("warm-up", ["warm-up passage"])
        start = time.perf_counter()
        reranked = [
            reranker.rerank(q, found, top_n=args.rerank_depth)
            for q, found in zip(questions[:m], first_stage, strict=True)
        ]
        seconds = time.perf_counter() - start
        row = {
            "method": method,
            "recall@1": recall(reranked, subset_gold, 1),
            "recall@5": recall(reranked, subset_gold, 5),
            "s_per_question": round(seconds / m, 2),
        }
        report["rerank"]["methods"].append(row)
        print(json.dumps(row))
    return report


def clustered_unit_vectors(
    n: int, centers: np.ndarray, rng: np.random.Generator, noise: float
) -> np.ndarray:
    """Points around random centres, normalised: closer to real embeddings (which cluster
    by topic) than uniform noise on the sphere, on which no IVF index can do well. With
    noise 0.05 in 384 dims a point's cosine to its centre is ~0.7."""
    x = centers[rng.integers(0, len(centers), n)]
    x = x + rng.standard_normal(x.shape, dtype=np.float32) * noise
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _recall_vs_exact(found: list[list[Passage]], truth: np.ndarray) -> tuple[float, float]:
    """(share of the exact top-10 found in the top-10, share of exact top-1 in the top-100)."""
    ids = [[int(p.id) for p in row] for row in found]
    r10 = np.mean([len(set(f[:10]) & set(t)) / 10 for f, t in zip(ids, truth.tolist(),
                                                                   strict=True)])
    r1 = np.mean([t[0] in f for f, t in zip(ids, truth.tolist(), strict=True)])
    return float(r10), float(r1)


def _raw_faiss_breakdown(factory: str, data: np.ndarray, queries: np.ndarray) -> dict:
    """Train, add and search timed separately, straight on FAISS: VectorIndex.add does
    train + add in one call, and VectorIndex.search also builds Passage objects."""
    import faiss

    from ngram_trie_rag.retrieval.vector_index import _disable_polysemous_training

    raw = faiss.index_factory(data.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    _disable_polysemous_training(raw)
    start = time.perf_counter()
    raw.train(data)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    raw.add(data)
    add_s = time.perf_counter() - start
    faiss.ParameterSpace().set_index_parameter(raw, "nprobe", 16)
    start = time.perf_counter()
    raw.search(queries, 100)
    search_ms = 1000 * (time.perf_counter() - start) / len(queries)
    return {
        "raw_faiss_train_s": round(train_s, 1),
        "raw_faiss_add_s": round(add_s, 1),
        "raw_faiss_search_ms_per_query_batch_nprobe16": round(search_ms, 3),
    }


def synthetic_eval(args: argparse.Namespace) -> dict:
    """The paper's index at the size where the policy picks it, on synthetic vectors."""
    import faiss

    rng = np.random.default_rng(0)
    dim, n = 384, args.synthetic
    centers = rng.standard_normal((args.synthetic_clusters, dim), dtype=np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    start = time.perf_counter()
    data = clustered_unit_vectors(n, centers, rng, args.synthetic_noise)
    queries = clustered_unit_vectors(args.synthetic_queries, centers, rng, args.synthetic_noise)
    print(f"generated {n} vectors in {time.perf_counter() - start:.1f} s")
    passages = [Passage(str(i), "", "synthetic") for i in range(n)]

    exact = faiss.IndexFlatIP(dim)
    exact.add(data)
    start = time.perf_counter()
    _, truth = exact.search(queries, 10)
    flat_ms = 1000 * (time.perf_counter() - start) / len(queries)

    policy = choose_factory(n, dim)
    index = VectorIndex(Embedder(), use_gpu=None)  # factory=None: the policy decides
    start = time.perf_counter()
    index.add(passages, data)
    build_s = time.perf_counter() - start
    print(f"policy chose {index.factory} (expected {policy}), nprobe {index.nprobe}; "
          f"train+add {build_s:.1f} s")

    index.search(queries[:10], k=100)
    start = time.perf_counter()
    batch = index.search(queries, k=100)
    batch_ms = 1000 * (time.perf_counter() - start) / len(queries)
    single_n = min(200, len(queries))
    start = time.perf_counter()
    for q in queries[:single_n]:
        index.search(q, k=100)
    single_ms = 1000 * (time.perf_counter() - start) / single_n

    recall10, recall1_at100 = _recall_vs_exact(batch, truth)
    sweep = []
    for nprobe in (1, 4, 16, 64):
        index.nprobe = nprobe
        start = time.perf_counter()
        found = index.search(queries, k=100)
        ms = 1000 * (time.perf_counter() - start) / len(queries)
        r10, r1 = _recall_vs_exact(found, truth)
        sweep.append({"nprobe": nprobe, "recall@10_vs_exact": round(r10, 4),
                      "exact_top1_in_top100": round(r1, 4), "ms_per_query_batch": round(ms, 3)})
    index.nprobe = 16
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        index.save(Path(tmp) / "idx")
        save_s = time.perf_counter() - start
        size_mb = sum(p.stat().st_size for p in (Path(tmp) / "idx").iterdir()) / 1e6
        start = time.perf_counter()
        VectorIndex.load(Path(tmp) / "idx", index.embedder)
        load_s = time.perf_counter() - start
    report = {
        **_raw_faiss_breakdown(index.factory, data, queries),
        "vectors": n,
        "dim": dim,
        "clusters": args.synthetic_clusters,
        "noise": args.synthetic_noise,
        "queries": len(queries),
        "factory": index.factory,
        "nprobe": index.nprobe,
        "train_add_s": round(build_s, 1),
        "search_ms_per_query_batch": round(batch_ms, 3),
        "search_ms_per_query_single": round(single_ms, 3),
        "flat_ms_per_query_batch": round(flat_ms, 3),
        "recall@10_vs_exact": round(recall10, 4),
        "exact_top1_in_top100": round(recall1_at100, 4),
        "nprobe_sweep": sweep,
        "save_s": round(save_s, 2),
        "load_s": round(load_s, 2),
        "index_mb": round(size_mb, 1),
        "faiss_threads": faiss.omp_get_max_threads(),
    }
    print(json.dumps(report))
    return report


def default_ivf_factories() -> list[str]:
    """The policy's formula applied below its Flat threshold: nlist = 2^floor(log2(N/39))
    = 64 for ~3.6k vectors; PQ with the paper's m = 64 and a coarser m = 16."""
    nlist = nlist_for_count(3_588)
    return [f"IVF{nlist},PQ{pq_m_for_dim(384)}", f"IVF{nlist},PQ16"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--ivf-factories", nargs="+", default=default_ivf_factories())
    parser.add_argument("--rerank-questions", type=int, default=100)
    parser.add_argument("--rerank-depth", type=int, default=20)
    parser.add_argument("--rerank-methods", nargs="*", default=["yes_no", "query_likelihood"])
    parser.add_argument("--synthetic", type=int, default=170_000)
    parser.add_argument("--synthetic-clusters", type=int, default=2_000)
    parser.add_argument("--synthetic-queries", type=int, default=1_000)
    parser.add_argument("--synthetic-noise", type=float, default=0.05)
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--only-synthetic", action="store_true")
    parser.add_argument("--embed-cache", default=tempfile.gettempdir())
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch and FAISS threads (on a shared, oversubscribed box 1 is much faster)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        import faiss
        import torch

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)

    report: dict = {"command": " ".join(sys.argv), "load_average_start": os.getloadavg()}
    if not args.only_synthetic:
        report["nq"] = nq_eval(args)
    if not args.skip_synthetic:
        report["synthetic"] = synthetic_eval(args)
    report["load_average_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

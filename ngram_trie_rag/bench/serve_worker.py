"""One method of ``bench-serve``, in its own process: one vLLM engine, every concurrency.

    python -m ngram_trie_rag.bench.serve_worker JOB.json OUT.json

``JOB.json``: ``{"model", "dtype", "method", "k", "max_new_tokens", "concurrency":
[...], "prompts": [...], "documents": [[...] | null, ...], "engine_args": {...}}``.
For each concurrency level ``c`` every prompt is sent through vLLM's ``AsyncLLM`` with
at most ``c`` in flight (a new one starts as one finishes, as c users would), and the
output ids, each request's latency, the wall time and the speculative counters
(deltas of vLLM's own Prometheus metrics) are written to ``OUT.json``.

One engine per process: vLLM's engine owns worker processes and memory that are
released most reliably by ending the process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from ..serving.server import speculative_config
from ..serving.vllm_proposer import DOCUMENTS

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def method_speculative_config(method: str, k: int) -> dict | None:
    """The ``speculative_config`` of a ``bench-serve`` method."""
    if method == "vllm":
        return None
    if method == "vllm-ngram":  # vLLM's prompt lookup, as its docs configure it
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if method == "vllm-trie":
        return speculative_config(k)
    raise ValueError(f"unknown method {method!r}; expected vllm, vllm-ngram or vllm-trie")


def _counters() -> dict[str, float]:
    from vllm.v1.metrics.reader import get_metrics_snapshot

    return {m.name: float(m.value) for m in get_metrics_snapshot() if m.name in SPEC_COUNTERS}


async def _level(engine: Any, job: dict, c: int) -> dict:
    from vllm import SamplingParams

    gate = asyncio.Semaphore(c)
    prompts, docs = job["prompts"], job["documents"]

    async def one(i: int) -> tuple[list[int], float]:
        extra = {DOCUMENTS: docs[i]} if docs[i] else None
        params = SamplingParams(max_tokens=job["max_new_tokens"], temperature=0.0,
                                extra_args=extra)
        async with gate:
            start, ids = time.perf_counter(), []
            async for out in engine.generate(prompts[i], params, request_id=f"c{c}-{i}"):
                ids = list(out.outputs[0].token_ids)
            return ids, time.perf_counter() - start

    before = _counters()
    start = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    wall = time.perf_counter() - start
    after = _counters()
    return {"concurrency": c, "wall_s": wall, "outputs": [ids for ids, _ in done],
            "latencies_s": [s for _, s in done],
            **{name: after.get(name, 0.0) - before.get(name, 0.0) for name in SPEC_COUNTERS}}


async def run(job: dict) -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=job["model"], dtype=job["dtype"], seed=0,
                           disable_log_stats=False,
                           speculative_config=method_speculative_config(job["method"], job["k"]),
                           **job.get("engine_args", {}))
    engine = AsyncLLM.from_engine_args(args)
    try:
        warm = SamplingParams(max_tokens=8, temperature=0.0)
        async for _ in engine.generate(job["prompts"][0], warm, request_id="warmup"):
            pass
        levels = [await _level(engine, job, c) for c in job["concurrency"]]
    finally:
        engine.shutdown()
    return {"method": job["method"], "levels": levels}


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    result = asyncio.run(run(job))
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""One method of ``bench-serve``, in its own process: one engine, every concurrency.

    python -m ngram_trie_rag.bench.serve_worker JOB.json OUT.json

``JOB.json``: ``{"model", "dtype", "method", "k", "max_new_tokens", "concurrency":
[...], "prompts": [...], "documents": [[...] | null, ...], "engine_args": {...}}``.
For each concurrency level ``c`` every prompt is sent with at most ``c`` in flight (a new
one starts as one finishes, as c users would), and the outputs, each request's latency,
the wall time and the speculative counters are written to ``OUT.json``:

- vLLM's methods go through vLLM's ``AsyncLLM``; the outputs are token ids and the
  counters are deltas of vLLM's own Prometheus metrics.
- The local methods (:func:`run_local`) start the local OpenAI server
  (:mod:`ngram_trie_rag.serving.local_server`, as ``serve --engine local`` runs it, with
  drafting off for ``local``) on a thread of this process and send every prompt to it over
  HTTP through :class:`~ngram_trie_rag.serving.openai_http.OpenAIHTTPBackend`, one client
  thread per request in flight; the outputs are texts (what an answer over HTTP carries)
  and the counters come from each answer's speculative stats. On a thread rather than in
  a third process: the clients only wait on their sockets, and the server's process is
  still this method's alone.

One engine per process: vLLM's engine owns worker processes and memory that are released
most reliably by ending the process, and the local engine learns its draft budget from
the requests it ran, which must not carry from one method to the next.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..decoding.options import GenerationOptions
from ..serving.openai_http import OpenAIHTTPBackend
from ..serving.server import speculative_config
from ..serving.vllm_proposer import DOCUMENTS
from .serve import PROGRESS

LOCAL_DRAFTING = {"local": "none", "local-trie": "trie"}  # method -> the server's method
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


def run_local(job: dict) -> dict:
    """A local method: the local server over the job's model, every level through HTTP."""
    from ..engine.costs import background_measure
    from ..generator import SpeculativeGenerator
    from ..serving.local_backend import choose_backend
    from ..serving.local_server import for_generator
    from .runner import measure_variants

    generator = SpeculativeGenerator.from_pretrained(job["model"], dtype=job["dtype"],
                                                     quantization=job.get("quantization"))
    # the forward variants a long-lived server settles on (measured now where it would
    # measure them between answers), then nothing may share the cores with the levels
    measure_variants(generator, calibrate=False)
    background_measure.disable()
    widest = max(job["concurrency"])
    choice = choose_backend(generator, max_batch=widest, max_queue=max(64, widest))
    engine = getattr(choice.backend, "engine", None)  # the scheduler's (not the generator's)
    compiles = engine is not None and engine.compiles
    if compiles:
        say = f"{PROGRESS} {job['method']}:"
        _log_to_stdout(say)
        print(f"{say} compiling the batched steps before timing", flush=True)
        print(f"{say} compiled in {choice.backend.warm_up():.0f} s", flush=True)
    server = for_generator(choice.backend, generator,
                           method=LOCAL_DRAFTING[job["method"]]).start()
    try:
        client = OpenAIHTTPBackend(server.url, server.model_name)
        # first-call costs (the step-cost curve, lazy set-up) out of the first level
        client.complete("Hello", None, GenerationOptions(max_new_tokens=2))
        levels = [_local_level(client, job, c) for c in job["concurrency"]]
    finally:
        server.stop()
    return {"method": job["method"], "backend": choice.name,
            "steps": "compiled" if compiles else "eager", "levels": levels}


def _log_to_stdout(prefix: str) -> None:
    """The engine's progress log (a compile's shapes and seconds) on stdout, each line
    ``prefix``-ed: the lines bench-serve shows as they come."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"{prefix} %(message)s"))
    logger = logging.getLogger("ngram_trie_rag.engine")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _local_level(client: OpenAIHTTPBackend, job: dict, c: int) -> dict:
    options = GenerationOptions(max_new_tokens=job["max_new_tokens"])
    prompts, docs = job["prompts"], job["documents"]

    def one(i: int) -> tuple[Any, float]:
        start = time.perf_counter()
        answer = client.complete(prompts[i], docs[i] or None, options)
        return answer, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=c) as pool:  # at most c in flight, in order
        done = list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    stats = [answer.speculative or {} for answer, _ in done]
    return {"concurrency": c, "wall_s": wall, "outputs": [a.text for a, _ in done],
            "output_tokens": [a.completion_tokens or 0 for a, _ in done],
            "latencies_s": [s for _, s in done],
            "accepted_tokens": sum(s.get("num_accepted_draft_tokens", 0) for s in stats),
            "drafts": sum(s.get("num_spec_steps", 0) for s in stats),
            "draft_tokens": sum(s.get("num_draft_tokens", 0) for s in stats)}


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    if job["method"] in LOCAL_DRAFTING:
        result = run_local(job)
    else:
        result = asyncio.run(run(job))
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

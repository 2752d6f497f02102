"""vLLM without speculation, with its n-gram lookup and with the trie proposer, on the
same prompts at several concurrency levels, in one run (``ngram-trie-rag bench-serve``).

Each method runs in its own process (one vLLM engine each, see :mod:`.serve_worker`)
over the same chat-templated prompts (completion prompts for a model without a chat
template), greedy, in the same order. Reported per method
and concurrency:

- ``output_tokens_per_s``: output tokens of all requests / wall time of the level;
- ``mean_latency_s`` and ``p90_latency_s`` per request, from its start to its last token;
- ``mean_accept_length``: output tokens per verification step of a request,
  ``tokens / (tokens - accepted)`` (1 for plain vLLM);
- ``exact_match_rate``: requests whose output ids equal plain vLLM's at the same level.

Written as ``{"meta": {...}, "results": [{"method", "concurrency", ...}, ...]}``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

METHODS = ("vllm", "vllm-ngram", "vllm-trie")
# Small engine limits that fit a CPU host; on a GPU pass engine_args={} or larger.
CPU_ENGINE_ARGS = {"max_model_len": 4096, "enforce_eager": True,
                   "kv_cache_memory_bytes": 2 << 30}


def run_bench_serve(data: str, *, methods: Sequence[str] = METHODS,
                    concurrency: Sequence[int] = (1, 4, 16), limit: int = 16,
                    max_new_tokens: int = 128, num_speculative_tokens: int = 8,
                    model: str | None = None, dtype: str = "float32",
                    engine_args: dict | None = None, command: str | None = None) -> dict:
    """Every method over the first ``limit`` prompts of ``data`` at each concurrency level:
    ``{"meta": {...}, "results": summarise(...)}``. ``model`` None is the packaged model;
    ``engine_args`` None is :data:`CPU_ENGINE_ARGS`; ``command`` is recorded in the meta."""
    from .data import load_items

    if limit < 1 or max_new_tokens < 1:
        raise ValueError(f"limit and max_new_tokens must be >= 1, got {limit} and "
                         f"{max_new_tokens}")
    if model is None:
        from ..loading import default_model_source

        model = default_model_source()
    items = load_items(data, limit=limit)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [_prompt_text(tokenizer, it.request(tokenizer).prompt) for it in items]
    job = {"model": model, "dtype": dtype, "k": num_speculative_tokens,
           "max_new_tokens": max_new_tokens, "concurrency": list(concurrency),
           "prompts": prompts, "documents": [it.documents for it in items],
           "engine_args": CPU_ENGINE_ARGS if engine_args is None else engine_args}
    meta = _meta(command=command, data=data, prompts=len(items),
                 max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens,
                 model=model, dtype=dtype)
    runs = {m: _run_method(job, m) for m in methods}
    meta["load_avg_end"] = os.getloadavg()
    return {"meta": meta, "results": summarise(runs)}


def _prompt_text(tokenizer, prompt: str | list[dict[str, str]]) -> str:
    """The text vLLM is sent: chat messages rendered by the chat template, a base
    model's completion prompt as it is (the choice is :meth:`BenchItem.request`'s)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


def _run_method(job: dict, method: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_text(json.dumps({**job, "method": method}))
        print(f"[bench-serve] {method} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-m", "ngram_trie_rag.bench.serve_worker",
                               str(job_path), str(out_path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{method} failed ({done.returncode}):\n"
                               + (done.stdout + done.stderr)[-4000:])
        return json.loads(out_path.read_text())


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def summarise(runs: dict[str, dict]) -> list[dict]:
    """Per method and level: throughput, latency, accepted length, exact match vs vllm."""
    plain = {lv["concurrency"]: lv["outputs"] for lv in runs.get("vllm", {}).get("levels", [])}
    rows = []
    for method, run in runs.items():
        for lv in run["levels"]:
            tokens = sum(len(ids) for ids in lv["outputs"])
            accepted = lv.get("vllm:spec_decode_num_accepted_tokens", 0.0)
            ref = plain.get(lv["concurrency"])
            same = (None if ref is None else
                    sum(a == b for a, b in zip(lv["outputs"], ref, strict=True)) / len(ref))
            rows.append({
                "method": method, "concurrency": lv["concurrency"],
                "output_tokens_per_s": tokens / lv["wall_s"],
                "mean_latency_s": statistics.fmean(lv["latencies_s"]),
                "p90_latency_s": _p90(lv["latencies_s"]),
                "mean_accept_length": tokens / max(tokens - accepted, 1.0),
                "exact_match_rate": same,
                "output_tokens": tokens, "wall_s": lv["wall_s"],
                "drafts": lv.get("vllm:spec_decode_num_drafts", 0.0),
                "draft_tokens": lv.get("vllm:spec_decode_num_draft_tokens", 0.0),
                "accepted_tokens": accepted,
            })
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table, with tokens/s also as a ratio to plain vLLM at the same level."""
    base = {r["concurrency"]: r["output_tokens_per_s"] for r in rows if r["method"] == "vllm"}
    lines = ["| method | concurrency | output tok/s | vs vllm | mean latency s | p90 latency s "
             "| accept length | exact |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["method"])):
        ratio = base.get(r["concurrency"])
        exact = "-" if r["exact_match_rate"] is None else f"{r['exact_match_rate']:.0%}"
        vs = "-" if not ratio else f"{r['output_tokens_per_s'] / ratio:.2f}x"
        lines.append(
            f"| {r['method']} | {r['concurrency']} | {r['output_tokens_per_s']:.1f} | {vs} | "
            f"{r['mean_latency_s']:.2f} | {r['p90_latency_s']:.2f} | "
            f"{r['mean_accept_length']:.2f} | {exact} |")
    return "\n".join(lines)


def _meta(*, command: str | None, data: str, prompts: int, max_new_tokens: int,
          num_speculative_tokens: int, model: str, dtype: str) -> dict:
    import vllm

    return {"command": command, "data": data,
            "prompts": prompts, "max_new_tokens": max_new_tokens,
            "num_speculative_tokens": num_speculative_tokens, "model": model,
            "dtype": dtype, "vllm": vllm.__version__, "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()}

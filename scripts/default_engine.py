"""Does a wrapper built with no engine setting reach the compiled engine on its own, and
what does it gain? And does a second process on the same machine start compiled soon?

First process: a LangChain ``ChatNGramTrie()`` with default settings answers Spec-Bench
RAG prompts in turn (the packaged model, fp32 on a CPU) until an answer reports
``engine == "compiled"`` in ``response_metadata["speculative"]``; every answer's engine,
decode seconds and time since the start are printed. Then each prompt is answered by it
and by ``ChatNGramTrie(engine="eager")`` in the same process: decode tokens per second of
each, and whether the tokens are the same.

Second process (started by the first once it is done, as a user's next run would be): a
default ``ChatNGramTrie()`` answers the prompts in turn until one runs compiled; printed
with the seconds since that process was started. It shares the first's Inductor cache
folder, as processes on one machine do: on a CPU the portable compile caches of the store
carry the generated code but not the C++ builds, which torch keeps in that folder.

    .venv/bin/python scripts/default_engine.py --limit 8 --max-new-tokens 128
    .venv/bin/python scripts/default_engine.py --device cuda --dtype bfloat16   # on a GPU

On a CPU ``auto`` stays eager unless ``NGRAM_TRIE_RAG_AUTO_ENGINE=compiled`` is set (it
measured no faster there: this script is how); set it to measure a CPU.

Prints the figures; exits 1 when an answer differs between the engines. Set
``NGRAM_TRIE_RAG_CACHE`` to a fresh folder to measure a machine that never compiled.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

START = time.time()


def prompts(limit: int) -> list[str]:
    from ngram_trie_rag.util.cache_paths import data_dir

    rows = [json.loads(line) for line in (data_dir() / "spec_bench" / "rag.jsonl")
            .read_text().splitlines() if line.strip()]
    return [row["turns"][0] for row in rows[:limit]]


def answer(llm, prompt: str) -> dict:
    """One answer's engine, decode seconds, new tokens and text."""
    out = llm.invoke([("user", prompt)])
    spec = out.response_metadata["speculative"]
    return {"engine": spec["engine"], "decode_s": spec["decode_s"],
            "tokens": out.usage_metadata["output_tokens"], "text": out.content}


def until_compiled(llm, texts: list[str], wait_s: float, since: float,
                   think_s: float = 0.0) -> dict[int, list]:
    """Answer ``texts`` in turn, ``think_s`` seconds apart (a user reading the answer),
    until one runs compiled; the eager answers' (tokens, decode seconds) by prompt, all
    but the first (no compile ran beside it)."""
    i, beside = 0, {}
    while True:
        if i:
            time.sleep(think_s)
        got = answer(llm, texts[i % len(texts)])
        if got["engine"] == "eager" and i:
            beside.setdefault(i % len(texts), []).append((got["tokens"], got["decode_s"]))
        i += 1
        print(f"  answer {i:>3}: {got['engine']:>8}  decode {got['decode_s']:6.2f} s  "
              f"{got['tokens']:>4} tokens  at {time.time() - since:7.1f} s", flush=True)
        if got["engine"] == "compiled" or time.time() - since > wait_s:
            return beside


def first(args: argparse.Namespace) -> int:
    from langchain_ngram_trie import ChatNGramTrie

    from ngram_trie_rag.commands.cli import show_compile_progress

    show_compile_progress()  # each step shape compiled, with seconds, on stderr
    texts = prompts(args.limit)
    where = {"device": args.device, "dtype": args.dtype}
    auto = ChatNGramTrie(max_tokens=args.max_new_tokens, **where)
    eager = ChatNGramTrie(max_tokens=args.max_new_tokens, engine="eager", **where)
    print(f"first process: a default ChatNGramTrie answers {len(texts)} Spec-Bench RAG "
          "prompts in turn until one runs compiled", flush=True)
    beside = until_compiled(auto, texts, args.wait, START, args.think)
    print("\nthe same prompts on both, in this process:")
    print(f"{'prompt':>6} {'default engine':>14} {'tok/s':>7} {'eager tok/s':>11} {'same':>5}")
    tokens = {"auto": 0, "eager": 0}
    seconds = {"auto": 0.0, "eager": 0.0}
    differ = 0
    alone: dict[int, float] = {}  # prompt -> eager tok/s with nothing compiling
    for i, text in enumerate(texts):
        a, e = answer(auto, text), answer(eager, text)
        alone[i] = e["tokens"] / e["decode_s"]
        assert e["engine"] == "eager"
        same = a["text"] == e["text"]
        differ += not same
        for name, got in (("auto", a), ("eager", e)):
            tokens[name] += got["tokens"]
            seconds[name] += got["decode_s"]
        print(f"{i:>6} {a['engine']:>14} {a['tokens'] / a['decode_s']:7.1f} "
              f"{e['tokens'] / e['decode_s']:11.1f} {'yes' if same else 'NO':>5}", flush=True)
    rate = {k: tokens[k] / seconds[k] for k in tokens}
    print(f"\ndecode: default {rate['auto']:.1f} tok/s, eager {rate['eager']:.1f} tok/s: "
          f"{rate['auto'] / rate['eager']:.2f}x; {len(texts) - differ}/{len(texts)} answers "
          "the same", flush=True)
    slower = [alone[i] / (t / s) for i, runs in beside.items() for t, s in runs]
    if slower:
        slower.sort()
        print(f"eager answers while the compile ran: {len(slower)}, each slower than the same "
              f"prompt's eager answer with nothing compiling by {slower[len(slower) // 2]:.2f}x "
              f"(median), {slower[-1]:.2f}x at most", flush=True)
    if not args.no_second:
        print("\nsecond process on this machine:", flush=True)
        cmd = [sys.executable, __file__, "--second", "--limit", str(args.limit),
               "--max-new-tokens", str(args.max_new_tokens), "--wait", str(args.wait),
               "--think", str(args.think)]
        cmd += [f"--{k}={v}" for k, v in (("device", args.device), ("dtype", args.dtype)) if v]
        subprocess.run(cmd, check=True)
    return 1 if differ else 0


def second(args: argparse.Namespace) -> int:
    from langchain_ngram_trie import ChatNGramTrie

    from ngram_trie_rag.commands.cli import show_compile_progress

    show_compile_progress()
    print(f"  imports done at {time.time() - START:.1f} s", flush=True)
    llm = ChatNGramTrie(max_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype)
    until_compiled(llm, prompts(args.limit), args.wait, START, args.think)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=8, help="Spec-Bench RAG prompts (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--wait", type=float, default=3600.0,
                   help="seconds to wait for a compiled answer at most")
    p.add_argument("--think", type=float, default=0.0,
                   help="seconds between answers while waiting for the compiled engine (a "
                   "user reading; the compile runs at the lowest priority, so answers back "
                   "to back leave it little; default 0)")
    p.add_argument("--device", default=None, help="cpu, cuda... (default: the wrapper's)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16... (default: the wrapper's)")
    p.add_argument("--second", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-second", action="store_true", help="skip the second process")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return second(args) if args.second else first(args)


if __name__ == "__main__":
    sys.exit(main())

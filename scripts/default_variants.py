"""Does a wrapper built with no settings reach the measured forward variants on its own?

A LangChain ``ChatNGramTrie()`` with default settings (the packaged model, fp32 on a CPU)
answers one Spec-Bench RAG prompt (its first answer: that starts the background
measurement of the forward variants, paused while it answers), then every prompt back to
back (pass A: the probed curve's stock variants, the measurement paused), then idles
until the measurement has been taken, then answers every prompt again (pass B: the
measured variants). Printed: the curve before and after, the seconds of idle time the
measurement needed, decode tokens per second of each pass (the wrapper's own reported
decode seconds) and whether every answer's tokens are the same in both passes.

    NGRAM_TRIE_RAG_CACHE=$(mktemp -d) .venv/bin/python scripts/default_variants.py --limit 8

Set ``NGRAM_TRIE_RAG_CACHE`` to a fresh folder: with a curve stored by an earlier run or
``calibrate`` there is nothing to measure. Exits 1 when an answer differs between passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def prompts(limit: int) -> list[str]:
    from ngram_trie_rag.util.cache_paths import data_dir

    rows = [json.loads(line) for line in (data_dir() / "spec_bench" / "rag.jsonl")
            .read_text().splitlines() if line.strip()]
    return [row["turns"][0] for row in rows[:limit]]


def answer_all(llm, texts: list[str]) -> tuple[list[str], float, int]:
    """Every prompt in turn: the answers, decode seconds and new tokens in all."""
    outs, seconds, tokens = [], 0.0, 0
    for text in texts:
        out = llm.invoke([("user", text)])
        outs.append(out.content)
        seconds += out.response_metadata["speculative"]["decode_s"]
        tokens += out.usage_metadata["output_tokens"]
    return outs, seconds, tokens


def describe(curve) -> str:
    chosen = {q: lay for q, lay in sorted(curve.layouts.items())}
    return (f"source={curve.source} variants_chosen={curve.variants_chosen} "
            f"layouts={chosen or 'stock'} packed_plain_step={curve.pack_single}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=8, help="Spec-Bench RAG prompts (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--wait", type=float, default=600.0,
                   help="the longest idle wait for the measurement, seconds")
    args = p.parse_args()
    from langchain_ngram_trie import ChatNGramTrie

    from ngram_trie_rag.engine.costs import background_measure

    texts = prompts(args.limit)
    llm = ChatNGramTrie(max_tokens=args.max_new_tokens)
    llm.invoke([("user", texts[0])])  # the first answer: the process answers more
    engine = llm.active_backend.generator.engine
    print("after the first answer:", describe(engine.curve), flush=True)
    print("measuring process:", background_measure.running(), flush=True)
    before, seconds_a, tokens_a = answer_all(llm, texts)
    print(f"pass A: {tokens_a} tokens in {seconds_a:.2f} s decode = "
          f"{tokens_a / seconds_a:.1f} tok/s; {describe(engine.curve)}", flush=True)
    idle = time.perf_counter()
    while not engine.curve.variants_chosen:
        if time.perf_counter() - idle > args.wait or not background_measure.running():
            time.sleep(0.5)  # the last adoption step runs after the process has ended
            if not engine.curve.variants_chosen:
                print("the measurement did not finish (see the log)", file=sys.stderr)
                return 2
        time.sleep(0.1)
    print(f"idle {time.perf_counter() - idle:.1f} s until adopted: {describe(engine.curve)}",
          flush=True)
    after, seconds_b, tokens_b = answer_all(llm, texts)
    same = sum(a == b for a, b in zip(before, after, strict=True))
    print(f"pass B: {tokens_b} tokens in {seconds_b:.2f} s decode = "
          f"{tokens_b / seconds_b:.1f} tok/s", flush=True)
    print(f"B/A decode speed: {(tokens_b / seconds_b) / (tokens_a / seconds_a):.2f}x; "
          f"same answers {same}/{len(texts)}")
    return 0 if same == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())

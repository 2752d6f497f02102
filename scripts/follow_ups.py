"""Follow-up questions over the same documents: does drafting from earlier answers help?

For the first ``--limit`` HAGRID rows, three related questions per row over the row's
documents (the question; "In one or two sentences: <question>"; "<question> Answer
again, citing the passage."), answered in order with the packaged model in fp32 and
the benchmark's RAG prompt, three ways:

- ``plain``: ``method="none"``, one token per forward: the reference output;
- ``per-request``: the trie of each request's documents and its own answer (the default);
- ``answer store``: the same, plus the earlier answers of the row's set, one
  :class:`~ngram_trie_rag.AnswerStore` per document set.

Per variant it prints the mean accepted length (tokens per verification step, pooled
over every step), decode tokens/s (prefill excluded) and exact match against
``plain``; then the store's gain in accepted length over the per-request trie, over all
questions and over the 2nd and 3rd of each set only (the first has an empty store).

    python scripts/follow_ups.py --limit 4 --max-new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import islice
from pathlib import Path

from ngram_trie_rag import AnswerStore, GenerationResult, SpeculativeGenerator
from ngram_trie_rag.bench.data import split_context
from ngram_trie_rag.prompts import rag_messages
from ngram_trie_rag.util.cache_paths import data_dir

DATA = data_dir()
VARIANTS = ("plain", "per-request", "answer store")


def related_questions(question: str) -> list[str]:
    """The question, a paraphrase and a follow-up: answers that repeat each other."""
    return [question, f"In one or two sentences: {question}",
            f"{question} Answer again, citing the passage."]


def document_sets(path: Path, limit: int) -> list[tuple[list[str], list[str]]]:
    """``(documents, questions)`` for the first ``limit`` rows of a HAGRID JSONL file."""
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in islice((ln for ln in f if ln.strip()), limit)]
    return [(split_context(r["context"]), related_questions(r["question"])) for r in rows]


def record(row: int, position: int, variant: str, result: GenerationResult,
           reference: GenerationResult) -> dict:
    """One answer's counters; decode tokens exclude prefill's token (as ``decode_s``)."""
    stats = result.stats
    return {"row": row, "question": position, "variant": variant,
            "accepted": sum(stats.accept_lengths), "steps": stats.steps,
            "decode_s": stats.decode_s, "tokens": len(result.token_ids),
            "store_answers": stats.store_answers,
            "exact": result.token_ids == reference.token_ids}


def summarise(records: list[dict], variant: str, follow_ups_only: bool = False) -> dict:
    """Pooled accepted length, decode tokens/s and exact-match rate of one variant."""
    mine = [r for r in records if r["variant"] == variant
            and (r["question"] >= 1 or not follow_ups_only)]
    accepted = sum(r["accepted"] for r in mine)
    steps = sum(r["steps"] for r in mine)
    seconds = sum(r["decode_s"] for r in mine)
    return {"answers": len(mine), "accept_length": accepted / steps if steps else 0.0,
            "decode_tok_s": accepted / seconds if seconds else 0.0,
            "exact": sum(r["exact"] for r in mine) / len(mine) if mine else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path,
                        default=DATA / "hagrid" / "hagrid.jsonl")
    parser.add_argument("--limit", type=int, default=12, help="document sets (HAGRID rows)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sets = document_sets(args.data, args.limit)
    base = SpeculativeGenerator.from_pretrained(dtype="float32")
    gens = {"per-request": base, "answer store": base.reshaped()}  # a budget each
    records: list[dict] = []
    start = time.perf_counter()
    for row, (docs, questions) in enumerate(sets):
        store = AnswerStore()  # one scope per document set
        for position, question in enumerate(questions):
            messages = rag_messages(docs, question)
            ref = base.generate(messages, docs, max_new_tokens=args.max_new_tokens,
                                method="none")
            records.append(record(row, position, "plain", ref, ref))
            for variant, gen in gens.items():
                res = gen.generate(messages, docs, max_new_tokens=args.max_new_tokens,
                                   answer_store=store if variant == "answer store" else None)
                records.append(record(row, position, variant, res, ref))
    wall = time.perf_counter() - start

    summary = {v: summarise(records, v) for v in VARIANTS}
    follow = {v: summarise(records, v, follow_ups_only=True) for v in VARIANTS}
    print(f"{len(sets)} document sets x 3 questions, {args.max_new_tokens} new tokens, fp32, "
          f"torch threads {torch.get_num_threads()}, {wall:.0f} s")
    print(f"{'variant':<14} {'accept len':>10} {'2nd+3rd':>8} {'decode tok/s':>12} "
          f"{'exact':>6}")
    for v in VARIANTS:
        s, f = summary[v], follow[v]
        print(f"{v:<14} {s['accept_length']:>10.3f} {f['accept_length']:>8.3f} "
              f"{s['decode_tok_s']:>12.1f} {s['exact']:>6.0%}")
    ratios = {
        "accept_length": _ratio(summary, "accept_length"),
        "accept_length_2nd_3rd": _ratio(follow, "accept_length"),
        "decode_tok_s": _ratio(summary, "decode_tok_s"),
    }
    print(f"answer store / per-request: accept length {ratios['accept_length']:.3f}x "
          f"(2nd and 3rd questions: {ratios['accept_length_2nd_3rd']:.3f}x), "
          f"decode tok/s {ratios['decode_tok_s']:.3f}x")
    if args.out:
        args.out.write_text(json.dumps({
            "settings": {"limit": len(sets), "max_new_tokens": args.max_new_tokens,
                         "threads": torch.get_num_threads(), "dtype": "float32",
                         "data": str(args.data), "wall_s": wall},
            "summary": summary, "follow_ups": follow, "ratios": ratios,
            "answers": records}, indent=1))
        print(f"wrote {args.out}")


def _ratio(table: dict, key: str) -> float:
    """answer store over per-request for one column (0 when the baseline is 0)."""
    base = table["per-request"][key]
    return table["answer store"][key] / base if base else 0.0


if __name__ == "__main__":
    main()

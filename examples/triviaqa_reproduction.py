#!/usr/bin/env python
"""The paper's TriviaQA pipeline end to end: retrieve -> rerank -> speculative generation.

For every question: embed it, take the top ``--top-k`` passages from a FAISS index of the
corpus, rerank them to the top ``--top-n`` (5), answer from those passages twice in the
same process -- plain greedy ``model.generate`` and n-gram trie speculation drafted from
the five passages -- and report answer exact match, mean accepted length and speedup.

The paper: bge-m3 embeddings, FAISS IVF4096,PQ64 with nprobe 16, top-100,
bge-reranker-v2-m3 to the top-5, over DPR's Wikipedia. With those available::

    python examples/triviaqa_reproduction.py --questions triviaqa-dev.jsonl \\
        --corpus psgs_w100.tsv --embedder BAAI/bge-m3 --factory IVF4096,PQ64 --nprobe 16 \\
        --reranker cross-encoder:BAAI/bge-reranker-v2-m3 --index-dir dpr-index

Offline (the default here): NQ-open questions over ``wiki_passages`` plus each question's
gold passage, the packaged MiniLM embedder, an index chosen for the corpus size, and the
packaged SmolLM2 as both reranker (query likelihood) and generator::

    python examples/triviaqa_reproduction.py --limit 50

Question files: JSON lines (optionally .gz) with ``question`` and ``answers`` (NQ-open) or
``answer: {value, aliases}`` (TriviaQA as on the Hugging Face hub), or the official
TriviaQA JSON (``{"Data": [{"Question", "Answer": {"Value", "Aliases"}}]}``). Corpus files:
DPR's TSV (``id, text, title``) or JSON lines with ``contents`` ("title\\ntext"), or
``title`` + ``text``.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import time
from pathlib import Path

import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.methods import measure_prefill, run_core, run_vanilla
from ngram_trie_rag.prompts import rag_request
from ngram_trie_rag.retrieval import (
    CrossEncoderReranker,
    Embedder,
    LLMReranker,
    Passage,
    Retriever,
    VectorIndex,
)
from ngram_trie_rag.retrieval.corpus import PassageCorpus
from ngram_trie_rag.retrieval.jsonl import read_jsonl
from ngram_trie_rag.util.cache_paths import data_dir

DEFAULT_QUESTIONS = data_dir() / "nq_open" / "nq-open-oracle.jsonl.gz"
DEFAULT_CORPUS = data_dir() / "wiki_passages" / "passages.jsonl"
# Appended to each question: EM needs a short answer, not a paragraph.
SHORT_ANSWER = " Answer with a few words only."


# ---- data ---------------------------------------------------------------------------
def read_questions(path: Path) -> list[dict]:
    """Rows ``{question, answers, gold}``; ``gold`` is a passage dict or None."""
    if not path.is_file():
        sys.exit(f"error: {path} does not exist")
    try:
        if path.suffix == ".json":
            rows = json.loads(path.read_text(encoding="utf-8"))["Data"]
        else:
            rows = [row for _, row in read_jsonl(path)]
    except ValueError as err:  # a line that is not JSON names its file and line
        sys.exit(f"error: {err}")
    out = []
    for i, row in enumerate(rows):
        question = row.get("question") or row.get("Question")
        answer = row.get("answer") or row.get("Answer")
        if isinstance(answer, dict):
            answers = [answer.get("value") or answer.get("Value"),
                       *(answer.get("aliases") or answer.get("Aliases") or [])]
        else:
            answers = row.get("answers")
        if not isinstance(question, str) or not answers:
            sys.exit(f"error: {path} row {i}: needs 'question' and 'answers' (or 'answer': "
                     "{value, aliases})")
        ctxs = row.get("ctxs") or []
        gold = ctxs[0] if ctxs and isinstance(ctxs[0], dict) else None
        out.append({"question": question, "answers": [a for a in answers if a], "gold": gold})
    return out


def build_corpus(paths: list[Path], questions: list[dict], add_gold: bool) -> list[Passage]:
    """Corpus passages ("title\\ntext"), deduplicated on the text; each question's gold
    passage is added (and its id recorded in ``q["gold_id"]``) when ``add_gold``, and
    otherwise recorded only when the corpus already holds it."""
    corpus = PassageCorpus()
    for path in paths:
        try:
            corpus.add_file(path)
        except (FileNotFoundError, ValueError) as err:
            sys.exit(f"error: {err}")
    for i, q in enumerate(questions):
        gold = q["gold"]
        q["gold_id"] = None
        if gold is not None:
            q["gold_id"] = (corpus.add(f"gold:{i}", gold.get("title", ""), gold["text"], "gold")
                            if add_gold else corpus.id_of(gold["text"]))
    return corpus.passages


# ---- answers ------------------------------------------------------------------------
def normalize(text: str) -> str:
    """SQuAD/TriviaQA answer normalisation: lower case, no punctuation, articles or
    extra white space."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def short_answer(text: str) -> str:
    """The answer's first line, first sentence: what EM is computed on."""
    line = text.strip().split("\n")[0]
    return re.split(r"(?<=[.!?])\s", line)[0]


def exact_match(prediction: str, answers: list[str]) -> bool:
    return normalize(short_answer(prediction)) in {normalize(a) for a in answers}


def contains_answer(prediction: str, answers: list[str]) -> bool:
    pred = f" {normalize(prediction)} "
    return any(f" {normalize(a)} " in pred for a in answers if normalize(a))


# ---- pipeline -----------------------------------------------------------------------
def make_reranker(spec: str, gen: SpeculativeGenerator):
    if spec == "none":
        return None
    if spec == "llm":  # the generator's own model scores passages: no second model
        return LLMReranker(gen.model, gen.tokenizer, method="query_likelihood")
    if spec.startswith("cross-encoder:"):
        return CrossEncoderReranker(spec.split(":", 1)[1])
    sys.exit(f"error: --reranker must be none, llm or cross-encoder:NAME, not {spec!r}")


def load_or_build_index(args: argparse.Namespace, passages: list[Passage]) -> VectorIndex:
    embedder = Embedder(args.embedder)
    if args.index_dir and (Path(args.index_dir) / "manifest.json").is_file():
        index = VectorIndex.load(args.index_dir, embedder)
        if [p.text for p in index.passages] == [p.text for p in passages]:
            print(f"loaded index {args.index_dir}: {index!r}", file=sys.stderr)
            return index
        print("saved index does not match the corpus; rebuilding", file=sys.stderr)
    index = VectorIndex(embedder, factory=args.factory, nprobe=args.nprobe)
    start = time.perf_counter()
    index.add(passages, progress=True)
    print(f"indexed {len(passages)} passages in {time.perf_counter() - start:.1f} s: "
          f"{index!r}", file=sys.stderr)
    if args.index_dir:
        index.save(args.index_dir)
    return index


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    # Every question's gold passage joins the corpus (the evaluated ones face the others'
    # as distractors); then the first --limit questions are asked.
    questions = read_questions(Path(args.questions))
    corpus = build_corpus([Path(p) for p in args.corpus], questions, not args.no_gold)
    questions = questions[: args.limit]
    gen = SpeculativeGenerator.from_pretrained(args.model, dtype=args.dtype)
    reranker = make_reranker(args.reranker, gen)
    index = load_or_build_index(args, corpus)
    retriever = Retriever(index, reranker=reranker, top_k=args.top_k, top_n=args.top_n)

    records = []
    for i, q in enumerate(questions):
        start = time.perf_counter()
        passages = retriever.retrieve(q["question"])
        retrieve_s = time.perf_counter() - start
        docs = [p.text for p in passages]
        # A chat message, or a completion prompt for a model without a chat template
        # (its run-on past the answer is cut by ``short_answer``'s first line).
        request = rag_request(gen.tokenizer, docs, q["question"] + SHORT_ANSWER)
        ids = gen.encode_prompt(request.prompt)
        if i == 0:  # warm both paths once, untimed
            run_vanilla(gen, ids, 4, 0.0)
            run_core(gen, ids, docs, 4, "trie")
        prefill = measure_prefill(gen, ids)
        # Alternate the order so neither method always runs on a warmer cache.
        if i % 2:
            trie = run_core(gen, ids, docs, args.max_new_tokens, "trie")
            plain = run_vanilla(gen, ids, args.max_new_tokens, prefill)
        else:
            plain = run_vanilla(gen, ids, args.max_new_tokens, prefill)
            trie = run_core(gen, ids, docs, args.max_new_tokens, "trie")
        answer = gen.tokenizer.decode(trie.token_ids, skip_special_tokens=True)
        records.append({
            "question": q["question"], "answers": q["answers"], "prediction": answer.strip(),
            "em": exact_match(answer, q["answers"]),
            "contains": contains_answer(answer, q["answers"]),
            "gold_in_top_n": None if q["gold_id"] is None
            else q["gold_id"] in {p.id for p in passages},
            "identical": trie.token_ids == plain.token_ids,
            "retrieve_s": retrieve_s, "new_tokens": trie.new_tokens,
            "vanilla_s": plain.total_s, "vanilla_decode_s": plain.decode_s,
            "trie_s": trie.total_s, "trie_decode_s": trie.decode_s,
            "trie_steps": len(trie.accept_lengths or []),
            "trie_accepted": sum(trie.accept_lengths or []),
        })
        r = records[-1]
        print(f"[{i + 1}/{len(questions)}] em={int(r['em'])} "
              f"AL={r['trie_accepted'] / max(r['trie_steps'], 1):.2f} "
              f"x{r['vanilla_s'] / r['trie_s']:.2f} {q['question'][:50]!r} -> "
              f"{short_answer(answer)[:40]!r}", file=sys.stderr)
    return summarize(args, records)


def summarize(args: argparse.Namespace, records: list[dict]) -> dict:
    def total(key: str) -> float:
        return sum(r[key] for r in records)

    n = len(records)
    golds = [r["gold_in_top_n"] for r in records if r["gold_in_top_n"] is not None]
    return {
        "questions": n,
        "answer_exact_match": total("em") / n,
        "answer_contains_gold": total("contains") / n,
        f"gold_passage_recall@{args.top_n}": sum(golds) / len(golds) if golds else None,
        "mean_accept_length": total("trie_accepted") / max(total("trie_steps"), 1),
        "speedup_end_to_end": total("vanilla_s") / total("trie_s"),
        "speedup_decode": total("vanilla_decode_s") / total("trie_decode_s"),
        "identical_to_greedy": total("identical") / n,
        "retrieve_rerank_s_per_question": total("retrieve_s") / n,
        "new_tokens_per_question": total("new_tokens") / n,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    p.add_argument("--corpus", nargs="+", default=[str(DEFAULT_CORPUS)])
    p.add_argument("--no-gold", action="store_true",
                   help="do not add the question file's gold passages (ctxs[0]) to the corpus")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--embedder", default=None, help="sentence-transformers name or folder")
    p.add_argument("--factory", default=None, help="FAISS factory; default: chosen by size")
    p.add_argument("--nprobe", type=int, default=None)
    p.add_argument("--index-dir", default=None, help="save the index here / reuse it")
    p.add_argument("--reranker", default="llm", help="none, llm, or cross-encoder:NAME")
    p.add_argument("--top-k", type=int, default=100, help="passages retrieved and reranked")
    p.add_argument("--top-n", type=int, default=5, help="passages kept for the answer")
    p.add_argument("--model", default=None, help="causal LM folder; default: packaged")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="write the summary and records as JSON")
    args = p.parse_args(argv)
    if args.limit < 1 or args.top_k < args.top_n or args.top_n < 1:
        p.error("need --limit >= 1 and --top-k >= --top-n >= 1")
    report = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("records", "settings")},
                     indent=1))
    return 0 if report["identical_to_greedy"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())

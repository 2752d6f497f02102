"""`ngram-trie-rag demo`: one RAG answer over the bundled documents, with its speedup.

Retrieves passages for a question with the packaged MiniLM embeddings, then answers
twice in the same process -- plain greedy ``model.generate`` and n-gram trie
speculation drafted from the retrieved passages -- and prints the answer, the
accepted length, the speedup and whether the tokens are identical.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

DEFAULT_QUESTION = "How does the n-gram trie choose which draft tokens to verify?"


def sample_docs_dir() -> Path:
    """The bundled sample documents (shipped inside the package)."""
    return Path(__file__).resolve().parents[1] / "sample_docs"


def run_demo(question: str = DEFAULT_QUESTION, max_new_tokens: int = 128,
             dtype: str | None = None, top_n: int = 3) -> int:
    from ..generator import SpeculativeGenerator
    from ..prompts import rag_messages
    from ..reference import greedy_reference
    from ..retrieval import Retriever

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say("Loading the packaged model (SmolLM2-135M-Instruct) ...")
    gen = SpeculativeGenerator.from_pretrained(dtype=dtype)
    say(f"Indexing the bundled documents in {sample_docs_dir()} ...")
    retriever = Retriever.build(sample_docs_dir(), progress=False, top_n=top_n)
    passages = retriever.retrieve(question)
    docs = [p.text for p in passages]
    messages = rag_messages(docs, question)
    ids = gen.encode_prompt(messages)

    # Warm up both paths once so neither pays one-off costs in the timed runs.
    greedy_reference(gen.model, ids, 4)
    gen.generate(messages, docs, max_new_tokens=4)

    start = time.perf_counter()
    plain = greedy_reference(gen.model, ids, max_new_tokens)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    result = gen.generate(messages, docs, max_new_tokens=max_new_tokens)
    spec_s = time.perf_counter() - start

    stats = result.stats
    print(f"\nQuestion: {question}\n")
    print("Retrieved:")
    for p in passages:
        preview = " ".join(p.text.split())[:70]
        print(f"  [{p.score:.2f}] {Path(p.source).name}: {preview}...")
    print(f"\nAnswer:\n{result.text.strip()}\n")
    plain_decode = plain_s - stats.prefill_s
    print(f"tokens: {len(result.token_ids)}  steps: {stats.steps}  "
          f"mean accepted length: {stats.mean_accept_length:.2f}")
    print(f"plain greedy: {plain_s:.2f} s   n-gram trie: {spec_s:.2f} s   "
          f"speedup: {plain_s / spec_s:.2f}x end to end, "
          f"{plain_decode / max(stats.decode_s, 1e-9):.2f}x decode")
    same = plain == result.token_ids
    print(f"identical to plain greedy: {'yes' if same else 'NO'}")
    return 0 if same else 1

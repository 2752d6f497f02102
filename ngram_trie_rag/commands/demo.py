"""`ngram-trie-rag demo`: one RAG answer over the bundled documents, with its speed-ups.

Retrieves passages for a question with the packaged MiniLM embeddings, then answers it
four ways in the same process: plain greedy ``model.generate``, this library's engine
without drafts, its prompt-lookup chain, and n-gram trie speculation drafted from the
retrieved passages. It prints the answer, the retrieved passages, and per method the
time, the accepted length, the speed-up and whether the tokens are identical. The
headline is the speed-up of the library's default method, the n-gram trie, over plain
``generate`` with the answer token-identical; the trie against the chain is reported as
a tie when the two are within run-to-run noise (``TIE``), with the reason.

Every method stops at the first repeated 12-gram (the repetition stop): a small model
can loop on a sentence to the token limit, and copying that loop would make a fast but
useless answer. The stopped answer is a prefix of the greedy one, so the methods still
compare token for token.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..decoding.repetition import DEFAULT_N
from .arguments import add_model_flags, positive_int
from .ask import add_repetition_flags

DEFAULT_QUESTION = "What is in the box of the Aurora K3?"
# The packaged 135M model answers best from the one best passage: given three, it
# often answers from the wrong one (docs/limitations.md).
TOP_N = 1
REPETITION_STOP = DEFAULT_N  # n: stop before the answer's first repeated n-gram
# Two end-to-end timings of one short answer differ by several percent from run to run
# on a shared CPU: a ratio closer to 1 than this is a tie, not a win or a loss.
TIE = 0.10
METHODS = {"none": "engine, no drafts", "chain": "prompt-lookup chain", "trie": "n-gram trie"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``demo`` on an ``add_subparsers()`` object."""
    demo = subparsers.add_parser("demo", help="answer a question over the bundled documents")
    demo.add_argument("--question", default=None)
    demo.add_argument("--max-new-tokens", type=positive_int, default=128)
    add_model_flags(demo)
    add_repetition_flags(demo)
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    question = DEFAULT_QUESTION if args.question is None else args.question
    return run_demo(question, args.max_new_tokens, args.dtype, model=args.model,
                    device=args.device, repetition_stop=args.repetition_stop)


def sample_docs_dir() -> Path:
    """The bundled sample documents (shipped inside the package)."""
    return Path(__file__).resolve().parents[1] / "sample_docs"


def run_demo(question: str = DEFAULT_QUESTION, max_new_tokens: int = 128,
             dtype: str | None = None, top_n: int = TOP_N, *, model: str | None = None,
             device: str | None = None,
             repetition_stop: int | None = REPETITION_STOP) -> int:
    from ..generator import SpeculativeGenerator
    from ..prompts import rag_messages
    from ..reference import greedy_reference
    from ..retrieval import Retriever

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"Loading {model or 'the packaged model (SmolLM2-135M-Instruct)'} ...")
    from ..engine.costs import background_measure

    # eager, nothing measured in the background: a one-shot process never collects what
    # compiling costs (see engine.auto), and its plain generate runs share no lock
    background_measure.disable()
    gen = SpeculativeGenerator.from_pretrained(model, device=device, dtype=dtype, engine="eager")
    gen.engine.reuse_prefixes(False)  # each method prefills the whole prompt, as generate
    say(f"Indexing the bundled documents in {sample_docs_dir()} ...")
    retriever = Retriever.build(sample_docs_dir(), progress=False, top_n=top_n)
    passages = retriever.retrieve(question)
    docs = [p.text for p in passages]
    messages = rag_messages(docs, question)
    ids = gen.encode_prompt(messages)
    n = repetition_stop

    # Warm up every path once so none pays one-off costs in the timed runs.
    greedy_reference(gen.model, ids, 4, repetition_stop=n)
    for method in METHODS:
        gen.generate(messages, docs, max_new_tokens=4, method=method)

    start = time.perf_counter()
    reference = greedy_reference(gen.model, ids, max_new_tokens, repetition_stop=n)
    generate_s = time.perf_counter() - start
    results = {}
    for method in METHODS:
        start = time.perf_counter()
        results[method] = (gen.generate(messages, docs, max_new_tokens=max_new_tokens,
                                        method=method, repetition_stop=n),
                           time.perf_counter() - start)

    answer = results["trie"][0]
    print(f"\nQuestion: {question}\n")
    print("Retrieved:")
    for p in passages:
        preview = " ".join(p.text.split())[:70]
        print(f"  [{p.score:.2f}] {Path(p.source).name}: {preview}...")
    print(f"\nAnswer:\n{answer.text.strip()}\n")
    # generate's prefill is not reported separately; the trie run's stands in for it
    generate_decode = max(generate_s - answer.stats.prefill_s, 1e-9)
    print(f"{len(reference)} tokens; decode speed-up is over model.generate's decode")
    print(f"  {'method':<22} {'seconds':>7} {'accept len':>10} {'speed-up':>8} "
          f"{'decode':>7}  identical")
    print(f"  {'model.generate':<22} {generate_s:>7.2f} {1.0:>10.2f} {1.0:>7.2f}x "
          f"{1.0:>6.2f}x  -")
    same = True
    for method, (result, seconds) in results.items():
        identical = result.token_ids == reference
        same &= identical
        decode = generate_decode / max(result.stats.decode_s, 1e-9)
        print(f"  {METHODS[method]:<22} {seconds:>7.2f} "
              f"{result.stats.mean_accept_length:>10.2f} {generate_s / seconds:>7.2f}x "
              f"{decode:>6.2f}x  {'yes' if identical else 'NO'}")
    print()
    print(headline(generate_s, results["trie"][1], same))
    trie = results["trie"][0].stats
    print(trie_vs_chain(results["chain"][1] / results["trie"][1], gen.model.device.type,
                        trie.drafted / max(trie.steps, 1)))
    return 0 if same else 1


def headline(generate_s: float, trie_s: float, identical: bool) -> str:
    """What the library is for, in one line: its default method's end-to-end speed-up
    over plain ``generate``, and whether the answer is the same tokens."""
    same = ("the same answer, token for token" if identical
            else "but the answers DIFFER (a bug: please report it)")
    return (f"ngram-trie-rag (n-gram trie) answered {generate_s / trie_s:.2f}x as fast as "
            f"model.generate end to end, {same}.")


def trie_vs_chain(ratio: float, device: str, nodes: float) -> str:
    """The trie against the prompt-lookup chain (``ratio`` = chain seconds / trie
    seconds, ``nodes`` = the trie's draft nodes verified per step): within ``TIE`` of 1
    it is a tie, and on a CPU the reason is said, not a loss headlined."""
    if ratio > 1 + TIE:
        return f"The n-gram trie beat the prompt-lookup chain: {ratio:.2f}x."
    if ratio >= 1 - TIE:
        verdict = (f"The n-gram trie and the prompt-lookup chain tie on this host "
                   f"({ratio:.2f}x, within +-{TIE:.0%})")
    else:
        verdict = f"The prompt-lookup chain was faster on this host (trie at {ratio:.2f}x)"
    if device != "cpu":
        return f"{verdict}."
    return (f"{verdict}:\n  on a CPU each extra verified token costs time, so the draft "
            f"budget keeps trees small\n  ({nodes:.1f} nodes a step here) and the trie "
            "verifies about what the chain does;\n  on a GPU a tree costs about what a "
            "chain does (docs/gpu.md).")

"""`ngram-trie-rag ask DOCS "question"` and `ngram-trie-rag chat DOCS`.

Chunk, embed and index the documents (cached, so the second question is fast),
retrieve, rerank, then stream an answer drafted from the retrieved passages, and
finish with one summary line: accepted length, tokens/s, sources, the reranker used. A
model without a chat template (a base model) gets the same prompt as plain text ending in
"Answer:", and its answer ends at a blank line or "\\nQuestion:", where a base model runs
on (:class:`~ngram_trie_rag.prompts.RagRequest`).

Reranking (``--rerank``) is ``auto`` by default: a cross-encoder when one is on this
machine already (a local folder or the Hugging Face cache; ``auto`` never downloads),
else the embedding order the retriever found. ``lexical`` (BM25 over the candidates)
costs microseconds; ``llm`` asks the answering model about every candidate, one prompt
each, which on a CPU costs seconds per question, so it is opt-in.

Small models loop ("X is Y. X is Y." to the token limit): the answer stops before its
first repeated 12-token run unless ``--no-repetition-stop``; what is kept is a prefix of
the full answer, token for token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decoding.repetition import DEFAULT_N
from .arguments import (
    add_engine_flags,
    add_model_flags,
    add_quantize_flag,
    engine_flags,
    positive_int,
    repetition_window,
)
from .errors import first_line, run_guarded
from .limits import add_limit_flags
from .resident import DEFAULT_KEEP_ALIVE, KEEP_ALIVE_ENV, in_worker, keep_alive_seconds

if TYPE_CHECKING:
    from ..backends import Answer, Delta, Request

RERANK_CHOICES = ("auto", "cross-encoder", "embedding", "lexical", "llm", "none")
# Small enough (22M parameters) to score 20 candidates in well under a second on a CPU;
# the paper's bge-reranker-v2-m3 (568M) is better and slower: pass it with --cross-encoder.
DEFAULT_CROSS_ENCODER = "cross-encoder/ms-marco-MiniLM-L6-v2"
EMBEDDING_ORDER = "embedding"
# The timings a first question reports, in this order; a later chat question has no
# load or index of its own.
SETUP_TIMINGS = ("load", "index")
QUESTION_TIMINGS = ("retrieve", "rerank", "prefill", "decode", "time_to_first_token", "total")


class AskError(ValueError):
    """A user-facing problem: printed as one line, exit code 2."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    for name, helptext in (("ask", "answer one question over your documents"),
                           ("chat", "ask questions over your documents interactively")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("docs", nargs="+" if name == "ask" else 1,
                       help="a folder or files (txt, md, rst, html, pdf, json, jsonl)"
                       + ("; the question comes last" if name == "ask" else ""))
        add_model_flags(p, what="the model that answers (one without a chat template "
                        "gets a completion prompt)")
        add_engine_flags(p, note="auto is eager, --capacity unused, where an ask answers "
                         "in its own process (--keep-alive 0), which would never collect "
                         "what compiling costs" if name == "ask" else "")
        add_quantize_flag(p)
        p.add_argument("--k", type=positive_int, default=4, help="passages given to the model")
        p.add_argument("--candidates", type=positive_int, default=20,
                       help="passages retrieved before reranking")
        _add_rerank_flags(p)
        p.add_argument("--max-new-tokens", type=positive_int, default=256)
        p.add_argument("--num-draft", type=positive_int, default=None)
        add_repetition_flags(p)
        p.add_argument("--json", action="store_true", help="print one JSON object, no stream")
        p.add_argument("--verbose", action="store_true",
                       help="print where the time went (seconds per stage) on stderr")
        p.add_argument("--cache-dir", default=None, help="where the index cache lives")
        add_limit_flags(p)
        if name == "ask":
            p.add_argument("--keep-alive", type=_keep_alive, default=None,
                           metavar="SECONDS",
                           help="keep the model loaded in a background process for this "
                           "long after the answer, so the next ask starts at once; 0: "
                           "answer in this process only (default: "
                           f"${KEEP_ALIVE_ENV} or {DEFAULT_KEEP_ALIVE:.0f})")
        p.set_defaults(func=_run_ask if name == "ask" else _run_chat)


def _keep_alive(text: str) -> float:
    try:
        return keep_alive_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_rerank_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank", choices=RERANK_CHOICES, default="auto",
                   help="how the candidates are reordered before the best --k are kept: "
                   "auto (default): a cross-encoder already on this machine, else the "
                   "embedding order; cross-encoder: load --cross-encoder (downloads it if "
                   "need be); embedding or none: the retriever's order; lexical: BM25 "
                   "term overlap; llm: the answering model scores every candidate (slow)")
    p.add_argument("--cross-encoder", default=DEFAULT_CROSS_ENCODER, metavar="ID|PATH",
                   help="the cross-encoder of --rerank auto/cross-encoder: a hub id or a "
                   f"local folder (default: {DEFAULT_CROSS_ENCODER})")


def add_repetition_flags(p: argparse.ArgumentParser) -> None:
    """``--repetition-stop N`` (default on) and ``--no-repetition-stop``, into
    ``args.repetition_stop`` (``None`` when off)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--repetition-stop", type=repetition_window, default=DEFAULT_N,
                       metavar="N", help="end the answer before its first repeated run of "
                       f"N tokens, where a small model starts to loop (default: {DEFAULT_N})")
    group.add_argument("--no-repetition-stop", dest="repetition_stop",
                       action="store_const", const=None,
                       help="let a looping answer run on to --max-new-tokens")


def _run_ask(args: argparse.Namespace) -> int:
    if len(args.docs) < 2:
        return _fail("give the documents and then the question, e.g. "
                     "ngram-trie-rag ask examples/sample_docs \"What is tree attention?\"")
    *docs, question = args.docs
    return _guarded(lambda: _answer_once(args, docs, question), args)


def _run_chat(args: argparse.Namespace) -> int:
    def loop() -> int:
        session = Session(args, args.docs)
        print("Ask a question (empty line or Ctrl-D to quit).", file=sys.stderr)
        while True:
            try:
                question = input("> ").strip()
            except EOFError:
                return 0
            if not question:
                return 0
            try:
                session.answer(question)
            except ValueError as exc:  # e.g. too long: the next question may be fine
                print(f"error: {exc}", file=sys.stderr)

    return _guarded(loop, args)


def _answer_once(args: argparse.Namespace, docs: list[str], question: str) -> int:
    if not question.strip():
        raise AskError("the question is empty: ask something about the documents")
    Session(args, docs, one_shot=True).answer(question)
    return 0


def one_shot_engine(engine: str, capacity: int | None) -> tuple[str, int | None]:
    """The engine (and capacity) of one ``ask``: ``auto`` is ``eager``, which sizes no
    cache, unless a resident worker answers. A process that answers one question and
    exits pays for whatever compiling ``auto`` starts and never runs the compiled step;
    a worker answers the next asks with it."""
    if engine == "auto" and not in_worker():
        return "eager", None
    return engine, capacity


@dataclass
class RerankChoice:
    """The reranker a session uses (``None``: keep the embedding order), its name for
    the summary, and why ``auto`` chose it."""

    reranker: Any
    name: str
    reason: str = ""


class Session:
    """A loaded model and retriever, answering questions one by one; ``one_shot``: it
    answers one question (see :func:`one_shot_engine`)."""

    def __init__(self, args: argparse.Namespace, docs: list[str],
                 one_shot: bool = False) -> None:
        from ..backends import LocalBackend
        from ..loading import model_source
        from ..retrieval import Embedder, load_or_build
        from ..wrappers.shared import shared_generator, shared_model

        self.args = args
        self._previous: list[str] = []  # the last prompt's passages, in prompt order
        self.started = time.perf_counter()
        self.setup: dict[str, float] = {}  # seconds, reported with the first answer only
        for d in docs:
            if not Path(d).exists():
                raise AskError(f"{d}: no such file or folder")
        if args.k < 1 or args.candidates < 1 or args.max_new_tokens < 1:
            raise AskError("--k, --candidates and --max-new-tokens must be at least 1")
        engine, capacity = engine_flags(args)  # before minutes of indexing
        if one_shot:
            engine, capacity = one_shot_engine(engine, capacity)
            if not in_worker():  # it exits after one answer: nothing to measure for
                from ..engine.costs import background_measure

                background_measure.disable()
        if args.model is not None:  # a bad path or id fails before minutes of indexing
            model_source(args.model)
        # Documents first: a bad folder should fail before the model is loaded.
        self.say("indexing the documents (cached after the first run) ...")
        source = docs[0] if len(docs) == 1 else docs
        embedder = shared_model(("embedder",), Embedder)  # the default model, loaded lazily
        with self.timed("index"):
            self.retriever = load_or_build(source, args.cache_dir, embedder=embedder,
                                           top_k=max(args.candidates, args.k), top_n=args.k,
                                           max_passages=args.max_passages,
                                           max_bytes=args.max_bytes, report=self.say)
        self.say("loading the model ...")
        with self.timed("load"):
            # The process's one generator for these settings: a resident worker's later
            # requests find it loaded.
            self.backend = LocalBackend(shared_generator(
                args.model, device=args.device, dtype=args.dtype,
                engine=engine, capacity=capacity, quantization=args.quantize))
            # The embedder loads lazily: loaded here, its second does not count as retrieval.
            self.retriever.embedder.load()
            self.rerank = self._choose_reranker()
        self.say(f"reranking: {self.rerank.name}"
                 + (f" ({self.rerank.reason})" if self.rerank.reason else ""))

    def say(self, message: str) -> None:
        """A progress line on stderr, kept out of ``--json`` runs."""
        _status(message, self.args.json)

    def timed(self, key: str) -> _Timer:
        """Time a set-up stage, reported once, with the first answer."""
        return _Timer(self.setup, key)

    def _choose_reranker(self) -> RerankChoice:
        mode = self.args.rerank
        if mode in ("embedding", "none"):
            return RerankChoice(None, EMBEDDING_ORDER)
        if mode == "lexical":
            from ..retrieval import LexicalReranker

            return RerankChoice(LexicalReranker(), "lexical")
        if mode == "llm":
            from ..retrieval import LLMReranker

            return RerankChoice(LLMReranker(self.backend.generator.model,
                                            self.backend.tokenizer), "llm")
        if mode == "cross-encoder":
            return RerankChoice(self._load_cross_encoder(self.args.cross_encoder),
                                f"cross-encoder {self.args.cross_encoder}")
        return self._auto_reranker()

    def _auto_reranker(self) -> RerankChoice:
        """A cross-encoder already on this machine, else the embedding order: ``auto``
        neither downloads a model nor fails, and says which it took."""
        name = self.args.cross_encoder
        local = local_cross_encoder(name)
        if local is None:
            return RerankChoice(None, EMBEDDING_ORDER, f"auto: {name} is not on this "
                                "machine; --rerank cross-encoder downloads it")
        try:
            reranker = self._load_cross_encoder(local)
        except Exception as exc:  # whatever a half-present model raises: auto never fails
            return RerankChoice(None, EMBEDDING_ORDER,
                                f"auto: cross-encoder {name} did not load: {first_line(exc)}")
        return RerankChoice(reranker, f"cross-encoder {name}", "auto")

    def _load_cross_encoder(self, name: str) -> Any:
        """The cross-encoder, loaded now: a missing model fails before any question."""
        from ..retrieval import CrossEncoderReranker
        from ..wrappers.shared import shared_model

        def load() -> Any:
            self.say(f"loading the cross-encoder {name} ...")
            reranker = CrossEncoderReranker(name, device=self.args.device)
            _ = reranker.model
            return reranker

        return shared_model(("cross-encoder", name, self.args.device), load)

    def answer(self, question: str) -> dict:
        from ..backends import Request
        from ..decoding.options import options_from
        from ..prompts import rag_request

        timings: dict[str, float] = {}
        start = time.perf_counter()
        with _Timer(timings, "retrieve"):
            fetch = max(self.args.candidates, self.args.k) if self.rerank.reranker else None
            candidates = self.retriever.retrieve(question, top_n=fetch)
        with _Timer(timings, "rerank"):
            passages = self._reranked(question, candidates)
        passages = follow_order(passages, self._previous)
        texts = [p.text for p in passages]
        self._previous = texts
        # Chat messages, or for a base model a completion prompt with its stop strings.
        request = rag_request(self.backend.tokenizer, texts, question)
        options = options_from(max_new_tokens=self.args.max_new_tokens,
                               num_draft=self.args.num_draft, stop=list(request.stop),
                               repetition_stop=self.args.repetition_stop)
        generate_start = time.perf_counter()
        deltas = self._opened(Request(request.prompt, texts, options))
        first, answer = _show(deltas, echo=not self.args.json)
        stats = answer.speculative
        timings.update(prefill=stats["prefill_s"], decode=stats["decode_s"],
                       time_to_first_token=(first or time.perf_counter()) - generate_start)
        # The first answer's total counts the set-up it waited for; a later one's does not.
        timings["total"] = time.perf_counter() - (self.started if self.setup else start)
        timings = {**self.setup, **timings}
        self.setup = {}
        summary = self._summary(answer, passages, timings)
        if self.args.json:
            print(json.dumps(summary, ensure_ascii=False))
        else:
            print(f"\n\n[{_summary_line(summary)}]")
        if self.args.verbose:
            print(f"timings: {_timings_line(timings)}", file=sys.stderr, flush=True)
        return summary

    def _opened(self, request: Request) -> Iterator[Delta]:
        """The request's deltas (its prompt encoded and checked once, by the backend), or
        an ``AskError`` saying how to make it fit the model's context window."""
        from ..inputs import ContextWindowError

        try:
            return self.backend.stream(request)
        except ContextWindowError as exc:
            raise AskError(f"the question and its {len(request.documents)} passages take "
                           f"{exc.tokens} tokens, more than the model's context window of "
                           f"{exc.window}: shorten the question or pass a smaller --k"
                           ) from None

    def _reranked(self, question: str, candidates: list) -> list:
        """The best ``--k`` candidates, by the session's reranker or in retrieval order."""
        if self.rerank.reranker is None:
            return candidates[: self.args.k]
        if self.args.rerank == "llm":
            self.say(f"reranking {len(candidates)} passages with the model ...")
        return self.rerank.reranker.rerank(question, candidates, top_n=self.args.k)

    def _summary(self, answer: Answer, passages: list, timings: dict[str, float]) -> dict:
        stats = answer.speculative
        tokens = answer.completion_tokens
        return {
            "model": self._model_name(),
            "answer": answer.text.strip(),
            "sources": sorted({Path(p.source).name for p in passages}),
            "finish_reason": answer.finish_reason,
            "tokens": tokens,
            "mean_accept_length": round(stats["mean_accept_length"], 3),
            "tokens_per_s": round(tokens / max(stats["prefill_s"] + stats["decode_s"], 1e-9),
                                  2),
            "steps": stats["steps"],
            "engine": stats["engine"],
            # A chat follow-up prefills only what its prompt does not share with the last.
            "prefix_reused": stats["prefix_reused"],
            "reranker": self.rerank.name,
            "repetition_stop": self.args.repetition_stop,
            "timings": {k: round(v, 4) for k, v in timings.items()},
            "passages": [{"source": p.source, "score": p.score, "text": p.text}
                         for p in passages],
        }

    def _model_name(self) -> str:
        """The model as the user named it (the shared generator knows a local folder by
        its absolute path, whichever spelling loaded it first)."""
        if self.args.model is None:
            return self.backend.model_name
        return os.fspath(self.args.model)


class _Timer:
    """``with _Timer(into, key):`` adds the block's wall seconds to ``into[key]``."""

    def __init__(self, into: dict[str, float], key: str) -> None:
        self.into, self.key = into, key

    def __enter__(self) -> _Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.into[self.key] = self.into.get(self.key, 0.0) + time.perf_counter() - self.start


def follow_order(passages: list, previous: list[str]) -> list:
    """The passages, those the previous prompt also had first and in its order, then
    the new ones in rank order. A follow-up over the same passages then repeats the
    previous prompt up to its question, and the engine prefills only the rest (the
    cache of the common prefix is kept); the model still sees every passage."""
    place = {text: i for i, text in enumerate(previous)}
    return sorted(passages, key=lambda p: place.get(p.text, len(place)))  # stable


def local_cross_encoder(name: str) -> str | None:
    """``name`` as a folder on this machine (itself, or its Hugging Face cache snapshot),
    found without the network; ``None`` if it would have to be downloaded."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    from ..loading import cached_snapshot

    try:
        snapshot = cached_snapshot(name)
    except (ImportError, ValueError):  # no hub client, or not a valid hub id
        return None
    return str(snapshot) if snapshot is not None else None


def _show(deltas: Iterator[Delta], echo: bool) -> tuple[float | None, Answer]:
    """Print the deltas' text (when ``echo``); the clock when the first text came, and
    the answer the last delta carries."""
    first = None
    answer = None
    for delta in deltas:
        if first is None and delta.text:
            first = time.perf_counter()
        if echo:
            print(delta.text, end="", flush=True)
        if delta.answer is not None:
            answer = delta.answer
    assert answer is not None  # a backend's stream ends with the answer
    return first, answer


def _summary_line(summary: dict) -> str:
    tokens, steps = summary["tokens"], summary["steps"]
    parts = [f"accepted length {summary['mean_accept_length']:.2f} tokens/step",
             f"{summary['tokens_per_s']:.1f} tokens/s",
             f"{tokens} tokens in {steps + 1} forward passes instead of {tokens}"]
    if summary["finish_reason"] == "repetition":
        parts.append("stopped where the answer began to repeat itself "
                     "(--no-repetition-stop lets it run on)")
    parts.append(f"reranker: {summary['reranker']}")
    parts.append(f"sources: {', '.join(summary['sources'])}")
    return "; ".join(parts)


def _timings_line(timings: dict[str, float]) -> str:
    order = [k for k in (*SETUP_TIMINGS, *QUESTION_TIMINGS) if k in timings]
    return ", ".join(f"{k.replace('_', ' ')} {timings[k]:.2f} s" for k in order)


def _guarded(action: Callable[[], int], args: argparse.Namespace) -> int:
    """One ``error:`` line and exit 2 for a user's mistake (see ``errors``)."""
    return run_guarded(action, debug=getattr(args, "debug", False))


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _status(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)

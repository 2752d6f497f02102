"""`ngram-trie-rag ask DOCS "question"` and `ngram-trie-rag chat DOCS`.

Chunk, embed and index the documents (cached, so the second question is fast),
retrieve, rerank, then stream an answer drafted from the retrieved passages, and
finish with one summary line: accepted length, tokens/s, sources. A model without a
chat template (a base model) gets the same prompt as plain text ending in "Answer:",
and its answer ends at a blank line or "\\nQuestion:", where a base model runs on
(:class:`~ngram_trie_rag.prompts.RagRequest`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from .arguments import add_model_flags, positive_int
from .errors import run_guarded
from .limits import add_limit_flags


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
        p.add_argument("--k", type=positive_int, default=4, help="passages given to the model")
        p.add_argument("--candidates", type=positive_int, default=20,
                       help="passages retrieved before reranking")
        p.add_argument("--rerank", choices=["llm", "none"], default="llm")
        p.add_argument("--max-new-tokens", type=positive_int, default=256)
        p.add_argument("--num-draft", type=positive_int, default=None)
        p.add_argument("--json", action="store_true", help="print one JSON object, no stream")
        p.add_argument("--cache-dir", default=None, help="where the index cache lives")
        add_limit_flags(p)
        p.set_defaults(func=_run_ask if name == "ask" else _run_chat)


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
    Session(args, docs).answer(question)
    return 0


class Session:
    """A loaded model and retriever, answering questions one by one."""

    def __init__(self, args: argparse.Namespace, docs: list[str]) -> None:
        from ..generator import SpeculativeGenerator
        from ..loading import model_source
        from ..retrieval import LLMReranker, load_or_build

        self.args = args
        for d in docs:
            if not Path(d).exists():
                raise AskError(f"{d}: no such file or folder")
        if args.k < 1 or args.candidates < 1 or args.max_new_tokens < 1:
            raise AskError("--k, --candidates and --max-new-tokens must be at least 1")
        if args.model is not None:  # a bad path or id fails before minutes of indexing
            model_source(args.model)
        # Documents first: a bad folder should fail before the model is loaded.
        _status("indexing the documents (cached after the first run) ...", args.json)
        source = docs[0] if len(docs) == 1 else docs
        self.retriever = load_or_build(source, args.cache_dir,
                                       top_k=max(args.candidates, args.k), top_n=args.k,
                                       max_passages=args.max_passages,
                                       max_bytes=args.max_bytes,
                                       report=lambda line: _status(line, args.json))
        _status("loading the model ...", args.json)
        self.gen = SpeculativeGenerator.from_pretrained(args.model, device=args.device,
                                                        dtype=args.dtype)
        if args.rerank == "llm":
            self.retriever.reranker = LLMReranker(self.gen.model, self.gen.tokenizer)

    def answer(self, question: str) -> dict:
        from ..prompts import rag_request

        passages = self.retriever.retrieve(question)
        texts = [p.text for p in passages]
        # Chat messages, or for a base model a completion prompt with its stop strings.
        request = rag_request(self.gen.tokenizer, texts, question)
        ids = self.gen.encode_prompt(request.prompt)  # encoded once: stream takes the ids
        size = len(ids)
        if size >= self.gen.context_window:
            raise AskError(f"the question and its {len(texts)} passages take "
                           f"{size} tokens, more than the "
                           f"model's context window of {self.gen.context_window}: shorten the "
                           "question or pass a smaller --k")
        stream = self.gen.stream(ids, texts,
                                 max_new_tokens=self.args.max_new_tokens,
                                 num_draft=self.args.num_draft, stop=list(request.stop))
        for delta in _deltas(stream, echo=not self.args.json):
            print(delta, end="", flush=True)
        result = stream.result
        assert result is not None
        stats = result.stats
        sources = sorted({Path(p.source).name for p in passages})
        tok_s = len(result.token_ids) / max(stats.prefill_s + stats.decode_s, 1e-9)
        summary = {
            "model": self.gen.model_name,
            "answer": result.text.strip(),
            "sources": sources,
            "finish_reason": result.finish_reason,
            "tokens": len(result.token_ids),
            "mean_accept_length": round(stats.mean_accept_length, 3),
            "tokens_per_s": round(tok_s, 2),
            "steps": stats.steps,
            "passages": [{"source": p.source, "score": p.score, "text": p.text}
                         for p in passages],
        }
        if self.args.json:
            print(json.dumps(summary, ensure_ascii=False))
        else:
            print(f"\n\n[accepted length {stats.mean_accept_length:.2f} tokens/step, "
                  f"{tok_s:.1f} tokens/s, {len(result.token_ids)} tokens in {stats.steps + 1} "
                  f"forward passes instead of {len(result.token_ids)}; "
                  f"sources: {', '.join(sources)}]")
        return summary


def _deltas(stream, echo: bool) -> Iterator[str]:
    for delta in stream:
        if echo:
            yield delta


def _guarded(action, args: argparse.Namespace) -> int:
    """One ``error:`` line and exit 2 for a user's mistake (see ``errors``)."""
    return run_guarded(action, debug=getattr(args, "debug", False))


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _status(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)

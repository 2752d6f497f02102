"""``index`` subcommand: ``index build DOCS --out DIR`` and ``index query DIR "question"``.

Heavy imports (torch, sentence-transformers, faiss) happen inside the handlers, so
``--help`` stays instant. A user's mistake (a :class:`~ngram_trie_rag.retrieval.RetrievalError`,
an ``OSError``) reaches the command line's guard (:mod:`.errors`): one ``error: ...``
line on stderr and exit code 2, the traceback only with ``--debug``.

``index build`` checks ``--out`` and takes the folder's build lock before it reads or
embeds anything, so a wrong folder or a second build into the same one fails at once; it
prints the passage count and a time estimate before the embedding starts.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..retrieval.chunking import DEFAULT_CHUNK_SIZE, DEFAULT_OVERLAP
from ..retrieval.errors import RetrievalError
from .arguments import add_model_flags, non_negative_int, positive_int
from .errors import EXIT_USAGE
from .limits import add_limit_flags


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``index`` (with ``build`` and ``query``) on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "index", help="build or query a retrieval index over documents",
        description="Build a FAISS index over a folder of documents, or query one.",
    )
    actions = parser.add_subparsers(dest="index_command", metavar="{build,query}")

    def missing_action(args: argparse.Namespace) -> int:
        parser.print_usage(sys.stderr)
        print("error: index needs an action: build or query", file=sys.stderr)
        return EXIT_USAGE

    parser.set_defaults(func=missing_action)

    build = actions.add_parser(
        "build", help="index a folder of .txt/.md/.rst/.html/.pdf/.json/.jsonl documents"
    )
    build.add_argument("docs", metavar="DOCS_DIR", help="folder (recursive) or document file")
    build.add_argument("--out", required=True, metavar="INDEX_DIR", help="where to save")
    build.add_argument("--embedder", default=None, metavar="NAME_OR_PATH",
                       help="sentence-transformers model (default: packaged all-MiniLM-L6-v2)")
    build.add_argument("--factory", default=None, metavar="STR",
                       help="FAISS factory string (default: Flat below 10k passages, else IVF-PQ)")
    build.add_argument("--nprobe", type=positive_int, default=None,
                       help="IVF lists searched (default 16)")
    build.add_argument("--chunk-size", type=positive_int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                       help=f"words per passage (default {DEFAULT_CHUNK_SIZE})")
    build.add_argument("--overlap", type=non_negative_int, default=DEFAULT_OVERLAP, metavar="N",
                       help=f"words shared by consecutive passages (default {DEFAULT_OVERLAP})")
    add_limit_flags(build)
    build.set_defaults(func=cmd_build)

    query = actions.add_parser("query", help="print the top passages for a question")
    query.add_argument("index", metavar="INDEX_DIR")
    query.add_argument("question")
    query.add_argument("--k", type=positive_int, default=5, help="passages to print (default 5)")
    query.add_argument("--top-k", type=positive_int, default=100,
                       help="candidates fetched before reranking (default 100)")
    query.add_argument("--rerank", choices=("none", "llm", "llm-yesno"), default="none",
                       help="rerank candidates with the LLM: 'llm' scores the query "
                       "likelihood given the passage, 'llm-yesno' the yes/no answer log-odds "
                       "(needs an instruction-following LLM)")
    add_model_flags(query, what="the LLM of --rerank llm")
    query.add_argument("--nprobe", type=positive_int, default=None,
                       help="override the saved nprobe")
    query.add_argument("--json", action="store_true", help="print JSON instead of text")
    query.set_defaults(func=cmd_query)
    return parser


def cmd_build(args: argparse.Namespace) -> int:
    """Load + chunk + embed DOCS_DIR and save the index to --out."""
    from ..retrieval.build_lock import build_lock
    from ..retrieval.retriever import Retriever
    from ..retrieval.store import check_target

    if not 0 <= args.overlap < args.chunk_size:
        raise RetrievalError(
            f"--overlap must be in [0, --chunk-size), got {args.overlap} for {args.chunk_size}"
        )
    check_target(Path(args.out))  # before minutes of embedding, not after
    with build_lock(args.out):  # a second build into the same folder fails at once
        retriever = Retriever.build(
            args.docs,
            embedder=args.embedder,
            factory=args.factory,
            nprobe=args.nprobe,
            chunk_size=args.chunk_size,
            overlap=args.overlap,
            max_passages=args.max_passages,
            max_bytes=args.max_bytes,
            report=_to_stderr,
        )
        retriever.save(args.out)
    index = retriever.index
    print(
        f"indexed {len(index)} passages from {args.docs} into {args.out} "
        f"(factory {index.factory}, embedder {index.embedder_name})"
    )
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    """Print the top passages for a question over a saved index."""
    from ..retrieval.retriever import Retriever

    retriever = Retriever.load(
        args.index, reranker=_make_reranker(args), top_k=max(args.top_k, args.k), top_n=args.k
    )
    if args.nprobe is not None:
        retriever.index.nprobe = args.nprobe
    passages = retriever.retrieve(args.question)
    if args.json:
        rows = [{"rank": rank, **p.to_dict()} for rank, p in enumerate(passages, start=1)]
        print(json.dumps(rows, ensure_ascii=False, indent=2))
        return 0
    if not passages:
        print("no passages found")
    for rank, p in enumerate(passages, start=1):
        print(f"{rank}. score {p.score:.4f}  {p.source}  [{p.id}]")
        print(textwrap.indent(textwrap.shorten(p.text, width=400, placeholder=" ..."), "   "))
    return 0


def _make_reranker(args: argparse.Namespace) -> Any:
    if args.rerank == "none":
        return None
    from ..retrieval.llm_reranker import LLMReranker

    method = "yes_no" if args.rerank == "llm-yesno" else "query_likelihood"
    if args.model:
        from ..loading import load_model

        model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
        return LLMReranker(model, tokenizer, method=method)
    return LLMReranker(method=method)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

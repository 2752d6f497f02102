"""``--max-passages`` and ``--max-bytes``, shared by ``ask``, ``chat`` and ``index build``.

Both stop an oversized build before the embedding starts (it can take minutes), rather
than after: ``--max-bytes`` from the file sizes before anything is read, ``--max-passages``
after chunking (:mod:`ngram_trie_rag.retrieval.limits`).
"""

from __future__ import annotations

import argparse

from .arguments import byte_size, positive_int


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """``--max-passages`` and ``--max-bytes``: stop an oversized build before embedding."""
    parser.add_argument("--max-passages", type=positive_int, default=None, metavar="N",
                        help="refuse to embed more than N passages (default: no limit)")
    parser.add_argument("--max-bytes", type=byte_size, default=None, metavar="SIZE",
                        help="refuse documents over SIZE in all, e.g. 20M (default: no limit)")

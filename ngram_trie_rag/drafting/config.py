"""Drafting hyper-parameters, with the paper's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import check_draft_config
from .proposers import PROPOSERS


@dataclass(frozen=True)
class DraftConfig:
    """Window ``n``, longest matched prefix ``prefix_len`` (L_p), ``num_draft``.

    ``num_draft`` is the most nodes verified per step: the budget's cap when ``adaptive``,
    the fixed tree size otherwise. ``method`` picks the proposer: ``"trie"`` (the paper's
    tree), ``"backoff"`` (its union over every back-off length), ``"chain"`` (prompt
    lookup over the same trie) or ``"none"`` (plain decoding).
    """

    n: int = 13
    prefix_len: int = 3
    num_draft: int = 32
    method: str = "trie"
    adaptive: bool = True  # choose the tree size per step from latency and acceptance
    max_trie_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        check_draft_config(self.n, self.prefix_len, self.num_draft, self.method,
                           self.adaptive, self.max_trie_tokens)
        if self.n <= self.prefix_len:
            raise ValueError(
                f"n must be greater than prefix_len (L_p): n={self.n}, L_p={self.prefix_len}"
            )
        check_method(self.method)


def check_method(method: str) -> str:
    """``method`` if it names a proposer, else a ValueError listing them."""
    if method not in PROPOSERS:
        raise ValueError(f"unknown draft method {method!r}; use one of {list(PROPOSERS)}")
    return method

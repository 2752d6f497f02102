"""One :class:`~ngram_trie_rag.drafting.Drafter` per running request, keyed by request id.

A batching engine (vLLM's proposer seam) hands over, every step, each row's request id
and the row's committed token ids, and verifies chains rather than trees. This pool
keeps the per-request state that seam lacks:

- first sight of a request: a drafter over *its* documents (or, with none, its prompt),
  caught up with whatever it already generated (a preempted request comes back
  mid-answer);
- every later step: the drafter learns the tokens committed since, then proposes;
- the draft is the trie's best path, at most ``k`` tokens (the engine verifies chains);
- :meth:`retain` drops every request the engine no longer runs (finished, aborted or
  preempted alike), so state never outlives its request.

Documents are looked up per request, so one request's documents are never drafted for
another. NumPy only, like the rest of drafting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..drafting import DraftConfig, Drafter
from ..drafting.batch_budget import token_class


@dataclass
class _Entry:
    drafter: Drafter
    seen: int  # committed tokens the drafter has learned (prompt included)


class RequestDrafters:
    """Per-request drafters for a batching engine.

    Args:
        config: drafting settings (n, L_p, the trie's token bound); ``num_draft`` is the
            number of candidates the best path is chosen among.
        max_requests: live requests at most; a new one beyond it is an error (the
            engine's own batch limit should be the bound, this only backs it up).

    Example::

        pool = RequestDrafters(DraftConfig(n=6, prefix_len=2))
        pool.propose("r1", [1, 2, 3, 4, 1, 2], num_prompt=6, documents=None, k=3)  # [3, 4, 1]
    """

    def __init__(self, config: DraftConfig | None = None, max_requests: int = 4096) -> None:
        self.config = config or DraftConfig()
        self.max_requests = max_requests
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._entries

    def propose(self, req_id: str, tokens: Sequence[int], num_prompt: int,
                documents: Sequence[Sequence[int]] | None, k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``tokens`` (the request's committed ids:
        prompt, then generated). ``documents`` (token ids) are read on first sight only."""
        return self.propose_classed(req_id, tokens, num_prompt, documents, k)[0]

    def propose_classed(self, req_id: str, tokens: Sequence[int], num_prompt: int,
                        documents: Sequence[Sequence[int]] | None,
                        k: int) -> tuple[list[int], list[int]]:
        """:meth:`propose`, with each draft token's
        :func:`~ngram_trie_rag.drafting.batch_budget.token_class` (how sure the trie was of
        it) for the length policy."""
        if k < 1:
            return [], []
        entry = self._entries.get(req_id)
        if entry is None:
            if len(self._entries) >= self.max_requests:
                raise RuntimeError(f"more than {self.max_requests} live requests to draft "
                                   "for; call retain() with the live request ids each step")
            drafter = Drafter.for_request(self.config, tokens[:num_prompt], documents or None,
                                          method="trie", num_draft=self.config.num_draft)
            entry = self._entries[req_id] = _Entry(drafter, num_prompt)
        if len(tokens) > entry.seen:
            entry.drafter.update(tokens[entry.seen:])
            entry.seen = len(tokens)
        tree = entry.drafter.propose(k)
        path = tree.best_path()[:k]
        nodes = tree.path_nodes(path)
        shares = tree.sibling_shares()
        freqs = tree.frequencies if tree.frequencies.size else np.ones(len(tree), np.int64)
        return path, [token_class(int(tree.depths[i]), float(shares[i]), int(freqs[i]))
                      for i in nodes]

    def retain(self, live: Iterable[str]) -> None:
        """Forget every request not in ``live``."""
        keep = set(live)
        for req_id in [r for r in self._entries if r not in keep]:
            del self._entries[req_id]

"""The n-gram trie of the paper (Algorithm 1), stored implicitly over a token array.

Inserting every sub-prefix ``P_i[j:L_p] + S_i`` of every window means every token
position ``s`` starts a key, and every key is a prefix of ``T[s:s+n]``. So the trie's
nodes are exactly the distinct substrings of length <= n inside one document, and a
node's frequency is a count over the positions where its path occurs:

    freq(path, depth D) = sum over s with T[s:s+D] == path of
                          #{ j in [0, L_p) : window i = s - j starts in the document,
                                             D <= n - j (the key reaches depth D) }
                        = sum_s  min(L_p - 1, s - doc_start, n - D) + 1

(every window is taken, the last ones truncated at the document's end, so a node
exists only if its whole path lies inside one document). Storing the tokens and
materialising only the matched subtree per draft makes building the trie a copy
(O(tokens), no per-node Python objects) and ``extend`` an append, while drafting
returns exactly the nodes and frequencies the literal trie would hold (tested
against a literal Algorithm 1 implementation).

Memory bound: the trie keeps at most ``max_tokens`` token slots (documents are
separated by one slot); the implicit trie therefore never exceeds ``n * max_tokens``
nodes. When a document or ``extend`` pushes past the bound, the oldest tokens are
dropped (first in, first out, an eighth of the bound at a time), so the trie always
reflects the most recent context; the drop is counted in ``evicted_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .draft_tree import DraftTree

SEP = -1  # document separator; never equal to a real token id


def _as_tokens(tokens: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what}: token ids must be non-negative, got {int(arr.min())}")
    return arr


class NGramTrie:
    """N-gram trie over one or more documents, learning from generated tokens.

    Args:
        n: window length (paper's best for Llama2-7B RAG: 13).
        prefix_len: maximum prefix length L_p (paper: 3); matches back off L_p..1.
        max_tokens: bound on stored token slots (see module docstring for the policy).

    Example (the paper's Figure 1 setting, n = 6, L_p = 3)::

        trie = NGramTrie(n=6, prefix_len=3)
        trie.add_document([1, 2, 3, 4, 5, 6, 7])
        trie.draft([9, 2, 3], num_draft=4).paths()  # -> [(4,), (4, 5), (4, 5, 6), (4, 5, 6, 7)]
    """

    def __init__(self, n: int = 13, prefix_len: int = 3, max_tokens: int = 1 << 20) -> None:
        if prefix_len < 1:
            raise ValueError(f"prefix_len (L_p) must be >= 1, got {prefix_len}")
        if n <= prefix_len:
            raise ValueError(f"n must be greater than prefix_len (L_p): n={n}, L_p={prefix_len}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.n = n
        self.prefix_len = prefix_len
        self.max_tokens = max_tokens
        self._guard = n  # SEP slots before position 0 so backward gathers stay in bounds
        self._buf = np.full(self._guard + 4 * n + 64, SEP, dtype=np.int64)
        self._len = self._guard  # buf[:_len] is live; buf[_len:] is always SEP
        self.num_documents = 0
        self.evicted_tokens = 0

    # ---- building -------------------------------------------------------------------
    def add_document(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Start a new document: no n-gram crosses into it from the previous one."""
        arr = _as_tokens(tokens, "document")
        if self._buf[self._len - 1] != SEP:
            self._append(np.array([SEP], dtype=np.int64))
        self.num_documents += 1
        self._append(arr)

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append tokens to the last document (the answer as it is generated)."""
        if self.num_documents == 0:
            self.num_documents = 1
        self._append(_as_tokens(tokens, "extend"))

    def _append(self, arr: np.ndarray) -> None:
        need = self._len + arr.size + self.n + 1  # forward gathers read up to n past the end
        if need > self._buf.size:
            grown = np.full(max(need, 2 * self._buf.size), SEP, dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : self._len + arr.size] = arr
        self._len += arr.size
        if self._len - self._guard > self.max_tokens:
            self._evict()

    def _evict(self) -> None:
        keep = self.max_tokens - self.max_tokens // 8
        cut = self._len - keep
        live = self._buf[cut : self._len].copy()
        self.evicted_tokens += int((self._buf[self._guard : cut] != SEP).sum())
        self._buf[self._guard :] = SEP
        self._buf[self._guard : self._guard + keep] = live
        self._len = self._guard + keep

    @property
    def num_tokens(self) -> int:
        """Tokens currently stored (separators excluded)."""
        return int((self._buf[self._guard : self._len] != SEP).sum())

    # ---- drafting -------------------------------------------------------------------
    def match(self, tail: Sequence[int] | np.ndarray) -> tuple[int, np.ndarray]:
        """Longest-prefix match of the last L_p tokens, backing off to 1.

        Returns ``(k, ends)``: the matched length and the buffer positions where each
        occurrence of ``tail[-k:]`` ends. Only occurrences with at least one following
        token count (a path with no subtree, such as the answer's own newest tokens,
        would give an empty draft), so the back-off continues past them. ``k == 0``:
        no match, no draft.
        """
        ends, agree = self._occurrences(tail)
        if ends.size == 0:
            return 0, ends
        k = int(agree.max())
        return k, ends[agree == k]

    def latest_continuation(self, tail: Sequence[int] | np.ndarray,
                            length: int) -> tuple[int, np.ndarray]:
        """``(k, tokens)``: the up to ``length`` tokens that followed the most recent
        occurrence of the longest match ``tail[-k:]``, stopping at its document's end
        (prompt lookup's draft). ``k == 0``: no match (or no room), no tokens."""
        k, ends = self.match(tail)
        if k == 0 or length < 1:
            return 0, np.zeros(0, dtype=np.int64)
        end = int(ends.max())
        cont = self._buf[end + 1 : end + 1 + length]
        stop = np.flatnonzero(cont == SEP)
        return k, cont[: stop[0]] if stop.size else cont.copy()

    def _occurrences(self, tail: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ends, agree)``: every position holding ``tail[-1]`` with a following token
        in its document, and how many of the last L_p tokens agree there (1..L_p)."""
        tail = np.asarray(tail, dtype=np.int64)[-self.prefix_len :]
        if tail.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        buf = self._buf
        ends = np.flatnonzero(buf[: self._len] == tail[-1])
        ends = ends[buf[ends + 1] != SEP]
        agree = np.ones(ends.size, dtype=np.int64)  # matched length per occurrence
        alive = np.ones(ends.size, dtype=bool)
        for d in range(1, tail.size):
            alive &= buf[ends - d] == tail[-1 - d]
            agree += alive
        return ends, agree

    def draft(
        self, tail: Sequence[int] | np.ndarray, num_draft: int, max_depth: int | None = None
    ) -> DraftTree:
        """The ``num_draft`` most frequent nodes of the subtree below the matched path.

        Ties break by shallower depth, then the most recent occurrence, so the kept set
        is always ancestor-closed (a child's frequency never exceeds its parent's).
        """
        if num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {num_draft}")
        k, ends = self.match(tail)
        if k == 0:
            return DraftTree.empty()
        depth = self.n - k if max_depth is None else min(self.n - k, max_depth)
        if depth < 1:
            return DraftTree.empty()
        tree = self._subtree(ends, k, depth)
        return _keep_top(tree, num_draft)

    def draft_backoff(
        self, tail: Sequence[int] | np.ndarray, num_draft: int, max_depth: int | None = None
    ) -> DraftTree:
        """Like :meth:`draft`, over the union of the matched subtrees at every back-off
        length L_p..1 instead of the longest match's only.

        When the longest match's continuations are wrong, the shorter matches' are the
        next best guesses; the paper's draft never offers them. Each node keeps the
        longest match length among the occurrences it continues (``node_match``) and
        its frequency under that match, and nodes rank by match length, then frequency,
        then depth and recency, so the kept set is ancestor-closed and a small budget
        drafts exactly what :meth:`draft` would.
        """
        if num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {num_draft}")
        ends, agree = self._occurrences(tail)
        if ends.size == 0:
            return DraftTree.empty()
        depth = self.n - 1 if max_depth is None else min(self.n - 1, max_depth)
        if depth < 1:
            return DraftTree.empty()
        tree = self._subtree(ends, agree, depth)
        return _keep_top(tree, num_draft)

    def _subtree(self, ends: np.ndarray, k: int | np.ndarray, depth: int) -> DraftTree:
        """Materialise the trie below matched paths ending at ``ends``.

        ``k`` is the match length: one for all occurrences, or (R,) each occurrence's
        own (how many of the last L_p tokens agree there). With per-occurrence lengths,
        an occurrence counts at each depth under the longest match whose key still
        reaches that depth (k + D <= n), and a node keeps the longest match it
        continues and its frequency under that match: the union of the literal
        subtrees of every back-off length.
        """
        buf, n = self._buf, self.n
        per_row = np.ndim(k) > 0
        k = np.broadcast_to(np.asarray(k, dtype=np.int64), ends.shape)
        cols = np.arange(depth)
        cont = buf[ends[:, None] + 1 + cols]  # (R, depth) continuation tokens
        valid = np.cumprod(cont != SEP, axis=1).astype(bool)  # stays inside the document
        if per_row:
            kc = np.minimum(k[:, None], n - 1 - cols[None, :])  # (R, depth) match per entry
            valid &= kc >= 1
        else:
            kc = k[:, None]  # (R, 1): one match length per row, broadcast over depth
        trie_depth = kc + 1 + cols[None, :]  # D of each entry
        weight = self._key_weight(ends[:, None] - kc + 1, trie_depth)  # key start s
        weight = np.where(valid, weight, 0)  # (R, depth)
        cont = np.where(valid, cont, SEP)

        # Sort rows lexicographically: shared prefixes become adjacent, and numbering
        # new nodes row-major then yields depth-first pre-order.
        order = np.lexsort(cont.T[::-1])
        cont, weight, valid, ends = cont[order], weight[order], valid[order], ends[order]
        kc = kc[order]
        rows = cont.shape[0]
        new = np.ones((rows, depth), dtype=bool)
        if rows > 1:
            same = np.cumprod(cont[1:] == cont[:-1], axis=1).sum(axis=1)  # LCP with row above
            new[1:] = cols[None, :] >= same[:, None]
        new &= valid
        ids = np.where(new, np.cumsum(new.ravel()).reshape(rows, depth) - 1, -1)
        ids = np.maximum.accumulate(ids, axis=0)  # rows sharing a prefix share its node
        ids = np.where(valid, ids, -1)
        r, c = np.nonzero(new)  # row-major == node-id order
        num = r.size
        node_match = None
        counted = valid
        if per_row:  # a node counts only the occurrences of its longest match
            node_match = np.zeros(num, dtype=np.int64)
            np.maximum.at(node_match, ids[valid], kc[valid])
            counted = valid & (kc == node_match[np.maximum(ids, 0)])
        freq = np.bincount(ids[counted], weights=weight[counted], minlength=num).astype(np.int64)
        recent = np.full(num, -1, dtype=np.int64)
        np.maximum.at(recent, ids[counted], np.broadcast_to(ends[:, None], valid.shape)[counted])
        parents = np.where(c > 0, ids[r, np.maximum(c - 1, 0)], -1)
        return DraftTree(cont[r, c], parents, c + 1, freq, int(k.max(initial=0)), recent,
                         node_match=node_match)

    def _key_weight(self, starts: np.ndarray, depth: np.ndarray | int) -> np.ndarray:
        """How many inserted keys starting at ``starts`` reach ``depth``:
        ``min(L_p - 1, s - doc_start, n - D) + 1`` (the module docstring's sum term)."""
        lp = self.prefix_len
        if lp > 1:
            back = self._buf[starts[..., None] - 1 - np.arange(lp - 1)] != SEP
            before = np.cumprod(back, axis=-1).sum(axis=-1)  # min(L_p - 1, s - doc_start)
        else:
            before = np.zeros_like(starts)
        return np.minimum(np.minimum(before, self.n - depth), lp - 1) + 1

    # ---- inspection (tests, stats) ----------------------------------------------------
    def frequency(self, path: Sequence[int]) -> int:
        """Frequency of the node reached from the root by ``path`` (0: no such node)."""
        path = _as_tokens(path, "path")
        depth = path.size
        if depth == 0 or depth > self.n:
            return 0
        starts = np.flatnonzero(self._buf[: self._len] == path[0])
        for d in range(1, depth):
            starts = starts[self._buf[starts + d] == path[d]]
        if starts.size == 0:
            return 0
        return int(self._key_weight(starts, depth).sum())

    def children(self, path: Sequence[int]) -> dict[int, int]:
        """``{token: frequency}`` of the children of the node at ``path``."""
        return {
            int(t): f
            for t in np.unique(self._buf[: self._len])
            if t != SEP and (f := self.frequency([*path, int(t)])) > 0
        }

    @property
    def num_nodes(self) -> int:
        """Node count of the equivalent literal trie (O(tokens * n); for stats)."""
        pos = np.flatnonzero(self._buf[: self._len] != SEP)
        if pos.size == 0:
            return 0
        return len(self._subtree(pos - 1, 0, self.n))


def _keep_top(tree: DraftTree, num_draft: int) -> DraftTree:
    """Rank every node, keep the ``num_draft`` best; the result stays in pre-order."""
    recent = tree.recency if tree.recency is not None else np.zeros(len(tree), np.int64)
    order = np.lexsort((-recent, tree.depths, -tree.frequencies, -tree.node_matches()))
    rank = np.empty(len(tree), dtype=np.int64)  # the last lexsort key is the primary one
    rank[order] = np.arange(len(tree))
    ranked = DraftTree(tree.tokens, tree.parents, tree.depths, tree.frequencies,
                       tree.match_len, recent, rank, tree.node_match)
    return ranked.top(num_draft)

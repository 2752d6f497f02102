"""The draft tree handed from a drafter to the verifier."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DraftTree:
    """A tree of draft tokens hanging below the last committed token.

    Nodes are stored in depth-first (pre-)order, so a parent always precedes its
    children. Invariants: ``parents[i] < i``; ``parents[i] == -1`` for the children of
    the committed token; ``depths[i] == depths[parents[i]] + 1`` with depth 1 at the top.

    Example (committed "... the", draft "cat sat" and "dog"):
        tokens  = [cat, sat, dog]
        parents = [ -1,   0,  -1]
        depths  = [  1,   2,   1]
    """

    tokens: np.ndarray  # (N,) int64
    parents: np.ndarray  # (N,) int64, -1 = child of the committed token
    depths: np.ndarray  # (N,) int64, >= 1
    frequencies: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    match_len: int = 0  # how many trailing tokens matched the trie (0: no match)
    recency: np.ndarray | None = None  # (N,) newest occurrence position, for tie-breaking
    rank: np.ndarray | None = None  # (N,) position in the drafter's ranking, 0 = best
    node_match: np.ndarray | None = None  # (N,) match length per node, when they differ

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def node_matches(self) -> np.ndarray:
        """(N,) the match length each node continues (``match_len`` unless per node)."""
        if self.node_match is not None:
            return self.node_match
        return np.full(len(self), self.match_len, dtype=np.int64)

    def ranks(self) -> np.ndarray:
        """Ranking of the nodes (pre-order when the drafter gave none)."""
        return self.rank if self.rank is not None else np.arange(len(self), dtype=np.int64)

    def top(self, k: int) -> DraftTree:
        """The sub-tree of the ``k`` best-ranked nodes (ancestor-closed: a parent always
        ranks before its children), still in pre-order."""
        if k >= len(self):
            return self
        keep = np.flatnonzero(self.ranks() < k)
        remap = np.full(len(self), -1, dtype=np.int64)
        remap[keep] = np.arange(keep.size)
        parents = self.parents[keep]
        parents = np.where(parents >= 0, remap[np.maximum(parents, 0)], -1)
        return DraftTree(self.tokens[keep], parents, self.depths[keep],
                         self.frequencies[keep] if self.frequencies.size else self.frequencies,
                         self.match_len, None, self.ranks()[keep],
                         None if self.node_match is None else self.node_match[keep])

    def best_path(self) -> list[int]:
        """Tokens of the chain that follows the best-ranked child at every level (for a
        verifier of chains, not trees). Example: ranks of ``cat sat`` / ``dog`` as in the
        class docstring, ``cat`` ranked first -> ``[cat, sat]``."""
        rank = self.ranks()
        best: dict[int, int] = {}  # parent -> its best-ranked child
        for i, par in enumerate(self.parents.tolist()):
            if par not in best or rank[i] < rank[best[par]]:
                best[par] = i
        out: list[int] = []
        node = best.get(-1)
        while node is not None:
            out.append(int(self.tokens[node]))
            node = best.get(node)
        return out

    def sibling_shares(self) -> np.ndarray:
        """(N,) each node's frequency over the summed frequencies of it and its siblings
        in this tree: how often it was the continuation, of those kept. All 1.0 without
        frequencies."""
        if not self.frequencies.size:
            return np.ones(len(self))
        freq = self.frequencies.astype(np.float64)
        totals = np.zeros(len(self) + 1)  # [parent + 1] -> sum over its children
        np.add.at(totals, self.parents + 1, freq)
        return freq / np.maximum(totals[self.parents + 1], 1e-12)

    def path_nodes(self, tokens: list[int]) -> list[int]:
        """Indices of the nodes along ``tokens`` from the top, as far as the tree has them."""
        children = self.children()
        out: list[int] = []
        row = 0
        for tok in tokens:
            child = children[row].get(tok)
            if child is None:
                break
            out.append(child)
            row = child + 1
        return out

    def descendants(self, node: int) -> np.ndarray:
        """(N,) bool: nodes strictly below ``node`` (pre-order makes one pass enough)."""
        below = np.zeros(len(self), dtype=bool)
        for i, par in enumerate(self.parents.tolist()):
            below[i] = par == node or (par >= 0 and below[par])
        return below

    @staticmethod
    def empty() -> DraftTree:
        z = np.zeros(0, dtype=np.int64)
        return DraftTree(z, z, z, z, 0)

    @staticmethod
    def chain(tokens: list[int] | np.ndarray, match_len: int = 0) -> DraftTree:
        """A single path: each token is the child of the previous one."""
        t = np.asarray(tokens, dtype=np.int64)
        n = t.shape[0]
        return DraftTree(t, np.arange(-1, n - 1, dtype=np.int64),
                         np.arange(1, n + 1, dtype=np.int64), np.ones(n, np.int64), match_len)

    def children(self) -> list[dict[int, int]]:
        """``children()[i + 1]`` maps token -> node index for node i; entry 0 is the root."""
        out: list[dict[int, int]] = [{} for _ in range(len(self) + 1)]
        pairs = zip(self.tokens.tolist(), self.parents.tolist(), strict=True)
        for i, (tok, par) in enumerate(pairs):
            out[par + 1].setdefault(tok, i)
        return out

    def paths(self) -> list[tuple[int, ...]]:
        """Every node's token path from the top (for tests and debugging)."""
        out: list[tuple[int, ...]] = []
        for tok, par in zip(self.tokens.tolist(), self.parents.tolist(), strict=True):
            out.append((out[par] if par >= 0 else ()) + (tok,))
        return out

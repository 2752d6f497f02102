"""Offline accept lengths from a known greedy answer.

Greedy output is deterministic, so once the plain greedy answer is known, the accept
length any drafter would get can be replayed without the model: at each step the
verifier accepts the longest draft path that equals the true continuation, plus one
bonus token. Two uses:

- ``oracle_accept_length``: the ceiling for any drafter that copies from the context,
  taking at each step the best continuation after *any* earlier occurrence of the last
  token in prompt + answer so far.
- ``replay_accept_length``: what a given proposer would get (for tuning n, L_p and
  num_draft without running the model).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .proposers import Proposer
from .trie import NGramTrie


def oracle_accept_length(prompt: Sequence[int], answer: Sequence[int]) -> float:
    """Mean tokens per step of the best context-copying drafter (bonus token included)."""
    seq = np.asarray(list(prompt) + list(answer), dtype=np.int64)
    p, total = len(prompt), len(answer)
    t, steps = 0, 0
    while t < total:
        # Committed: seq[: p + t]; the next token to verify is answer[t].
        end = p + t
        last = seq[end - 1]
        occ = np.flatnonzero(seq[: end - 1] == last)
        best = 0
        remaining = total - t
        for j in occ.tolist():
            src = seq[j + 1 : min(j + 1 + remaining - 1, end)]  # copy only what exists
            tgt = seq[end : end + src.size]
            agree = int(np.cumprod(src == tgt).sum()) if src.size else 0
            best = max(best, agree)
        t += best + 1
        steps += 1
    return total / steps if steps else 0.0


def replay_accept_lengths(
    propose: Proposer,
    trie: NGramTrie,
    prompt: Sequence[int],
    answer: Sequence[int],
    num_draft: int,
    prefix_len: int,
) -> list[int]:
    """Accept length of every step a proposer would take to produce ``answer``.

    ``trie`` holds the draft sources; the answer is appended as it is "generated",
    exactly as the generator does. The first token comes from prefill (not a step).
    """
    history = list(prompt) + [answer[0]]
    trie.extend([answer[0]])
    t, out = 1, []
    while t < len(answer):
        tree = propose(trie, history[-prefix_len:], num_draft, len(answer) - t - 1)
        # Walk the tree along the true continuation.
        children = tree.children()
        row, accepted = 0, 0
        while t + accepted < len(answer):
            nxt = children[row].get(answer[t + accepted])
            if nxt is None:
                break
            row, accepted = nxt + 1, accepted + 1
        step = min(accepted + 1, len(answer) - t)
        out.append(step)
        history.extend(answer[t : t + step])
        trie.extend(answer[t : t + step])
        t += step
    return out

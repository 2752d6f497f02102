"""Offline accept lengths from a known greedy answer.

Greedy output is deterministic, so once the plain greedy answer is known, the accept
length any drafter would get can be replayed without the model: at each step the
verifier accepts the longest draft path that equals the true continuation, plus one
bonus token. Two uses:

- ``oracle_accept_length``: the ceiling for any drafter that copies from the context,
  taking at each step the best continuation after *any* earlier occurrence of the last
  token in prompt + answer so far; with ``max_draft=K``, the ceiling for one that
  verifies at most K nodes per step.
- ``replay_accept_lengths``: what a given drafter would get (for tuning n, L_p and
  num_draft without running the model);
- ``hindsight_accept_lengths``: what a drafter's ranking would get if every step
  verified the tree size that, knowing the answer, pays best: the ceiling of any draft
  budget over that ranking (a budget only chooses how many ranked nodes to verify).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .draft_tree import DraftTree
from .drafter import Drafter


def oracle_accept_lengths(prompt: Sequence[int], answer: Sequence[int],
                          max_draft: int | None = None) -> list[int]:
    """Per-step accept lengths of the best context-copying drafter (bonus included).

    Counted like the generator: the first answer token comes from prefill, so steps
    start at the second token. ``max_draft`` caps the draft tokens verified per step:
    the ceiling for a drafter that verifies at most that many nodes (a tree of K nodes
    holds no path longer than K). Taking the longest copy at every step is optimal
    over the whole answer: from any later position the same source, shifted, still
    reaches at least as far, so being ahead never costs a step.

    Example: prompt ``5 6 7 8``, answer ``1 5 6 7 8 9``: step one verifies ``5`` after
    ``1`` (no earlier ``1``: accept 1); step two copies ``6 7 8`` after the prompt's
    ``5`` and adds the bonus ``9``: ``[1, 4]``; with ``max_draft=2``: ``[1, 3, 1]``.
    """
    if max_draft is not None and max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {max_draft}")
    seq = np.asarray(list(prompt) + list(answer), dtype=np.int64)
    p, total = len(prompt), len(answer)
    t, out = 1, []
    while t < total:
        # Committed: seq[: p + t]; the next token to verify is answer[t].
        end = p + t
        room = total - t - 1  # draft tokens that can still be verified before the end
        if max_draft is not None:
            room = min(room, max_draft)
        best = _best_copy(seq, end, room)
        out.append(best + 1)
        t += best + 1
    return out


def _best_copy(seq: np.ndarray, end: int, room: int) -> int:
    """The longest run of ``seq[end:]`` (at most ``room`` tokens) that follows an earlier
    occurrence of ``seq[end - 1]``, copying only committed tokens (``seq[:end]``)."""
    occ = np.flatnonzero(seq[: end - 1] == seq[end - 1])
    if room <= 0 or occ.size == 0:
        return 0
    src = occ[:, None] + 1 + np.arange(room)  # (R, room) source positions
    agree = (src < end) & (seq[np.minimum(src, end - 1)] == seq[end : end + room])
    return int(np.cumprod(agree, axis=1).sum(axis=1).max())


def same_size_bounds(prompt: Sequence[int], answer: Sequence[int],
                     accept_lengths: Sequence[int], draft_sizes: Sequence[int]) -> list[int]:
    """Per step of a real run, the most a context-copying drafter could have accepted
    there (bonus included) with the same number of draft nodes the run verified.

    Steps start where the run's own steps started (the first token comes from
    prefill). ``sum(accept_lengths) / sum(bounds)`` then says how well the run chose
    its nodes, apart from how many it chose to verify.

    Example: prompt ``5 6 7 8``, answer ``1 5 6 7 8 9``, a run that stepped
    ``[1, 1, 3]`` with ``[0, 3, 3]`` nodes: after ``5`` three nodes could have held
    ``6 7 8`` (bound 4) but the run accepted only its bonus token; after ``6`` it
    copied ``7 8``, all there was (bound 3): ``[1, 4, 3]``.
    """
    if len(accept_lengths) != len(draft_sizes):
        raise ValueError(f"{len(accept_lengths)} accept lengths but {len(draft_sizes)} "
                         "draft sizes: one of each per step")
    if sum(accept_lengths) != max(len(answer) - 1, 0):
        raise ValueError(f"accept lengths add up to {sum(accept_lengths)}, the answer has "
                         f"{len(answer) - 1} tokens after the first")
    seq = np.asarray(list(prompt) + list(answer), dtype=np.int64)
    p, total = len(prompt), len(answer)
    t, out = 1, []
    for accepted, size in zip(accept_lengths, draft_sizes, strict=True):
        room = min(total - t - 1, size)
        out.append(_best_copy(seq, p + t, room) + 1)
        t += accepted
    return out


def oracle_accept_length(prompt: Sequence[int], answer: Sequence[int],
                         max_draft: int | None = None) -> float:
    """Mean tokens per step of the best context-copying drafter (0.0: nothing to verify)."""
    steps = oracle_accept_lengths(prompt, answer, max_draft)
    return sum(steps) / len(steps) if steps else 0.0


def replay_accept_lengths(drafter: Drafter, answer: Sequence[int],
                          max_new_tokens: int | None = None,
                          drafted: list[int] | None = None) -> list[int]:
    """Accept length of every step ``drafter`` would take to produce ``answer``.

    The drafter is driven exactly as the generator drives it (``propose`` with the
    same depth cap, ``max_new_tokens - produced - 1``, then ``update`` with what the
    step emitted); only the verification is replaced by a walk along the known answer.
    The first token comes from prefill (not a step). ``drafted``, when given, receives
    each step's number of draft nodes (its cost).
    """
    steps, sizes = _walk(drafter, answer, max_new_tokens,
                         lambda tree, path: (len(tree), len(path) + 1))
    if drafted is not None:
        drafted.extend(sizes)
    return steps


def hindsight_accept_lengths(make_drafter: Callable[[], Drafter], answer: Sequence[int],
                             cost: Callable[[int], float], max_new_tokens: int | None = None,
                             drafted: list[int] | None = None, rounds: int = 4) -> list[int]:
    """Accept lengths when each step verifies the best number of the ranked candidates
    of a drafter (``make_drafter()``, fresh for every replay) in hindsight: the ceiling
    of a draft budget over that ranking.

    A budget picks K, the ``K`` best-ranked candidates (an ancestor-closed tree), and
    the step accepts the true path's nodes inside it plus the bonus token: with ``m_j``
    the largest rank on the first ``j`` nodes of the true path, verifying ``m_j + 1``
    nodes accepts ``j + 1`` tokens. Knowing the answer, each step takes the K (0: a
    plain step) maximising ``accepted - rate * cost(K)``, ``cost(K)`` the seconds of a
    forward verifying K nodes; ``rate`` starts at plain decoding's tokens per second
    and is set to the result's own over ``rounds`` replays (Dinkelbach's iteration for
    the best tokens per second). The drafter must have no budget and a ``num_draft``
    as large as the budget's cap. ``drafted`` receives each step's K.

    Example: candidates ``a`` (rank 0), ``b`` under it (rank 2), ``c`` (rank 1), true
    continuation ``a b``: K = 1 accepts 2 tokens, K = 3 accepts 3; with cost 1, 1.2,
    1.4, 1.6 for K = 0..3 and rate 1.5, K = 3 scores 3 - 2.4 = 0.6 and K = 1 scores
    2 - 1.8 = 0.2, so the step verifies 3 nodes.
    """
    rate = 1.0 / cost(0)
    steps: list[int] = []
    sizes: list[int] = []
    for _ in range(max(rounds, 1)):
        drafter = make_drafter()
        if drafter.budget is not None:
            raise ValueError("hindsight replay chooses the tree size itself: the drafter "
                             "must have no budget")
        steps, sizes = _hindsight_round(drafter, answer, cost, rate, max_new_tokens)
        rate = sum(steps) / sum(cost(k) for k in sizes) if steps else rate
    if drafted is not None:
        drafted.extend(sizes)
    return steps


def _hindsight_round(drafter: Drafter, answer: Sequence[int], cost: Callable[[int], float],
                     rate: float, max_new_tokens: int | None) -> tuple[list[int], list[int]]:
    """One replay at a fixed ``rate``: (accept lengths, verified sizes) per step."""

    def best(tree: DraftTree, path: list[int]) -> tuple[int, int]:
        reach = np.maximum.accumulate(tree.ranks()[path]) + 1 if path else []
        options = [(0, 1), *((int(k), j) for j, k in enumerate(reach, start=2))]
        # verify k nodes, accept j tokens; the first best wins a tie (the fewest nodes)
        return max(options, key=lambda kj: kj[1] - rate * cost(kj[0]))

    return _walk(drafter, answer, max_new_tokens, best)


def _walk(drafter: Drafter, answer: Sequence[int], max_new_tokens: int | None,
          choose: Callable[[DraftTree, list[int]], tuple[int, int]]
          ) -> tuple[list[int], list[int]]:
    """Drive ``drafter`` along ``answer`` as the generator does and return each step's
    (accept length, draft nodes verified).

    ``propose`` gets the generator's depth cap, ``max_new_tokens - produced - 1``, and
    ``update`` what the step emitted; the first token comes from prefill (not a step).
    ``choose(tree, path)`` stands in for verification: ``path`` is the true
    continuation's nodes in the proposed tree (at most the tokens left after the bonus
    one), and it returns ``(nodes verified, tokens accepted)``.
    """
    answer = list(answer)
    limit = max_new_tokens if max_new_tokens is not None else len(answer)
    drafter.update([answer[0]])
    t, steps, sizes = 1, [], []
    while t < len(answer):
        tree = drafter.propose(limit - t - 1)
        path = tree.path_nodes(answer[t:])[: len(answer) - t - 1]
        size, step = choose(tree, path)
        steps.append(step)
        sizes.append(size)
        drafter.update(answer[t : t + step])
        t += step
    return steps, sizes

"""How many nodes of its tree each row of a batched step verifies: only what pays.

An unpadded batched step (each row's ``[last] + tree`` end to end) costs about
``T = a + b * N + e * R`` seconds, ``N = rows + sum(nodes)`` the queries verified and
``R`` the rows that drafted, and emits ``rows + sum(p)`` tokens, ``p`` the acceptance
chances of the verified nodes. One row's draft budget prices its tree on the
single-sequence latency curve, where on a CPU a node costs a few percent of a step; in a
batch of a dozen rows on two cores the step is compute-bound already, and a node costs
about a third of a row's own share, so only likely nodes pay there.

:class:`TreeShares` keeps the step's cost as :class:`~.batch_budget.StepCost` (fitted
online from the batch's own steps) and, per step, cuts each row's tree to the
``k_b`` best-ranked nodes (:meth:`~.draft_tree.DraftTree.top`) that maximise
``E / T`` over all rows together (:func:`~.batch_budget.choose_lengths`: for a tree,
node ``j`` in rank order adds its own chance ``p_j``, the rows' draft budgets'
estimates). Until the cost is fitted, and on one step in ``explore_every``, each row
keeps a random share of its tree, so the fit sees varied ``N`` and ``R``.

The answers do not change: verification keeps greedy tokens and sampling
distributions whatever the tree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from .batch_budget import StepCost, choose_lengths


class TreeShares:
    """Per-row node counts for batched steps, from the steps' measured cost."""

    def __init__(self, explore_every: int = 16, seed: int = 0) -> None:
        self.cost = StepCost()
        self.explore_every = explore_every
        self._rng = random.Random(seed)
        self._steps = 0

    def lengths(self, chances: Sequence[np.ndarray]) -> list[int]:
        """How many nodes each row keeps; ``chances[b]`` (N_b,): row b's nodes'
        acceptance chances in rank order."""
        self._steps += 1
        fit = self.cost.fit()
        if fit is None or self._steps % self.explore_every == 0:
            return [self._rng.randint(0, len(c)) for c in chances]
        return choose_lengths([c.tolist() for c in chances], *fit)

    def observe(self, lengths: Sequence[int], seconds: float) -> None:
        """A step whose rows verified ``lengths`` nodes each took ``seconds``."""
        if seconds > 0 and lengths:
            self.cost.observe(len(lengths) + sum(lengths), seconds,
                              sum(1 for k in lengths if k))

"""How many draft tokens each row of a batch gets: drafting only what pays for itself.

The batch's counterpart of :mod:`~ngram_trie_rag.drafting.budget` (one request's tree,
priced by the model's latency curve): here every row's chain is priced together, by a
step cost fitted online from the batch's own steps.

A batching engine verifies every row's draft in one forward pass. On a CPU, or a GPU at
high concurrency, each extra token costs about as much as a row's own, and a row that
drafts at all takes a slower path (several query tokens instead of one), so drafts that
are rarely accepted lower throughput. Modelled from what the engine shows each step:

- cost: ``T = a + b * N + e * R`` seconds, where ``N = rows + sum(draft lengths)`` is
  the tokens verified and ``R`` the rows that drafted, fitted by exponentially weighted
  least squares on the wall time between consecutive proposals (:class:`StepCost`);
- value: the chance that a row's draft token at depth ``j`` is accepted, ``c(j) =
  q(1) * ... * q(j)``, where ``q`` is the acceptance rate, given the tokens before were
  accepted, of tokens like it (:func:`token_class`: how dominant the token was among
  the trie's continuations, and whether it is the first): the request's own counts,
  shrunk to the batch-wide rate (:class:`AcceptRates`).

A step emits ``E = rows + sum c`` tokens in ``T`` seconds; :func:`choose_lengths`
picks every row's length to maximise ``E / T`` (exactly, by Dinkelbach's iteration:
for a trial rate ``r`` each row alone maximises its ``sum c - r * cost``). Under load
``E / T`` is high and only near-certain tokens are drafted; alone on a GPU ``b`` and
``e`` are near zero and whole paths are.

Until the cost is known (a few steps with different ``N``), and on one step in
``explore_every``, each row drafts a random part of its path, so the fit keeps seeing
varied ``N`` and ``R`` even when the batch and the paths stay the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


class StepCost:
    """Step seconds as ``a + b * tokens + e * drafting_rows``, exponentially weighted
    least squares."""

    def __init__(self, decay: float = 0.98, min_samples: int = 8) -> None:
        self.decay = decay
        self.min_samples = min_samples
        self.samples = 0
        self._xx = np.zeros((3, 3))  # weighted sum of x x^T, x = (1, tokens, rows)
        self._xt = np.zeros(3)  # weighted sum of x * seconds

    def observe(self, tokens: int, seconds: float, drafting_rows: int = 0) -> None:
        x = np.array([1.0, tokens, drafting_rows])
        self._xx = self.decay * self._xx + np.outer(x, x)
        self._xt = self.decay * self._xt + x * seconds
        self.samples += 1

    def fit(self) -> tuple[float, float, float] | None:
        """``(a, b, e)``, or None while too few samples or too little spread in
        ``tokens``. Without spread in the drafting rows, ``e`` is 0 (folded into ``a``
        and ``b``); a negative coefficient (noise) is dropped and the rest refitted."""
        if self.samples < self.min_samples:
            return None
        w = self._xx[0, 0]
        mean = self._xx[0] / w
        var = np.diag(self._xx) / w - mean * mean
        if var[1] < 0.25:  # N (nearly) constant: the slope is not identified
            return None
        use = [0, 1] + ([2] if var[2] >= 0.05 else [])
        while True:
            sub = self._xx[np.ix_(use, use)]
            try:
                beta = np.linalg.solve(sub, self._xt[use])
            except np.linalg.LinAlgError:
                return None
            negative = [f for f, v in zip(use[1:], beta[1:], strict=True) if v < 0]
            if not negative:
                break
            use.remove(negative[-1])
        coef = dict(zip(use, beta.tolist(), strict=True))
        return max(coef[0], 0.0), coef.get(1, 0.0), coef.get(2, 0.0)


def token_class(depth: int, share: float, frequency: int) -> int:
    """Which acceptance rate a draft token is judged by (0..7).

    ``share`` is the token's frequency over its siblings' in the trie (how often this
    continuation followed, of all that did); ``frequency`` its count. The first token
    (depth 1) is kept apart: it alone depends on how well the tail matched.
    """
    if share < 0.5:
        level = 0
    elif share < 0.99:
        level = 1
    else:
        level = 2 if frequency < 2 else 3  # the only continuation: seen once, or more
    return (0 if depth == 1 else 4) + level


NUM_CLASSES = 8


@dataclass
class _Counts:
    tried: list[float] = field(default_factory=lambda: [0.0] * NUM_CLASSES)  # weighted
    taken: list[float] = field(default_factory=lambda: [0.0] * NUM_CLASSES)

    def add(self, classes: Sequence[int], accepted: int, decay: float = 1.0) -> None:
        # Token j was tried iff every token before it was accepted: j <= accepted.
        if decay != 1.0:
            self.tried = [x * decay for x in self.tried]
            self.taken = [x * decay for x in self.taken]
        for j, cls in enumerate(classes[:accepted + 1]):
            self.tried[cls] += 1.0
            self.taken[cls] += 1.0 if j < accepted else 0.0

    def rate(self, cls: int, prior: float, weight: float) -> float:
        return (self.taken[cls] + weight * prior) / (self.tried[cls] + weight)


class AcceptRates:
    """Acceptance rate per token class, given the tokens before it were accepted:
    batch-wide, and per request shrunk toward the batch-wide rate."""

    def __init__(self, decay: float = 0.995, weight: float = 2.0) -> None:
        self.decay = decay
        self.weight = weight  # how many trials the batch-wide rate counts as per request
        self._all = _Counts()
        self._by_request: dict[str, _Counts] = {}

    def observe(self, req_id: str, classes: Sequence[int], accepted: int) -> None:
        """``classes``: the classes of the tokens drafted; ``accepted`` of them taken."""
        if not classes:
            return
        accepted = max(0, min(accepted, len(classes)))
        self._all.add(classes, accepted, self.decay)
        self._by_request.setdefault(req_id, _Counts()).add(classes, accepted)

    def cumulative(self, req_id: str, classes: Sequence[int]) -> list[float]:
        """``c(1..k)`` for a path of tokens of ``classes``: each one's acceptance chance."""
        own = self._by_request.get(req_id, _Counts())
        out, c = [], 1.0
        for cls in classes:
            batch = self._all.rate(cls, prior=0.5, weight=1.0)
            c *= own.rate(cls, prior=batch, weight=self.weight)
            out.append(c)
        return out

    def retain(self, live: Iterable[str]) -> None:
        keep = set(live)
        for req_id in [r for r in self._by_request if r not in keep]:
            del self._by_request[req_id]


def choose_lengths(values: Sequence[Sequence[float]], a: float, b: float,
                   e: float = 0.0) -> list[int]:
    """Per row, how many of its draft tokens to keep so that tokens per second is highest.

    ``values[i][j]`` is row ``i``'s chance of accepting its token at depth ``j + 1``
    (its length is the row's path length). Every row costs and emits one token of its
    own; a draft of ``k`` tokens adds ``b * k + e`` seconds and ``sum(values[i][:k])``
    expected tokens.

    A fixed cost per step (``a``) that dwarfs a token's (``b``) makes likely tokens
    worth verifying; when only tokens cost, none is (each emits less than one):

    >>> choose_lengths([[0.9, 0.8, 0.1], [0.3]], a=0.2, b=0.01)
    [2, 1]
    >>> choose_lengths([[0.9, 0.8, 0.1], [0.3]], a=0.0, b=0.01)
    [0, 0]
    >>> choose_lengths([[0.9, 0.8, 0.1], [0.3]], a=0.2, b=0.01, e=0.05)  # drafting costs
    [2, 0]
    """
    rows = len(values)
    prefix = [np.concatenate([[0.0], np.cumsum(v)]) for v in values]  # [i][k] = sum c
    lengths = [0] * rows
    rate = rows / (a + b * rows) if rows else 0.0  # tokens per second without drafts
    for _ in range(50):
        for i, p in enumerate(prefix):
            k = np.arange(p.size)
            gain = p - rate * (b * k + e * (k > 0))
            lengths[i] = int(np.argmax(gain))  # first best: no tie drafts more
        emitted = rows + sum(float(p[k]) for p, k in zip(prefix, lengths, strict=True))
        seconds = a + b * (rows + sum(lengths)) + e * sum(k > 0 for k in lengths)
        new = emitted / seconds if seconds > 0 else float("inf")
        if not new > rate * (1 + 1e-12):
            break
        rate = new
    return lengths


class DraftLengths:
    """The per-step policy: observe the last step, then cut each row's path.

    Call :meth:`step` once per proposal with the rows' request ids, the tokens each row
    accepted from its last draft (None where the row is new or not decoding), the
    seconds since the last proposal ended, and the :func:`token_class` of each token of
    each row's candidate path; it returns how many of them to draft, and remembers
    what was drafted for the next step.
    """

    def __init__(self, explore_every: int = 16, seed: int = 0) -> None:
        self.cost = StepCost()
        self.rates = AcceptRates()
        self.explore_every = explore_every
        self._rng = random.Random(seed)
        self._drafted: dict[str, Sequence[int]] = {}  # req id -> classes drafted
        self._steps = 0

    def step(self, req_ids: Sequence[str], accepted: Sequence[int | None],
             seconds: float | None, classes: Sequence[Sequence[int]]) -> list[int]:
        self._observe(req_ids, accepted, seconds)
        self._steps += 1
        fit = self.cost.fit()
        if fit is None or self._steps % self.explore_every == 0:
            lengths = [self._rng.randint(0, len(c)) for c in classes]
        else:
            values = [self.rates.cumulative(r, c)
                      for r, c in zip(req_ids, classes, strict=True)]
            lengths = choose_lengths(values, *fit)
        self._drafted = {r: c[:m] for r, c, m in zip(req_ids, classes, lengths, strict=True)}
        return lengths

    def _observe(self, req_ids: Sequence[str], accepted: Sequence[int | None],
                 seconds: float | None) -> None:
        # The step just verified the previous drafts of every row here, if all of them
        # were there last step too and decoding (new rows mean prefill work in the step).
        whole = seconds is not None and all(
            r in self._drafted and n is not None
            for r, n in zip(req_ids, accepted, strict=True))
        if whole:
            tokens = sum(1 + len(self._drafted[r]) for r in req_ids)
            drafting = sum(1 for r in req_ids if self._drafted[r])
            self.cost.observe(tokens, float(seconds), drafting)  # type: ignore[arg-type]
        for r, n in zip(req_ids, accepted, strict=True):
            if n is not None and r in self._drafted:
                self.rates.observe(r, self._drafted[r], n)
        self.rates.retain(req_ids)

"""How many draft tokens each row of a batch gets: drafting only what pays for itself.

A batching engine verifies every row's draft in one forward pass. Its cost grows with
the tokens it processes, ``N = rows + sum(draft lengths)``; on a CPU, or a GPU at high
concurrency, each extra token costs about as much as a row's own, so drafts that are
rarely accepted lower throughput. Modelled from what the engine shows each step:

- cost: ``T(N) = a + b * N`` seconds, fitted by exponentially weighted least squares
  on the wall time between consecutive proposals (:class:`StepCost`);
- value: the chance that a row's draft token at depth ``j`` is accepted, ``c(j) =
  q(1) * ... * q(j)``, where ``q(j)`` is the acceptance rate at depth ``j`` given depth
  ``j - 1`` was accepted: the request's own counts, shrunk to the batch-wide rate
  (:class:`AcceptRates`).

A step emits ``E = rows + sum c`` tokens in ``T`` seconds. Adding one draft token of
value ``c`` raises ``E / T`` iff ``c / b > E / T``; since every token costs the same
``b``, taking tokens in order of decreasing ``c`` while that holds maximises ``E / T``
(:func:`choose_lengths`). Under load ``E / T`` is high and only near-certain tokens
are drafted; alone on a GPU ``b`` is near zero and whole paths are.

Until the cost is known (a few steps with different ``N``), and on one step in
``explore_every``, each row drafts a random part of its path, so the fit keeps seeing
varied ``N`` even when the batch and the paths stay the same.
NumPy-free plain Python: a few hundred rows times ``k`` values per step.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class StepCost:
    """Step seconds as ``a + b * tokens``, exponentially weighted least squares."""

    def __init__(self, decay: float = 0.98, min_samples: int = 8) -> None:
        self.decay = decay
        self.min_samples = min_samples
        self.samples = 0
        self._w = self._n = self._nn = self._t = self._nt = 0.0  # weighted sums

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._n = d * self._n + tokens
        self._nn = d * self._nn + tokens * tokens
        self._t = d * self._t + seconds
        self._nt = d * self._nt + tokens * seconds
        self.samples += 1

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``, or None while too few samples or too little spread in ``tokens``."""
        if self.samples < self.min_samples:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n < 0.25:  # N (nearly) constant: the slope is not identified
            return None
        b = max((self._nt / self._w - mean_n * mean_t) / var_n, 0.0)
        a = max(mean_t - b * mean_n, 0.0)
        return a, b


@dataclass
class _Counts:
    tried: list[float] = field(default_factory=list)  # [depth - 1] -> weighted trials
    taken: list[float] = field(default_factory=list)  # [depth - 1] -> weighted acceptances

    def add(self, drafted: int, accepted: int, decay: float = 1.0) -> None:
        # Depth j was tried iff j <= drafted and depth j - 1 was accepted: j <= accepted + 1.
        grow = drafted - len(self.tried)
        if grow > 0:
            self.tried += [0.0] * grow
            self.taken += [0.0] * grow
        if decay != 1.0:
            self.tried = [x * decay for x in self.tried]
            self.taken = [x * decay for x in self.taken]
        for j in range(min(drafted, accepted + 1)):
            self.tried[j] += 1.0
            self.taken[j] += 1.0 if j < accepted else 0.0

    def rate(self, depth: int, prior: float, weight: float) -> float:
        i = depth - 1
        if i >= len(self.tried):
            return prior
        return (self.taken[i] + weight * prior) / (self.tried[i] + weight)


class AcceptRates:
    """Per-depth acceptance rates: batch-wide, and per request shrunk toward them."""

    def __init__(self, decay: float = 0.995, weight: float = 2.0) -> None:
        self.decay = decay
        self.weight = weight  # how many trials the batch-wide rate counts as per request
        self._all = _Counts()
        self._by_request: dict[str, _Counts] = {}

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        if drafted < 1:
            return
        accepted = max(0, min(accepted, drafted))
        self._all.add(drafted, accepted, self.decay)
        self._by_request.setdefault(req_id, _Counts()).add(drafted, accepted)

    def cumulative(self, req_id: str, k: int) -> list[float]:
        """``c(1..k)`` for ``req_id``: the chance each depth's token is accepted."""
        own = self._by_request.get(req_id, _Counts())
        out, c = [], 1.0
        for depth in range(1, k + 1):
            batch = self._all.rate(depth, prior=0.5, weight=1.0)
            c *= own.rate(depth, prior=batch, weight=self.weight)
            out.append(c)
        return out

    def retain(self, live: Iterable[str]) -> None:
        keep = set(live)
        for req_id in [r for r in self._by_request if r not in keep]:
            del self._by_request[req_id]


def choose_lengths(values: Sequence[Sequence[float]], a: float, b: float) -> list[int]:
    """Per row, how many of its draft tokens to keep so that tokens per second is highest.

    ``values[i][j]`` is row ``i``'s chance of accepting its token at depth ``j + 1``
    (non-increasing in ``j``; its length is the row's path length). Rows without a
    draft still cost and emit one token each.

    A fixed cost per step (``a``) that dwarfs a token's (``b``) makes likely tokens
    worth verifying; when only tokens cost, none is (each emits less than one):

    >>> choose_lengths([[0.9, 0.8, 0.1], [0.3]], a=0.2, b=0.01)
    [2, 1]
    >>> choose_lengths([[0.9, 0.8, 0.1], [0.3]], a=0.0, b=0.01)
    [0, 0]
    """
    rows = len(values)
    emitted, seconds = float(rows), a + b * rows
    lengths = [0] * rows
    heap = [(-v[0], i) for i, v in enumerate(values) if len(v)]
    heapq.heapify(heap)
    while heap:
        neg, i = heapq.heappop(heap)
        c = -neg
        if c * seconds <= b * emitted:  # c / b <= E / T: this token (and all later) lose
            break
        emitted, seconds = emitted + c, seconds + b
        lengths[i] += 1
        if lengths[i] < len(values[i]):
            heapq.heappush(heap, (-values[i][lengths[i]], i))
    return lengths


class DraftLengths:
    """The per-step policy: observe the last step, then cut each row's path.

    Call :meth:`step` once per proposal with the rows' request ids, the tokens each row
    accepted from its last draft (None where the row is new or not decoding), the
    seconds since the last proposal ended, and each row's full candidate path length;
    it returns the lengths to draft and remembers them for the next step.
    """

    def __init__(self, explore_every: int = 16, seed: int = 0) -> None:
        self.cost = StepCost()
        self.rates = AcceptRates()
        self.explore_every = explore_every
        self._rng = random.Random(seed)
        self._drafted: dict[str, int] = {}
        self._steps = 0

    def step(self, req_ids: Sequence[str], accepted: Sequence[int | None],
             seconds: float | None, path_lengths: Sequence[int]) -> list[int]:
        self._observe(req_ids, accepted, seconds)
        self._steps += 1
        fit = self.cost.fit()
        if fit is None or self._steps % self.explore_every == 0:
            lengths = [self._rng.randint(0, n) for n in path_lengths]
        else:
            values = [self.rates.cumulative(r, n)
                      for r, n in zip(req_ids, path_lengths, strict=True)]
            lengths = choose_lengths(values, *fit)
        self._drafted = dict(zip(req_ids, lengths, strict=True))
        return lengths

    def _observe(self, req_ids: Sequence[str], accepted: Sequence[int | None],
                 seconds: float | None) -> None:
        # The step just verified the previous drafts of every row here, if all of them
        # were there last step too and decoding (new rows mean prefill work in the step).
        whole = seconds is not None and all(
            r in self._drafted and n is not None for r, n in zip(req_ids, accepted, strict=True))
        if whole:
            tokens = sum(1 + self._drafted[r] for r in req_ids)
            self.cost.observe(tokens, float(seconds))  # type: ignore[arg-type]
        for r, n in zip(req_ids, accepted, strict=True):
            if n is not None and r in self._drafted:
                self.rates.observe(r, self._drafted[r], n)
        self.rates.retain(req_ids)

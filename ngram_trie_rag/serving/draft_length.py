"""How many draft tokens each row of a batch gets: drafting only what pays for itself.

A batching engine verifies every row's draft in one forward pass. Its cost grows with
the tokens it processes, ``N = rows + sum(draft lengths)``; on a CPU, or a GPU at high
concurrency, each extra token costs about as much as a row's own, so drafts that are
rarely accepted lower throughput. Modelled from what the engine shows each step:

- cost: ``T(N) = a + b * N`` seconds, fitted by exponentially weighted least squares
  on the wall time between consecutive proposals (:class:`StepCost`);
- value: the chance that a row's draft token at depth ``j`` is accepted, ``c(j) =
  q(1) * ... * q(j)``, where ``q`` is the acceptance rate, given the tokens before were
  accepted, of tokens like it (:func:`token_class`: how dominant the token was among
  the trie's continuations, and whether it is the first): the request's own counts,
  shrunk to the batch-wide rate (:class:`AcceptRates`).

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
            self.cost.observe(tokens, float(seconds))  # type: ignore[arg-type]
        for r, n in zip(req_ids, accepted, strict=True):
            if n is not None and r in self._drafted:
                self.rates.observe(r, self._drafted[r], n)
        self.rates.retain(req_ids)

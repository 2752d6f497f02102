"""Each row's tree cap in a padded batched step, chosen by the throughput the steps measure.

A padded step (compiled, or on a GPU) costs its largest tree in every row, so one cap
serves all rows. An unpadded step (eager, fp32 on a CPU) costs each row's own nodes,
and each row keeps what pays instead (:mod:`ngram_trie_rag.drafting.batch_trees`).

:func:`~.draft_cap.draft_cap` prices a batched forward on the single-sequence latency
curve, and trees there are worth what they cost only if enough of their nodes are
accepted. Measured on two CPU cores (default model, 12 Spec-Bench RAG prompts,
``bench-serve``): with the curve's cap, the trie's output at 4 and 16 users was 0.80x
and 0.70x that of the same server without drafts, while at 1 user it was 1.78x. The
batched forward (the model's own modules over every row's cache) does not cost what the
curve says, and acceptance varies with the requests.

So :class:`CapChooser` treats the cap as a choice to learn, as the thread governor
treats thread counts: per batch size (rounded up to a power of two) it keeps an
exponentially weighted mean of the tokens per second a step emitted (all rows' emitted
tokens over the step's wall time: drafting, forward, acceptance) for each cap it ran,
tries every cap ``TRIES`` times first (the curve's cap first, then none, then the
smaller buckets and the one above the curve's cap), then runs the best, and every
``EXPLORE_EVERY`` steps tries a neighbour of the best again (costs and acceptance drift
as requests come and go).

A cap only bounds the drafts; each row's own budget may draft fewer, and the answers do
not change: verification keeps greedy tokens and sampling distributions whatever the
tree. One row alone is capped only at the largest bucket: its draft budget prices its
own steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from .draft_cap import draft_cap

ALPHA = 0.3  # weight of the newest step in a cap's mean tokens per second
TRIES = 3  # steps each cap runs before the best is chosen
EXPLORE_EVERY = 24  # steps between tries of a neighbour of the best, per batch size


class CapChooser:
    """The per-row tree cap of the next batched step, from measured tokens per second.

    ``buckets``: the tree sizes a step pads to (the candidate caps, with 0: no draft).
    """

    def __init__(self, buckets: Sequence[int]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.mean: dict[tuple[int, int], float] = {}  # (rows bucket, cap) -> tokens/s
        self.runs: dict[tuple[int, int], int] = defaultdict(int)
        self.steps: dict[int, int] = defaultdict(int)  # rows bucket -> steps chosen for

    def choose(self, rows: int, max_draft: int, predict: Callable[[int], float]) -> int:
        """The cap for a step of ``rows`` rows whose drafters draft at most
        ``max_draft`` nodes; ``predict``: the latency curve (the first cap tried)."""
        if rows <= 1:  # its own budget decides, within the largest size a step pads to
            return min(max_draft, max(self.buckets))
        size = _rows_bucket(rows)
        first = draft_cap(predict, rows, max_draft, self.buckets)
        # none, the buckets up to the curve's cap and one above it (past that, the curve
        # already prices a step above one row's largest): by size
        above = [b for b in self.buckets if first < b <= max_draft][:1]
        caps = sorted({0, first, *(b for b in self.buckets if b <= first), *above})
        self.steps[size] += 1
        trial_order = [first, 0, *(c for c in caps if c not in (first, 0))]
        untried = [c for c in trial_order if self.runs[size, c] < TRIES]
        if untried:
            return untried[0]
        best = max(caps, key=lambda c: self.mean[size, c])
        if self.steps[size] % EXPLORE_EVERY == 0:  # a neighbour, alternately below, above
            i = caps.index(best)
            neighbours = [caps[j] for j in (i - 1, i + 1) if 0 <= j < len(caps)]
            turn = self.steps[size] // EXPLORE_EVERY
            return neighbours[turn % len(neighbours)] if neighbours else best
        return best

    def observe(self, rows: int, cap: int, tokens: int, seconds: float) -> None:
        """A step of ``rows`` rows capped at ``cap`` emitted ``tokens`` in ``seconds``."""
        if rows <= 1 or seconds <= 0:
            return
        key = (_rows_bucket(rows), cap)
        rate = tokens / seconds
        before = self.mean.get(key)
        self.mean[key] = rate if before is None else (1 - ALPHA) * before + ALPHA * rate
        self.runs[key] += 1


def _rows_bucket(rows: int) -> int:
    """``rows`` rounded up to a power of two: batch sizes that cost alike share means."""
    return 1 << (rows - 1).bit_length()

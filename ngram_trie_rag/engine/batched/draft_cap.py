"""How large a tree each row may draft when ``rows`` rows share one forward.

A step of ``rows`` rows with trees of N nodes is one forward of ``rows * (1 + N)``
tokens. The rule: keep that forward no dearer than the single-row step the budget may
choose at most (``1 + max_draft`` tokens), read from the engine's latency curve:

    cap(rows) = the largest N in {0} + buckets, N <= max_draft, with
                curve.predict(rows * (1 + N)) <= curve.predict(1 + max_draft)

so one row drafts as alone (``cap(1) = max_draft``), and as the batch grows each row's
tree shrinks to what the curve says is nearly free: on a CPU, where a forward's cost
grows with its tokens, trees vanish at about ``1 + max_draft`` rows; on a GPU, where a
forward of a few hundred tokens costs about one of a single token, they stay large.
Sizes are taken from the tree buckets, so rows that fill their cap need no padding.
"""

from __future__ import annotations

from ..trees.tree_buckets import BUCKETS


def draft_cap(predict, rows: int, max_draft: int,
              buckets: tuple[int, ...] = BUCKETS) -> int:
    """The per-row node cap for a step of ``rows`` rows; ``predict(q)``: seconds of a
    forward of ``q`` tokens (``LatencyCurve.predict``)."""
    max_draft = min(max_draft, max(buckets))
    if rows <= 1:
        return max_draft
    limit = predict(1 + max_draft)
    sizes = sorted({0, max_draft, *(b for b in buckets if b <= max_draft)}, reverse=True)
    return next((n for n in sizes if predict(rows * (1 + n)) <= limit), 0)

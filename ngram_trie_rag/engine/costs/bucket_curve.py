"""The latency curve of a compiled static engine: what its padded steps cost.

A compiled step of ``1 + k`` rows runs the graph of the bucket ``k`` pads up to, so its
cost is a step function of ``k``: flat across a bucket, a jump at the next. The draft
budget interpolates linearly between the sizes a curve holds, so the curve holds both
ends of every bucket: ``1 + (previous bucket + 1)`` and ``1 + bucket`` at the bucket's
seconds. With these costs, rather than the eager forwards' (which grow with every row),
the budget sees that a 16-node tree costs what an 9-node one does, and verifies more.
"""

from __future__ import annotations

from collections.abc import Mapping

from .latency import LatencyCurve


def bucket_curve(costs: Mapping[int, float]) -> LatencyCurve:
    """The curve (rows -> seconds) of steps whose cost is ``costs`` (padded node count ->
    seconds, 0 the plain step), flat across each bucket."""
    seconds: dict[int, float] = {}
    previous = 0
    for size in sorted(costs):
        if size == 0:
            seconds[1] = costs[0]
            continue
        seconds[1 + previous + 1] = costs[size]  # the bucket's smallest tree
        seconds[1 + size] = costs[size]
        previous = size
    return LatencyCurve(seconds, source="compiled")

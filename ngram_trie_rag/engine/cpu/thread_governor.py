"""Intra-op threads per forward, chosen from the step times this process observes.

The latency curve and the forward variants are measured once, on whatever the host was
doing then. When another CPU-bound process competes for the cores, a forward split over
every core waits at each parallel region's barrier for a thread the OS has descheduled.
Measured on two cores beside two spinning processes (default model, fp32, 64 tokens):
plain steps on two threads took a median of 48 ms, and on a later prompt 3.6 s each;
on one thread they took 34-39 ms, against 19 ms on two threads on a quiet host.
Splitting a forward only pays while the cores are there to take the pieces.

So the engine does not trust the start-up choice. It times every verification forward
against what the curve predicts for its size (``ratio = seconds / t(q)``), keeps an
exponentially weighted mean of the ratio per thread count, and every so often runs a
few steps on another count (a *probe*). A probe that is faster by ``SWITCH_MARGIN``
makes that count the current one. Probes back off exponentially while they keep losing,
and come at once when the current count's ratio drifts up by ``DRIFT`` (load arrived).
A probe step that runs far slower than the current count is cut after one step, so a
bad count costs one step per probe, not a whole probe.

Output is unaffected: the forwards of this engine give bitwise the same logits on any
thread count (CPU GEMM here splits rows and columns, not the reduction; the exactness
tests switch counts mid-answer to keep it so). On a GPU, or with one thread to begin
with, there is nothing to choose and the governor stays out of the way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

ALPHA = 0.2  # weight of the newest step in a count's mean ratio
PROBE_STEPS = 3  # steps a probe runs; its first is a warm-up (threads wake, caches refill)
SWITCH_MARGIN = 0.85  # a probed count must cost at most this share of the current one
ABORT_RATIO = 2.0  # a probe step this many times the current mean ends the probe
FIRST_INTERVAL = 32  # steps between probes after a switch
MAX_INTERVAL = 1024  # the longest back-off
DRIFT = 1.5  # the current count's mean this far above where it settled: probe now


@dataclass
class ThreadGovernor:
    """Which thread count the next forward runs on, learned from observed step times.

    ``threads``: the count the process was given (``torch.get_num_threads()``); the
    options are it and its halvings down to one, current first.

    Example (a host that turned busy: two threads now cost three times the curve)::

        gov = ThreadGovernor(2)
        for _ in range(40):
            n = gov.threads_for_step()
            gov.observe(n, 3.0 if n == 2 else 1.6)
        gov.current   # -> 1
    """

    threads: int
    options: list[int] = field(init=False)
    current: int = field(init=False)
    mean: dict[int, float] = field(init=False, default_factory=dict)  # count -> mean ratio
    settled: float | None = field(init=False, default=None)  # current's mean when chosen
    interval: int = field(init=False, default=FIRST_INTERVAL)
    since_probe: int = field(init=False, default=0)
    probe: int | None = field(init=False, default=None)  # the count being probed
    probe_ratios: list[float] = field(init=False, default_factory=list)
    switches: int = field(init=False, default=0)
    _down: bool = field(init=False, default=True)  # the direction of the next probe

    def __post_init__(self) -> None:
        self.options = _halvings(self.threads)
        self.current = self.threads

    @property
    def active(self) -> bool:
        """Whether there is a choice to make at all."""
        return len(self.options) > 1

    def threads_for_step(self) -> int:
        """The count the next verification forward runs on."""
        if not self.active:
            return self.current
        if self.probe is None and self._probe_due():
            self.probe = self._next_option()
            self.probe_ratios = []
        return self.probe if self.probe is not None else self.current

    def observe(self, threads: int, ratio: float) -> None:
        """One forward on ``threads`` took ``ratio`` times what the curve predicts."""
        if not self.active or not ratio > 0:
            return
        if threads == self.probe:
            self._observe_probe(ratio)
            return
        if threads != self.current:  # a count left since: nothing to learn for now
            return
        self.since_probe += 1
        old = self.mean.get(threads)
        self.mean[threads] = ratio if old is None else (1 - ALPHA) * old + ALPHA * ratio
        if self.settled is None and self.since_probe >= PROBE_STEPS:
            # Where the count settles, but never above the curve itself: a process that
            # starts on a busy host (steps far slower than the curve) probes at once
            # instead of after FIRST_INTERVAL steps, which one answer may never reach.
            self.settled = min(self.mean[threads], 1.0)

    # ---- probing --------------------------------------------------------------------
    def _probe_due(self) -> bool:
        if self.current not in self.mean:
            return False  # learn where the current count stands first
        if self.since_probe >= self.interval:
            return True
        drifted = (self.settled is not None and self.since_probe >= PROBE_STEPS
                   and self.mean[self.current] > DRIFT * self.settled)
        return drifted

    def _next_option(self) -> int:
        """A neighbouring count to try, fewer and more threads in turn (fewer first:
        the usual cause of a slow step is contention); at either end, the one there is."""
        i = self.options.index(self.current)
        fewer = self.options[i + 1] if i + 1 < len(self.options) else None
        more = self.options[i - 1] if i > 0 else None
        pick = fewer if (self._down and fewer is not None) or more is None else more
        self._down = not self._down
        assert pick is not None  # active: at least two options
        return pick

    def _observe_probe(self, ratio: float) -> None:
        self.probe_ratios.append(ratio)
        current = self.mean[self.current]
        if ratio > ABORT_RATIO * current:  # clearly worse: one step was enough
            self._end_probe(won=False)
        elif len(self.probe_ratios) >= PROBE_STEPS:
            warm = self.probe_ratios[1:]
            score = sum(warm) / len(warm)
            won = score < SWITCH_MARGIN * current
            assert self.probe is not None
            self.mean[self.probe] = score
            if won:
                self.current = self.probe
                self.switches += 1
            self._end_probe(won)

    def _end_probe(self, won: bool) -> None:
        self.probe = None
        self.since_probe = 0
        # Lost: the current level is as good as it gets for now; drift is measured from it.
        self.settled = (self.mean[self.current] if won
                        else max(self.settled or 0.0, self.mean[self.current]))
        self.interval = FIRST_INTERVAL if won else min(2 * self.interval, MAX_INTERVAL)


def free_cores(threads: int, looks: int = 3) -> int:
    """How many of ``threads`` cores no other runnable thread holds right now: Linux's
    ``procs_running`` (every runnable thread on the host, this one included), the least of
    a few looks a millisecond apart so that a passing task does not count; ``threads``
    where the count cannot be read. Used before a process has timed any step of its own,
    for its first prompt's threads: a prompt split over cores that others hold waits at
    every barrier (on two cores beside two spinning processes, a 600-token prefill took
    7.5-8.4 s on two threads and 5.2-5.6 s on one)."""
    import time

    running = []
    for i in range(looks):
        try:
            with open("/proc/stat") as f:
                running += [int(line.split()[1]) for line in f
                            if line.startswith("procs_running")]
        except (OSError, ValueError, IndexError):
            return threads
        if i + 1 < looks:
            time.sleep(0.001)
    if not running:
        return threads
    others = min(running) - 1  # this thread is running as it reads
    return max(1, min(threads, threads - others))


def _halvings(threads: int) -> list[int]:
    """``threads`` and its halvings down to one, e.g. 6 -> [6, 3, 1], 8 -> [8, 4, 2, 1]."""
    out = [max(1, threads)]
    while out[-1] > 1:
        out.append(max(1, out[-1] // 2))
    return out


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block on ``threads`` intra-op threads (``None``: as set), then restore the
    caller's count, so nothing outside the engine's forwards sees the change."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)

"""The thread governor: fewer threads when the host is busy, back when it is quiet, and
greedy output unchanged whatever count each forward runs on.

The policy is tested on given step-time ratios (no clock: timed assertions do not belong
in unit tests); exactness on the real packaged model with the count switched every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from data_files import read_jsonl

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import EagerEngine, LatencyCurve
from ngram_trie_rag.engine.costs.latency import SIZES
from ngram_trie_rag.engine.cpu.thread_governor import (
    ABORT_RATIO,
    FIRST_INTERVAL,
    MAX_INTERVAL,
    PROBE_STEPS,
    ThreadGovernor,
    intra_op_threads,
)
from ngram_trie_rag.engine.quant import w8a32
from ngram_trie_rag.reference import greedy_reference


def _drive(gov: ThreadGovernor, cost: Callable[[int], float], steps: int) -> list[int]:
    """Run ``steps`` forwards whose ratio on ``n`` threads is ``cost(n)``; the counts used."""
    used = []
    for _ in range(steps):
        n = gov.threads_for_step()
        used.append(n)
        gov.observe(n, cost(n))
    return used


def test_options_are_the_count_and_its_halvings() -> None:
    assert ThreadGovernor(8).options == [8, 4, 2, 1]
    assert ThreadGovernor(6).options == [6, 3, 1]
    assert ThreadGovernor(2).options == [2, 1]
    single = ThreadGovernor(1)
    assert not single.active
    assert _drive(single, lambda n: 5.0, 100) == [1] * 100


def test_a_quiet_host_keeps_every_thread_and_probes_ever_less_often() -> None:
    gov = ThreadGovernor(2)
    used = _drive(gov, lambda n: 1.0 if n == 2 else 1.8, 3000)
    assert gov.current == 2 and gov.switches == 0
    probes = [i for i, n in enumerate(used) if n == 1 and (i == 0 or used[i - 1] == 2)]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > MAX_INTERVAL // 2  # backing off
    assert used.count(1) <= PROBE_STEPS * len(probes)
    assert used.count(1) / len(used) < 0.02  # the price of watching: under 2% of steps
    assert gov.interval == MAX_INTERVAL


def test_a_busy_host_drops_to_fewer_threads_and_returns_when_it_quietens() -> None:
    gov = ThreadGovernor(2)
    _drive(gov, lambda n: 1.0 if n == 2 else 1.8, 200)  # quiet: settled on 2
    assert gov.current == 2
    busy = _drive(gov, lambda n: 6.0 if n == 2 else 1.9, 40)  # load arrives
    assert gov.current == 1 and gov.switches == 1
    assert busy.index(1) < 10  # the drift triggers a probe at once, not after the interval
    later = _drive(gov, lambda n: 6.0 if n == 2 else 1.9, 500)
    assert later.count(2) <= 10  # a losing probe of two threads is cut after one step
    _drive(gov, lambda n: 1.0 if n == 2 else 1.8, MAX_INTERVAL + 50)  # load gone
    assert gov.current == 2 and gov.switches == 2


def test_a_probe_step_far_slower_than_the_current_count_ends_the_probe() -> None:
    gov = ThreadGovernor(2)
    _drive(gov, lambda n: 1.0 if n == 2 else 50.0, FIRST_INTERVAL + PROBE_STEPS)
    assert gov.probe is None  # one step of 50x the current mean was enough
    assert ABORT_RATIO * 1.0 < 50.0
    assert gov.interval == 2 * FIRST_INTERVAL


def test_many_cores_search_both_ways() -> None:
    gov = ThreadGovernor(8)
    _drive(gov, lambda n: {8: 4.0, 4: 1.5, 2: 1.2, 1: 2.0}[n], 400)
    assert gov.current == 2  # walked down twice, and probing 1 lost


def test_intra_op_threads_restores_the_callers_count() -> None:
    before = torch.get_num_threads()
    with intra_op_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), intra_op_threads(before + 1):
        raise RuntimeError("a forward failed")
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before


class _EveryStepAnotherCount(ThreadGovernor):
    """The real governor's interface with its choice replaced by a fixed rotation, so
    every forward runs on another count than the one before."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._turn = 0

    def threads_for_step(self) -> int:
        self._turn += 1
        return self.options[self._turn % len(self.options)]


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process's count set to two for the test (the suite runs on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _curve(layout: str) -> LatencyCurve:
    seconds = {q: 0.03 + 0.0005 * q for q in (1, *(1 + k for k in SIZES))}
    return LatencyCurve(seconds, dict.fromkeys(seconds, layout), pack_single=True)


_REFERENCES: dict[tuple[int, ...], list[int]] = {}  # plain greedy on two threads


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["stock", "transposed", "prepacked", pytest.param(
    "rowwise", marks=pytest.mark.skipif(not w8a32.supported_cpu(),
                                        reason="the rowwise layout needs AVX-512"))])
@pytest.mark.usefixtures("two_threads")
def test_switching_threads_every_step_keeps_greedy_exact(generator, layout: str) -> None:
    """One and two threads in turn, step after step, in every linear layout: the same
    tokens as ``generate`` on two threads."""
    engine = EagerEngine(generator.model, curve=_curve(layout))
    engine._governor = _EveryStepAnotherCount(2)
    gen = SpeculativeGenerator(generator.model, generator.tokenizer, engine=engine)
    for row in read_jsonl("hagrid/hagrid.jsonl", 2):
        docs = row["context"] if isinstance(row["context"], list) else [row["context"]]
        ids = gen.encode_prompt([{"role": "user", "content": row["turns"][0]}])
        key = tuple(ids)
        if key not in _REFERENCES:  # the same for every layout
            _REFERENCES[key] = greedy_reference(generator.model, ids, 48)
        reference = _REFERENCES[key]
        result = gen.generate(ids, documents=docs, max_new_tokens=48)
        assert result.token_ids == reference
        assert set(result.stats.threads_used) == {1, 2}
        assert sum(result.stats.threads_used.values()) == result.stats.steps


@pytest.mark.usefixtures("two_threads")
def test_the_engine_governs_only_its_own_forwards(generator) -> None:
    """A generation on a two-thread process records the counts it used and leaves the
    process's count as it was."""
    engine = EagerEngine(generator.model, curve=_curve("stock"))
    gen = SpeculativeGenerator(generator.model, generator.tokenizer, engine=engine)
    result = gen.generate("The capital of France is", max_new_tokens=8, method="none")
    assert torch.get_num_threads() == 2
    assert engine.governor is not None and engine.governor.options == [2, 1]
    assert sum(result.stats.threads_used.values()) == result.stats.steps


def test_a_process_that_starts_on_a_busy_host_switches_within_one_answer() -> None:
    """Two threads at three times the curve from the first step: one thread is probed
    after a few steps, not after FIRST_INTERVAL, and taken."""
    gov = ThreadGovernor(2)
    for _ in range(12):
        n = gov.threads_for_step()
        gov.observe(n, 3.0 if n == 2 else 1.2)
    assert gov.current == 1 and gov.switches == 1


def test_a_lost_probe_accepts_the_level_and_does_not_probe_again_at_once() -> None:
    """Slower than the curve, but fewer threads are slower still: one probe, then the
    count stays without probing every few steps."""
    gov = ThreadGovernor(2)
    probes = 0
    for _ in range(30):
        n = gov.threads_for_step()
        probes += n == 1
        gov.observe(n, 1.6 if n == 2 else 2.5)
    assert gov.current == 2 and probes == 3  # one probe of PROBE_STEPS steps


def test_free_cores_sees_other_runnable_processes() -> None:
    """Two spinning processes on the host: at most one core is free of them (with more
    cores than that the count can only be higher, never above what was given)."""
    import os
    import subprocess
    import sys
    import time

    from ngram_trie_rag.engine.cpu.thread_governor import free_cores

    assert free_cores(1) == 1
    cores = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        free = free_cores(cores)
        assert 1 <= free <= max(1, cores - 2)
    finally:
        for p in spinners:
            p.kill()
            p.wait()

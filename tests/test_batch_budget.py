"""Draft lengths for a batching engine: the cost fit, the acceptance rates, and the
choice that maximises tokens per second, on hand-computed numbers."""

from __future__ import annotations

import itertools
import random

import pytest

from ngram_trie_rag.drafting.batch_budget import (
    AcceptRates,
    DraftLengths,
    StepCost,
    choose_lengths,
    token_class,
)


def test_step_cost_recovers_a_plane() -> None:
    cost = StepCost(min_samples=4)
    for n, r in ((1, 0), (5, 1), (9, 1), (17, 2), (3, 1), (12, 0), (20, 2)):
        cost.observe(n, 0.040 + 0.003 * n + 0.010 * r, r)
    a, b, e = cost.fit()
    assert (a, b, e) == pytest.approx((0.040, 0.003, 0.010))


def test_step_cost_without_spread_in_drafting_rows_fits_a_line() -> None:
    cost = StepCost(min_samples=4)
    for n in (1, 5, 9, 17, 3, 12):
        cost.observe(n, 0.040 + 0.003 * n, 1)
    assert cost.fit() == pytest.approx((0.040, 0.003, 0.0))


def test_step_cost_is_unknown_until_tokens_vary() -> None:
    cost = StepCost(min_samples=4)
    for _ in range(3):
        cost.observe(8, 0.05)
    assert cost.fit() is None  # too few samples
    cost.observe(8, 0.06)
    assert cost.fit() is None  # four samples, one token count: no slope


def test_token_classes() -> None:
    assert token_class(1, 0.3, 5) == 0  # first token, one continuation of several
    assert token_class(1, 1.0, 1) == 2  # first token, the only continuation, seen once
    assert token_class(3, 1.0, 4) == 7  # deeper, the only continuation, seen 4 times
    assert token_class(2, 0.7, 9) == 5


def test_accept_rates_count_each_token_given_the_ones_before() -> None:
    rates = AcceptRates(decay=1.0, weight=0.0)  # own counts only
    rates.observe("r", [2, 6, 7], accepted=1)  # class 2 taken, 6 refused, 7 untried
    rates.observe("r", [2, 7, 7], accepted=3)  # all taken
    # q(2) = 2/2, q(6) = 0/1, q(7) = 2/2
    assert rates.cumulative("r", [2, 7, 7]) == pytest.approx([1.0, 1.0, 1.0])
    assert rates.cumulative("r", [2, 6, 7]) == pytest.approx([1.0, 0.0, 0.0])


def test_a_new_request_starts_from_the_batch_rates() -> None:
    rates = AcceptRates(decay=1.0, weight=2.0)
    for _ in range(8):
        rates.observe("a", [0], accepted=0)
    # Batch-wide q(0) = (0 + 0.5) / (8 + 1) (a 0.5 prior worth one trial); "b" has none.
    assert rates.cumulative("b", [0]) == pytest.approx([0.5 / 9])
    assert rates.cumulative("b", [3]) == pytest.approx([0.5])  # a class never tried
    rates.retain(["b"])
    assert rates.cumulative("a", [0]) == pytest.approx([0.5 / 9])  # "a" forgotten


def _rate(values: list[list[float]], lengths, a: float, b: float, e: float) -> float:
    emitted = len(values) + sum(sum(v[:k]) for v, k in zip(values, lengths, strict=True))
    return emitted / (a + b * (len(values) + sum(lengths)) + e * sum(k > 0 for k in lengths))


def _best_by_enumeration(values: list[list[float]], a: float, b: float, e: float) -> float:
    return max(_rate(values, lengths, a, b, e)
               for lengths in itertools.product(*(range(len(v) + 1) for v in values)))


def test_choice_is_the_best_tokens_per_second() -> None:
    rng = random.Random(0)
    for _ in range(200):
        values = []
        for _ in range(rng.randint(1, 3)):
            c, row = 1.0, []
            for _ in range(rng.randint(0, 3)):
                c *= rng.random()
                row.append(c)
            values.append(row)
        a, b = rng.uniform(0, 0.1), rng.uniform(0.001, 0.02)
        e = rng.choice([0.0, rng.uniform(0, 0.05)])
        lengths = choose_lengths(values, a, b, e)
        assert _rate(values, lengths, a, b, e) == pytest.approx(
            _best_by_enumeration(values, a, b, e))


def _steady(policy: DraftLengths, rows: list[str], accept: int, seconds) -> list[int]:
    """Steps where every row has a path of 4 and accepts ``accept`` of what it drafts."""
    path = [3, 7, 7, 7]
    lengths = policy.step(rows, [None] * len(rows), None, [path] * len(rows))
    for _ in range(40):
        tokens = len(rows) + sum(lengths)
        lengths = policy.step(rows, [min(accept, m) for m in lengths], seconds(tokens),
                              [path] * len(rows))
    return lengths


def test_under_load_rarely_accepted_drafts_are_dropped() -> None:
    rows = [f"r{i}" for i in range(16)]
    policy = DraftLengths(explore_every=1000)
    # Each token costs almost as much as a whole step's overhead and no draft token is
    # ever accepted: verifying drafts only lowers tokens per second.
    lengths = _steady(policy, rows, accept=0, seconds=lambda n: 0.010 + 0.004 * n)
    assert lengths == [0] * 16


def test_alone_with_a_fixed_step_cost_whole_paths_are_drafted() -> None:
    policy = DraftLengths(explore_every=1000)
    lengths = _steady(policy, ["r"], accept=4, seconds=lambda n: 0.040 + 0.001 * n)
    assert lengths == [4]


def test_new_rows_add_no_cost_sample() -> None:
    policy = DraftLengths()
    path = [3, 7, 7]
    policy.step(["a"], [None], None, [path])
    policy.step(["a", "b"], [1, None], 0.5, [path, path])  # "b" was prefilled in that step
    assert policy.cost.samples == 0
    policy.step(["a", "b"], [0, 2], 0.05, [path, path])
    assert policy.cost.samples == 1

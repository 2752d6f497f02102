"""The latency curve's disk store and the check that decides whether a stored curve
still holds (tiny random Llamas: the point is the plumbing, not the numbers)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_model import tiny_llama

from ngram_trie_rag import SpeculativeGenerator, latency, latency_store
from ngram_trie_rag.latency import LatencyCurve, curve_holds, latency_curve

KEY = ("LlamaForCausalLM", "llama", 1234, "torch.float32", "cpu", 2, 2, 32, True)
CURVE = LatencyCurve({1: 0.03, 2: 0.031, 9: 0.05, 17: 0.08},
                     {2: "transposed", 9: "prepacked"}, pack_single=True)


@pytest.fixture(scope="module")
def tiny() -> SpeculativeGenerator:
    model, tokenizer = tiny_llama(seed=3)
    return SpeculativeGenerator(model, tokenizer)


def test_store_round_trip(tmp_path: Path) -> None:
    path = latency_store.save(KEY, CURVE, tmp_path)
    assert path is not None and path.parent == tmp_path
    assert latency_store.load(KEY, tmp_path) == CURVE
    other = (*KEY[:-1], False)  # another engine: another file
    assert latency_store.path_for(other, tmp_path) != path
    assert latency_store.load(other, tmp_path) is None


@pytest.mark.parametrize("damage", ["garbage", "other key", "too old", "future", "layout",
                                    "negative", "no seconds", "missing field"])
def test_store_ignores_what_it_cannot_trust(tmp_path: Path, damage: str) -> None:
    path = latency_store.save(KEY, CURVE, tmp_path)
    doc = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    else:
        if damage == "other key":
            doc["key"][2] = 999
        elif damage == "too old":
            doc["measured_at"] = time.time() - latency_store.MAX_AGE_S - 60
        elif damage == "future":
            doc["measured_at"] = time.time() + 3600
        elif damage == "layout":
            doc["layouts"]["9"] = "sideways"
        elif damage == "negative":
            doc["seconds"]["1"] = -0.01
        elif damage == "no seconds":
            doc["seconds"] = {}
        elif damage == "missing field":
            del doc["pack_single"]
        path.write_text(json.dumps(doc))
    assert latency_store.load(KEY, tmp_path) is None


def test_unwritable_cache_is_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert latency_store.save(KEY, CURVE, blocker / "latency") is None


def test_curve_holds_rejects_a_curve_off_by_tenfold(tiny: SpeculativeGenerator) -> None:
    model = tiny.model
    measured = latency_curve(model, sizes=(1, 8), repeats=2)
    for factor in (10.0, 0.1):
        off = replace(measured, seconds={q: s * factor for q, s in measured.seconds.items()})
        assert not curve_holds(model, off, repeats=2)
    assert not curve_holds(model, LatencyCurve({4: 0.01}))  # no size to check against


def test_curve_holds_times_the_curves_own_variants(tiny: SpeculativeGenerator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tolerance opened up, any curve with check sizes holds: the check ran
    the variants the curve names (transposed layout, packed attention) without error."""
    monkeypatch.setattr(latency, "CHECK_TOLERANCE", float("inf"))
    curve = LatencyCurve({1: 1.0, 9: 1.0}, {9: "transposed"}, pack_single=True)
    assert curve_holds(tiny.model, curve, packed_gqa=True, repeats=1)


def test_generator_stores_then_reuses_then_replaces(tiny: SpeculativeGenerator, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    key = ("tiny-test", 1)
    first = tiny._stored_or_measured(key)  # nothing stored: measured, then stored
    assert latency_store.load(key) == first
    stale = replace(first, seconds={q: s * 1000 for q, s in first.seconds.items()})
    latency_store.save(key, stale)
    again = tiny._stored_or_measured(key)  # the stored curve is 1000x off: measured again
    assert again != stale and latency_store.load(key) == again
    monkeypatch.setattr(latency, "CHECK_TOLERANCE", float("inf"))
    latency_store.save(key, stale)
    assert tiny._stored_or_measured(key) == stale  # it holds: re-used as stored

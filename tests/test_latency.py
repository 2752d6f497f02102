"""The latency curve's disk store, the quick default curve and the full measurement
(tiny random Llamas: the point is the plumbing, not the numbers)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import EagerEngine
from ngram_trie_rag.engine.costs import curve_cache
from ngram_trie_rag.engine.costs.latency import SIZES, LatencyCurve, default_curve, latency_curve
from ngram_trie_rag.engine.cpu import linear_layout, llama_step

KEY = ("LlamaForCausalLM", "llama", 1234, "torch.float32", "cpu", 2, 2, 32, True)
CURVE = LatencyCurve({1: 0.03, 2: 0.031, 9: 0.05, 17: 0.08},
                     {2: "transposed", 9: "prepacked"}, pack_single=True)


@pytest.fixture(scope="module")
def tiny() -> SpeculativeGenerator:
    """A generator running the model's modules, so every variant a curve can name (the
    transposed layout, packed attention) is installed and timed through them."""
    model, tokenizer = tiny_llama(seed=3)
    return SpeculativeGenerator(model, tokenizer, engine=EagerEngine(model, direct_step=False))


def test_store_round_trip(tmp_path: Path) -> None:
    path = curve_cache.save(KEY, CURVE, tmp_path)
    assert path is not None and path.parent == tmp_path
    assert curve_cache.load(KEY, tmp_path) == CURVE
    other = (*KEY[:-1], False)  # another engine: another file
    assert curve_cache.path_for(other, tmp_path) != path
    assert curve_cache.load(other, tmp_path) is None


def test_store_keeps_the_source_and_reads_old_files_as_measured(tmp_path: Path) -> None:
    default = replace(CURVE, layouts={}, pack_single=False, source="default")
    assert curve_cache.load(KEY, curve_cache.save(KEY, default, tmp_path).parent) == default
    path = curve_cache.save(KEY, CURVE, tmp_path)
    doc = json.loads(path.read_text())
    assert doc["source"] == "measured"
    del doc["source"]  # a file written before curves said where they came from
    path.write_text(json.dumps(doc))
    assert curve_cache.load(KEY, tmp_path) == CURVE


@pytest.mark.parametrize("damage", ["garbage", "other key", "too old", "future", "layout",
                                    "negative", "no seconds", "missing field", "source"])
def test_store_ignores_what_it_cannot_trust(tmp_path: Path, damage: str) -> None:
    path = curve_cache.save(KEY, CURVE, tmp_path)
    doc = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    else:
        if damage == "other key":
            doc["key"][2] = 999
        elif damage == "too old":
            doc["measured_at"] = time.time() - curve_cache.MAX_AGE_S - 60
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
        elif damage == "source":
            doc["source"] = "guessed"
        path.write_text(json.dumps(doc))
    assert curve_cache.load(KEY, tmp_path) is None


def test_unwritable_cache_is_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert curve_cache.save(KEY, CURVE, blocker / "latency") is None


def test_default_curve_is_a_rising_line_in_stock_variants(tiny: SpeculativeGenerator) -> None:
    engine = tiny.engine  # runs the modules: the stock layout alone, two probes
    curve = default_curve(tiny.model, packed_gqa=engine.packed_gqa, windows=engine.windows,
                          step=engine.step)
    assert curve.source == "default" and curve.layouts == {} and not curve.pack_single
    assert sorted(curve.seconds) == [1] + [1 + k for k in SIZES]
    times = [curve.seconds[q] for q in sorted(curve.seconds)]
    assert times[0] > 0 and all(a < b for a, b in zip(times, times[1:], strict=False))
    slope = (curve.seconds[17] - curve.seconds[1]) / 16  # one line through every size
    assert curve.seconds[65] == pytest.approx(curve.seconds[1] + 64 * slope)


def test_default_curve_of_the_llama_step_chooses_stock_or_rowwise_per_probe() -> None:
    """Where the step can run the rowwise layout, the probe times both at each of its
    three sizes, and each size up to a probe runs what won there."""
    from ngram_trie_rag.engine.cpu import rowwise_linear

    model, _ = tiny_llama(seed=5)
    step = llama_step.LlamaStep(model)
    if not rowwise_linear.applies(model):
        pytest.skip("the rowwise layout needs AVX-512 and a C++ compiler")
    curve = default_curve(model, step=step)
    assert set(curve.layouts.values()) <= {"rowwise"}
    assert all(q <= 17 for q in curve.layouts)  # past the last probe: stock
    for lo, hi in ((2, 9), (10, 17)):  # one probe's choice holds its range
        assert len({curve.layout(q) for q in range(lo, hi + 1)}) == 1
    times = [curve.seconds[q] for q in sorted(curve.seconds)]
    assert times[0] > 0 and all(a < b for a, b in zip(times, times[1:], strict=False))
    slope = (curve.seconds[17] - curve.seconds[9]) / 8  # the last line, extended
    assert curve.seconds[65] == pytest.approx(curve.seconds[9] + 56 * slope)


def test_a_stored_curve_is_used_as_stored(tiny: SpeculativeGenerator, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """However far a stored curve is from this host's timings now, nothing re-times it."""
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(curve_cache, "_CURVES", {})
    for name in ("latency_curve", "default_curve"):
        monkeypatch.setattr(curve_cache, name, _refuse_to_time)
    engine = EagerEngine(tiny.model, direct_step=False)
    key = curve_cache.curve_key(tiny.model, engine.step)
    stale = LatencyCurve({q: 1000.0 * q for q in (1, 2, 9, 17)}, {9: "transposed"})
    assert curve_cache.save(key, stale).parent == tmp_path / "latency"
    assert engine.curve == stale


def _refuse_to_time(*_args, **_kwargs):
    raise AssertionError("a stored curve was timed again")


def test_generators_over_one_model_share_its_engine_and_curve() -> None:
    """Generators over one model share its engine: one lock (they share the weights and
    the cores) and one latency curve. An engine given explicitly is used as it is, with
    its pinned curve, by the generator and by the generators reshaped from it."""
    model, tokenizer = tiny_llama(seed=5)
    first, second = SpeculativeGenerator(model, tokenizer), SpeculativeGenerator(model, tokenizer)
    assert first.engine is second.engine is first.reshaped(n=5).engine
    with first.engine.lock:
        assert second.busy
    assert not second.busy
    pinned = SpeculativeGenerator(model, tokenizer, engine=EagerEngine(model, curve=CURVE))
    assert pinned.engine is not first.engine
    assert pinned.latency_curve is pinned.reshaped(n=5).latency_curve is CURVE


def _refuse(*_args, **_kwargs):
    raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support "
                       "avx_ne_convert or avx512bw, avx512vl and avx512dq")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layout_the_host_cannot_run_is_skipped(dtype: torch.dtype,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without the instructions oneDNN's bf16 packing needs raises inside the
    prepacked layout: the curve leaves that layout out instead of crashing, and the
    generator built on it decodes exactly as before."""
    if not linear_layout.prepack_runs(dtype):  # e.g. bf16 on a CPU without AVX-512
        pytest.skip(f"this CPU cannot pack {dtype} weights at all: the layout is never "
                    "offered, so there is no failing layout to skip")
    model, tokenizer = tiny_llama(seed=7)
    model = model.to(dtype)
    engine = EagerEngine(model, curve=CURVE)
    assert engine.step is not None and linear_layout.prepack_applies(model)
    monkeypatch.setattr(llama_step, "prepacked", _refuse)  # the kernel fails at model shapes
    curve = latency_curve(model, step=engine.step, sizes=(1, 8), repeats=1)
    assert "prepacked" not in curve.layouts.values()
    assert set(curve.seconds) == {1, 2, 9}
    ids = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]
    pinned = SpeculativeGenerator(model, tokenizer, engine=EagerEngine(model, curve=curve))
    plain = SpeculativeGenerator(model, tokenizer, engine=EagerEngine(model, curve=curve),
                                 method="none")
    assert pinned.generate(ids, max_new_tokens=16).token_ids == plain.generate(
        ids, max_new_tokens=16).token_ids
    monkeypatch.undo()  # and as this CPU runs it
    host = latency_curve(model, step=engine.step, sizes=(1, 8), repeats=1)
    assert set(host.seconds) == {1, 2, 9}


def test_prepack_is_not_offered_where_onednn_cannot_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_layout, "prepacked", _refuse)
    linear_layout.prepack_runs.cache_clear()
    try:
        assert not linear_layout.prepack_runs(torch.bfloat16)
        model, _ = tiny_llama(seed=7)
        assert not linear_layout.prepack_applies(model.to(torch.bfloat16))
    finally:
        linear_layout.prepack_runs.cache_clear()

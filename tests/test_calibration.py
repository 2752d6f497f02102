"""Where a process's latency curve comes from, on the packaged default model: a stored
curve as stored, else a quick probe; real steps' timings stored for the next process;
``ngram-trie-rag calibrate`` for the full measurement."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.engine import EagerEngine
from ngram_trie_rag.engine.costs import curve_cache
from ngram_trie_rag.engine.costs.latency import SIZES, LatencyCurve, latency_curve
from ngram_trie_rag.loading import DEFAULT_MODEL_NAME, default_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = ["The Aurora K3 coffee machine shows error E2 when the water tank is empty. "
        "Refill the water tank and press the start button to clear error E2."]
QUESTION = [{"role": "user", "content": "What does error E2 mean on the Aurora K3 coffee machine?"}]


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder for this test (the packaged model linked in, so nothing is
    converted again), and a process that holds no curve yet."""
    (tmp_path / DEFAULT_MODEL_NAME).symlink_to(default_model_dir())
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(curve_cache, "_CURVES", {})
    monkeypatch.setattr(curve_cache, "_SAVED_AT", {})
    return tmp_path


@pytest.fixture()
def fresh(generator: SpeculativeGenerator) -> SpeculativeGenerator:
    """A generator over the session's model with an engine of its own, whose curve is
    looked up afresh."""
    return SpeculativeGenerator(generator.model, generator.tokenizer,
                                engine=EagerEngine(generator.model))


def _refuse(*_args, **_kwargs):
    raise AssertionError("the latency curve was measured")


def _key(gen: SpeculativeGenerator) -> tuple:
    return curve_cache.curve_key(gen.model, gen.engine.step)


def _measured(gen: SpeculativeGenerator) -> LatencyCurve:
    """A made-up curve as a full measurement stores it (far from this host's timings)."""
    seconds = {q: 0.5 + 0.01 * q for q in [1] + [1 + k for k in SIZES]}
    return LatencyCurve(seconds, {9: "prepacked"}, pack_single=True)


def test_without_a_stored_curve_a_default_is_probed_and_stored(
        cache: Path, fresh: SpeculativeGenerator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(curve_cache, "latency_curve", _refuse)
    curve = fresh.engine.curve
    # no layout but the probe's choice of the rowwise one (fp32 on an AVX-512 CPU)
    assert curve.source == "default" and not curve.pack_single
    assert set(curve.layouts.values()) <= {"rowwise"}
    assert sorted(curve.seconds) == [1] + [1 + k for k in SIZES]
    times = [curve.seconds[q] for q in sorted(curve.seconds)]
    assert times[0] > 0 and all(a < b for a, b in zip(times, times[1:], strict=False))
    assert curve_cache.load(_key(fresh)) == curve
    assert curve_cache.path_for(_key(fresh)).parent == cache / "latency"


def test_a_stored_curve_is_used_without_timing_anything(
        cache: Path, fresh: SpeculativeGenerator, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("latency_curve", "default_curve"):
        monkeypatch.setattr(curve_cache, name, _refuse)
    stored = _measured(fresh)
    curve_cache.save(_key(fresh), stored)
    assert fresh.engine.curve == stored
    assert fresh.generate(QUESTION, documents=DOCS, max_new_tokens=8).token_ids


def test_refined_seconds_are_stored_for_the_next_process(
        cache: Path, fresh: SpeculativeGenerator) -> None:
    default = fresh.engine.curve
    result = fresh.generate(QUESTION, documents=DOCS, max_new_tokens=24)
    refined = fresh._draft_budget(fresh.engine).refined()
    assert result.stats.accept_lengths and refined
    curve = fresh.engine.curve
    assert curve.source == "refined" and curve.layouts == default.layouts
    assert {q: curve.seconds[q] for q in refined} == refined
    assert all(curve.seconds[q] == default.seconds[q] for q in default.seconds
               if q not in refined)
    curve_cache._CURVES.clear()  # as a new process finds it
    again = curve_cache.curve_for(fresh.model, step=fresh.engine.step,
                                  packed_gqa=fresh.engine.packed_gqa,
                                  windows=fresh.engine.windows)
    assert again == curve


def test_a_default_never_replaces_a_measured_curve(cache: Path,
                                                   fresh: SpeculativeGenerator) -> None:
    key, measured = _key(fresh), _measured(fresh)
    curve_cache.save(key, measured)
    default = LatencyCurve(dict(measured.seconds), source="default")
    assert curve_cache.store(key, default) is None
    assert curve_cache.load(key) == measured


def test_refined_seconds_update_a_measured_curve_and_keep_its_layouts(
        cache: Path, fresh: SpeculativeGenerator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that started from a default curve while another measured one: its
    steps' seconds go into the measured curve, whose layouts and packing stay."""
    monkeypatch.setattr(curve_cache, "SAVE_INTERVAL_S", float("inf"))  # once per process
    key, measured = _key(fresh), _measured(fresh)
    curve_cache._CURVES[key] = LatencyCurve(dict(measured.seconds), source="default")
    curve_cache.save(key, measured)
    process = curve_cache.refine(fresh.model, fresh.engine.step, {2: 0.25, 9: 0.3})
    assert process.layouts == {} and process.seconds[9] == 0.3
    on_disk = curve_cache.load(key)
    assert on_disk.source == "refined"
    assert on_disk.layouts == measured.layouts and on_disk.pack_single
    assert on_disk.seconds == {**measured.seconds, 2: 0.25, 9: 0.3}
    curve_cache.refine(fresh.model, fresh.engine.step, {9: 0.4})  # within the interval
    assert curve_cache.load(key) == on_disk and curve_cache._CURVES[key].seconds[9] == 0.4


def test_calibrate_measures_stores_and_shows(cache: Path, generator: SpeculativeGenerator,
                                             monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # the real measurement on the real model, over a few sizes to keep the test short
    monkeypatch.setattr(curve_cache, "latency_curve",
                        partial(latency_curve, sizes=(1, 8), repeats=1))
    assert main(["calibrate", "--show"]) == 0
    assert "no stored latency curve" in capsys.readouterr().out
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    assert "source: measured" in out and str(cache / "latency") in out
    assert main(["calibrate", "--show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stored"] and doc["source"] == "measured"
    assert set(doc["seconds"]) == {"1", "2", "9"}
    assert Path(doc["path"]).parent == cache / "latency"
    key = curve_cache.curve_key(generator.model, generator.engine.step)
    assert curve_cache.load(key).source == "measured"  # what every later process reads


def test_calibrate_json_and_a_missing_model(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys) -> None:
    monkeypatch.setattr(curve_cache, "latency_curve",
                        partial(latency_curve, sizes=(1,), repeats=1))
    assert main(["calibrate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "measured" and set(doc["seconds"]) == {"1", "2"}
    assert main(["calibrate", "--model", str(cache / "missing")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "does not exist" in err


def test_a_slow_wait_is_announced_and_a_quick_one_is_not(capsys) -> None:
    with curve_cache.notice_after(3600.0, "never said"):
        pass
    with curve_cache.notice_after(0.0, "timing the model ..."):
        for _ in range(1000):  # until the notice's thread has printed
            if "timing the model" in capsys.readouterr().err:
                break
            curve_cache.threading.Event().wait(0.01)
        else:
            pytest.fail("no notice")
    assert "never said" not in capsys.readouterr().err


def test_the_host_key_names_the_libraries_and_no_gpu_on_the_cpu_suite() -> None:
    import transformers

    from ngram_trie_rag.engine.costs.curve_cache import host

    key = host()
    assert torch.__version__ in key and transformers.__version__ in key
    assert not torch.cuda.is_available() and len(key) == 6  # CUDA is hidden here

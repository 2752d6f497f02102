"""The forward variants are measured in another process after a first answer, paused
while the model's lock is held, and taken between two answers (see
ngram_trie_rag.engine.costs.background_measure)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import EagerEngine
from ngram_trie_rag.engine.costs import background_measure, curve_cache
from tests.tiny_model import tiny_llama

WAIT_S = 120  # the measuring process imports torch and Transformers, then times ~20 sizes


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Background measurement on, into an empty cache folder (and on in this process,
    whatever an earlier test's one-shot command switched off)."""
    monkeypatch.setattr(background_measure, "_DISABLED", False)
    monkeypatch.setenv(background_measure.ENV, "on")
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path / "cache"))


def _saved_tiny(folder: Path, seed: int) -> SpeculativeGenerator:
    """A tiny Llama saved to ``folder`` and loaded back from it (so another process can
    load the same weights), wrapped on the eager engine."""
    model, tokenizer = tiny_llama(seed=seed, vocab_size=64, layers=2)
    model.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return SpeculativeGenerator(loaded, tokenizer, engine=EagerEngine(loaded))


def _state(pid: int) -> str:
    """The process's state letter (T: stopped), from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait(condition, seconds: float = WAIT_S) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


PROMPT = [3, 5, 9, 12, 5, 9, 12, 5, 9, 30, 41]
DOCS = [[5, 9, 12, 5, 9, 12, 7, 7, 30, 41, 42, 43]]


def test_a_second_process_measures_the_variants_paused_while_answering(measuring, tmp_path):
    gen = _saved_tiny(tmp_path / "model", seed=3)
    reference = gen.model.generate(torch.tensor([PROMPT]), max_new_tokens=24,
                                   do_sample=False)[0, len(PROMPT):].tolist()
    first = gen.generate(PROMPT, DOCS, max_new_tokens=24)
    assert gen.engine.curve.source != "measured" and not gen.engine.curve.variants_chosen
    with gen.engine.lock:  # an answer holds the model: the measurement must wait
        assert _wait(lambda: background_measure.running(), 10), "no measurement started"
        pid = background_measure.running()[0]
        assert _wait(lambda: _state(pid) == "T", 5), "the measurement was not paused"
        time.sleep(1.0)
        assert _state(pid) == "T" and not gen.engine.curve.variants_chosen
    assert _wait(lambda: gen.engine.curve.variants_chosen), "the curve was not adopted"
    curve = gen.engine.curve
    assert curve.source == "measured" and pid not in background_measure.running()
    stored, path = gen.engine.stored_curve()  # the next process on this host reads it
    assert stored is not None and stored.variants_chosen and path.is_file()
    assert stored.seconds == curve.seconds and stored.layouts == curve.layouts
    second = gen.generate(PROMPT, DOCS, max_new_tokens=24)  # on the measured variants
    assert first.token_ids == reference == second.token_ids
    gen.generate(PROMPT, DOCS, max_new_tokens=4)  # measured already: nothing starts
    assert background_measure.running() == []


def test_a_model_no_other_process_can_load_is_not_measured(measuring):
    # built in memory: no folder; three layers: no curve of another test's key
    model, tokenizer = tiny_llama(seed=4, vocab_size=64, layers=3)
    gen = SpeculativeGenerator(model, tokenizer, engine=EagerEngine(model))
    assert background_measure.source_folder(model) is None
    gen.generate(PROMPT, DOCS, max_new_tokens=4)
    assert background_measure.start(gen.engine.costs) is None
    assert background_measure.running() == [] and not gen.engine.curve.variants_chosen


def test_a_misspelt_setting_is_refused_when_the_engine_is_built(monkeypatch):
    monkeypatch.setenv(background_measure.ENV, "yes")
    model, _ = tiny_llama(seed=5)
    with pytest.raises(ValueError, match="NGRAM_TRIE_RAG_MEASURE='yes'"):
        EagerEngine(model)


def test_a_stored_curve_says_whether_its_variants_were_chosen(tmp_path):
    measured = curve_cache.LatencyCurve({1: 0.01, 9: 0.02}, {9: "transposed"})
    probed = curve_cache.LatencyCurve({1: 0.01, 9: 0.03}, source="default")
    assert measured.variants_chosen and not probed.variants_chosen
    refined = curve_cache._with_seconds(probed, {9: 0.025})  # refined seconds keep it
    assert refined.source == "refined" and not refined.variants_chosen
    assert curve_cache._with_seconds(measured, {9: 0.015}).variants_chosen
    for i, curve in enumerate((measured, refined)):
        key = ("test", i)
        curve_cache.save(key, curve, tmp_path)
        assert curve_cache.load(key, tmp_path).variants_chosen == curve.variants_chosen


def test_a_forward_timed_across_a_pause_is_timed_again(monkeypatch):
    """The measuring process counts its resumptions (SIGCONT): a timing a pause cut into
    measured the pause, so the forward runs again."""
    from ngram_trie_rag.engine.costs import latency
    from ngram_trie_rag.engine.cpu import forward as forward_module

    model, _ = tiny_llama(seed=6, vocab_size=64)
    timer = latency._ForwardTimer(model, None, None, past_len=16)
    calls = []
    real = forward_module.forward

    def paused_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            latency.note_resumed()  # as the SIGCONT handler does, mid-forward
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_module, "forward", paused_once)
    seconds = timer.seconds(timer.inputs(3), "stock", False)
    assert len(calls) == 2 and 0 < seconds
    assert timer.cache.layers[0].keys.shape[-2] == 16  # each run's rows dropped

"""``engine="auto"``: eager until the process has answered once and the compiled engine's
shapes are ready, then compiled for every request that fits its cache; the store of
compiled steps; the compiled engine's draft budget priced by its own step costs.

Greedy answers on either engine equal plain ``generate``'s (fp32), and each answer names
the engine that ran it.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers as tf
from model_families import FAMILIES, SIZE, build, drafting_documents, random_prompt, word_tokenizer

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import static_engine
from ngram_trie_rag.engine.auto import AUTO_ENV, AutoEngine, auto_engine_for
from ngram_trie_rag.engine.choice import make_engine
from ngram_trie_rag.engine.compiling import artifacts
from ngram_trie_rag.engine.costs.bucket_curve import bucket_curve
from ngram_trie_rag.engine.engine_names import check_capacity, check_engine
from ngram_trie_rag.reference import greedy_reference

NEW = 24


@pytest.fixture(autouse=True)
def auto_chooses(monkeypatch):
    """The suite keeps ``auto`` eager (conftest); here it compiles on this CPU too."""
    monkeypatch.setenv(AUTO_ENV, "compiled")
CAPACITY = 256
NO_COMPILER = static_engine.cpp_compiler() is None


def _llama() -> torch.nn.Module:
    model = build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM)
    model.set_attn_implementation("sdpa")
    return model


@pytest.mark.slow
@pytest.mark.skipif(NO_COMPILER, reason="torch.compile on a CPU needs a C++ compiler")
def test_auto_runs_eager_then_compiled_with_generate_tokens(monkeypatch, tmp_path, caplog) -> None:
    """The first answer runs eager and asks for the compile; once the shapes are ready
    the next answers run compiled, priced by the compiled steps' costs, and every answer
    is ``generate``'s. A second engine over a new model of the same shape finds the
    compiled steps and their costs in the store."""
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    caplog.set_level(logging.INFO, logger="ngram_trie_rag")
    model = _llama()
    engine = AutoEngine(model, CAPACITY, buckets=(4,))
    assert engine.why_eager is None and engine.compiled is not None
    gen = SpeculativeGenerator(model, word_tokenizer(), engine=engine)
    prompts = [random_prompt(40, seed=seed) for seed in (1, 2, 3)]
    plain = [greedy_reference(model, ids, NEW) for ids in prompts]
    docs = [drafting_documents(p, seed=i) for i, p in enumerate(plain)]

    first = gen.generate(prompts[0], documents=docs[0], max_new_tokens=NEW, num_draft=4)
    assert first.token_ids == plain[0] and first.stats.engine == "eager"
    assert engine.compiled.compile_for(CAPACITY, timeout=600)  # asked for by the first answer
    assert set(engine.compiled.compiled_costs) == {0, 4}
    for ids, answer, doc in zip(prompts[1:], plain[1:], docs[1:], strict=True):
        result = gen.generate(ids, documents=doc, max_new_tokens=NEW)  # budgeted trees
        assert result.stats.engine == "compiled"
        assert result.token_ids == answer
        assert max(result.stats.accept_lengths) > 1  # trees were verified
    # the compiled requests drafted with the compiled engine's own costs
    priced = [key for key in gen._budgets if key[0] == id(engine.compiled)]
    assert priced == [(id(engine.compiled), True)]  # priced by the compiled steps' costs
    messages = [r.getMessage() for r in caplog.records]
    assert any("compiled step shape 1/2" in m for m in messages)
    assert any("first compile here" in m for m in messages)
    stored = list((tmp_path / "compiled").glob("*/artifacts.bin"))
    assert len(stored) == 1

    # a new process would load the same: here a second engine over a same-shaped model
    caplog.clear()
    again = AutoEngine(_llama(), CAPACITY, buckets=(4,))
    assert again.warm_up([40], NEW) > 0
    assert again.compiled.compiled_costs == engine.compiled.compiled_costs  # as stored
    assert any("from the stored compile" in r.getMessage() for r in caplog.records)


def test_auto_is_eager_before_any_answer_and_for_requests_past_its_cache() -> None:
    model = _llama()
    engine = AutoEngine(model, CAPACITY)
    assert engine.choose(40, NEW) is engine.eager
    assert engine.describe().name == "auto" and not engine.describe().compiled
    engine.compiled._compiler._ready.add(CAPACITY)  # as if its shapes were compiled
    assert engine.choose(40, NEW) is engine.compiled
    assert engine.choose(CAPACITY, NEW) is engine.eager  # does not fit: eager, not an error
    assert engine.describe().compiled


def test_auto_stays_eager_where_the_compiled_engine_does_not_apply() -> None:
    """On a CPU a model the eager engine runs through its modules (here Qwen2) stays
    eager, saying why; so does one the static engine cannot serve."""
    qwen = build(FAMILIES["qwen2"])
    engine = auto_engine_for(qwen)
    assert engine.compiled is None and "modules" in engine.why_eager
    assert engine.choose(10, 10) is engine.eager
    assert engine.warm_up([10], 10) == 0.0
    gen = SpeculativeGenerator(qwen, word_tokenizer(), engine=engine)
    ids = random_prompt(20, seed=4)
    result = gen.generate(ids, max_new_tokens=8)
    assert result.token_ids == greedy_reference(qwen, ids, 8)
    assert result.stats.engine == "eager"


def test_make_engine_names_and_capacity_checks() -> None:
    model = _llama()
    assert make_engine(model, "auto") is make_engine(model, "auto")
    assert make_engine(model, "auto", capacity=512).capacity == 512
    assert make_engine(model, "auto").capacity == 2048  # the default, within 4,096 positions
    with pytest.raises(ValueError, match="did you mean 'eager'"):
        check_engine("eagre")
    with pytest.raises(ValueError, match="grows as it goes"):
        make_engine(model, "eager", capacity=512)
    with pytest.raises(ValueError, match="too small"):
        check_capacity(16)
    with pytest.raises(ValueError, match="whole number"):
        check_capacity(True)


def test_bucket_curve_is_flat_across_each_bucket() -> None:
    curve = bucket_curve({0: 1.0, 4: 2.0, 8: 3.0})
    assert curve.predict(1) == 1.0
    assert curve.predict(2) == curve.predict(5) == 2.0  # 1-4 nodes pad to 4
    assert curve.predict(6) == curve.predict(9) == 3.0


def test_a_damaged_store_entry_is_deleted_not_loaded(tmp_path) -> None:
    entry = tmp_path / "k"
    entry.mkdir()
    (entry / "artifacts.bin").write_bytes(b"not what was stored")
    (entry / "meta.json").write_text('{"format": 1, "sha256": "0", "costs": {}}')
    assert artifacts.load("k", tmp_path) is None
    assert not entry.exists()
    assert artifacts.load("missing", tmp_path) is None


def test_the_store_keeps_its_cap_dropping_the_least_recently_used(tmp_path) -> None:
    import os
    import time

    for i, name in enumerate(("old", "new")):
        entry = tmp_path / name
        entry.mkdir()
        (entry / "artifacts.bin").write_bytes(b"x" * 2**20)
        (entry / "meta.json").write_text("{}")
        os.utime(entry / "meta.json", (time.time() - 100 + i, time.time() - 100 + i))
    assert artifacts.trim(tmp_path, cap_mb=1.5) == [tmp_path / "old"]
    assert (tmp_path / "new").exists()
    assert artifacts.clear(tmp_path) == 1


def test_the_environment_keeps_auto_eager_and_a_bad_value_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(AUTO_ENV, "eager")
    engine = AutoEngine(_llama())
    assert engine.compiled is None and AUTO_ENV in engine.why_eager
    monkeypatch.setenv(AUTO_ENV, "compiledd")
    with pytest.raises(ValueError, match="leave it unset"):
        AutoEngine(_llama())
    monkeypatch.delenv(AUTO_ENV)  # the default: a CPU stays eager, saying why
    engine = AutoEngine(_llama())
    assert engine.compiled is None and "did not pay" in engine.why_eager


EXIT_MID_COMPILE = """
import sys
sys.path.insert(0, {tests!r})
import torch, transformers as tf
from model_families import SIZE, build, random_prompt, word_tokenizer
from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine.auto import AutoEngine
model = build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM)
model.set_attn_implementation("sdpa")
engine = AutoEngine(model, 256, buckets=(4, 8))
gen = SpeculativeGenerator(model, word_tokenizer(), engine=engine)
gen.generate(random_prompt(20), max_new_tokens=4)  # the first answer starts the compile
print("answered", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(NO_COMPILER, reason="torch.compile on a CPU needs a C++ compiler")
def test_a_script_that_exits_mid_compile_exits_cleanly(tmp_path) -> None:
    """A daemon thread inside torch's C++ code when the interpreter ends it would abort
    the process ("terminate called without an active exception", exit code 134): the
    compile is stopped between shapes and joined at exit instead."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, AUTO_ENV: "compiled", "NGRAM_TRIE_RAG_CACHE": str(tmp_path)}
    script = EXIT_MID_COMPILE.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "answered" in done.stdout
    assert "terminate called" not in done.stderr


def test_calibrate_clears_the_store(monkeypatch, tmp_path, capsys) -> None:
    from ngram_trie_rag.commands.cli import main

    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    (tmp_path / "compiled" / "k").mkdir(parents=True)
    assert main(["calibrate", "--clear-compiled"]) == 0
    assert "deleted 1 stored compiled step set(s)" in capsys.readouterr().out
    assert not (tmp_path / "compiled" / "k").exists()

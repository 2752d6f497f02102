"""The compiled batched step: rows padded to batch buckets, trees to compiled sizes, keys
over every column; every greedy row still gives its ``generate`` tokens.

Compiled here with Inductor on a tiny Llama (a minute on two cores: four graphs); on a
GPU the same graphs run as CUDA graphs (``make test-gpu``)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from model_families import SIZE, build, drafting_documents, random_prompt, word_tokenizer
from test_batched_engine import _run_batched

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import static_engine
from ngram_trie_rag.engine.auto import AUTO_ENV
from ngram_trie_rag.engine.batched import BatchedEngine
from ngram_trie_rag.engine.batched.compiled_step import TREE_SIZES, batch_buckets
from ngram_trie_rag.engine.quant import quantize_model
from ngram_trie_rag.reference import greedy_reference

NO_COMPILER = static_engine.cpp_compiler() is None
NEW = (20, 12, 24, 16, 20)  # answer lengths: rows leave at different steps


def _tiny() -> torch.nn.Module:
    return build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM)


def test_batch_buckets() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(16) == (1, 2, 4, 8, 16)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)


def test_it_compiles_where_auto_would(monkeypatch) -> None:
    model = _tiny()
    monkeypatch.delenv(AUTO_ENV, raising=False)
    engine = BatchedEngine(model, max_batch=2, capacity=64)
    assert engine.compiled is None and "on a CPU" in engine.why_eager  # eager by default
    assert engine.buckets == (1, 4, 8, 16, 32, 64)
    monkeypatch.setenv(AUTO_ENV, "eager")
    assert BatchedEngine(model, max_batch=2, capacity=64, compiled=None).compiled is None
    assert BatchedEngine(model, max_batch=2, capacity=64, compiled=False).why_eager == (
        "compiled=False")


def test_quantized_fp32_weights_are_refused_by_name(monkeypatch) -> None:
    monkeypatch.delenv(AUTO_ENV, raising=False)
    model = quantize_model(_tiny(), "int8")
    with pytest.raises(ValueError, match=r"do not run quantized weights \(int8\) in an fp32"):
        BatchedEngine(model, max_batch=2, capacity=64, compiled=True)
    assert "quantized" in BatchedEngine(model, max_batch=2, capacity=64).why_eager


@pytest.mark.slow
@pytest.mark.skipif(NO_COMPILER, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_rows_joining_and_leaving_decode_as_generate(monkeypatch, tmp_path,
                                                              released) -> None:
    """Five requests through three rows, trees padded to 4 nodes (a plain step too): two
    graphs (one row; 2 and 3 rows, the batch dimension dynamic), compiled in the
    background before the first step; then every step runs a graph, no recompile, and
    each row's tokens are ``generate``'s."""
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))  # nothing stored before
    model = _tiny()
    gen = SpeculativeGenerator(model, word_tokenizer())
    engine = BatchedEngine(model, max_batch=3, capacity=96, base=gen.engine, buckets=(4,),
                           compiled=True)
    compiled = engine.compiled
    assert compiled.shapes() == [(1, 4), (2, 4), (3, 4)]
    assert engine.describe().compiled is False  # compiling in the background
    assert compiled.wait(timeout=900), compiled.failed()
    assert engine.describe().compiled is True
    # the compile thread let its OpenMP team go after each shape's scratch step
    assert released.count("ngram-trie-rag-compile") == len(compiled.shapes())
    prompts = [random_prompt(16 + 4 * i, seed=i) for i in range(len(NEW))]
    expected = [greedy_reference(model, ids, n) for ids, n in zip(prompts, NEW, strict=True)]
    starts = [gen._start(ids, drafting_documents(want, seed=i), None,
                         {"max_new_tokens": n, "num_draft": 4}, engine=engine)
              for i, (ids, want, n) in enumerate(zip(prompts, expected, NEW, strict=True))]
    forwards = []  # rows per batched forward
    run_batch = engine.run_batch
    engine.run_batch = lambda rows: forwards.append(len(rows)) or run_batch(rows)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = _run_batched(gen, engine, starts)
    assert got == expected
    accepted = sum(sum(a - 1 for a in s.request.stats.accept_lengths) for s in starts)
    assert accepted > 0  # trees were verified
    assert compiled.calls == len(forwards)  # every forward ran a graph
    assert set(forwards) == {1, 2, 3}  # rows together, and one alone
    assert (tmp_path / "compiled").is_dir()  # stored for the next process


def test_default_tree_sizes_fit_the_default_draft() -> None:
    from ngram_trie_rag.drafting.config import DraftConfig

    assert max(TREE_SIZES) >= DraftConfig().num_draft  # a lone row's draft runs a graph

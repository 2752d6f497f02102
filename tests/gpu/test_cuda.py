"""On CUDA (``make test-gpu``): greedy speculative output token-identical to
``model.generate(do_sample=False)`` in fp32 with TF32 off (the packaged model on real
prompts, a 4k-token prompt, eager attention, and every family of the architecture matrix
at toy size), the on-device acceptance walk equal to the host walk, seeded sampling
reproducible, continuous batching's rows equal to ``generate``, the compiled static
engine replaying its graphs without recompiling, one host sync per greedy tree step,
bf16 and fp16 agreement with ``generate`` reported, and the one-shape engine's methods
agreeing with each other in bf16.

Skipped with a reason on a host without CUDA, and in the CPU suite (``../../conftest.py``
hides CUDA there). Environment:

- ``NGRAM_TRIE_RAG_TEST_MODEL``: the model to load instead of the packaged one (a folder
  or a GGUF), for a host without the packaged model's wheel.
- ``NGRAM_TRIE_RAG_TEST_DEVICE=cpu`` (with ``NGRAM_TRIE_RAG_TEST_QUICK=1``): the same
  tests on the CPU at small sizes, a check of their code before a GPU runs it; the tests
  of CUDA-only mechanics (graphs, sync counting) skip there.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from data_files import read_jsonl
from model_families import (
    FAMILIES,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
    word_tokenizer,
)

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.decoding.sampling import SamplingParams
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine import acceptance
from ngram_trie_rag.engine.acceptance import host_walk as accept
from ngram_trie_rag.reference import greedy_reference

pytestmark = pytest.mark.gpu

DEVICE = os.environ.get("NGRAM_TRIE_RAG_TEST_DEVICE", "cuda")
QUICK = os.environ.get("NGRAM_TRIE_RAG_TEST_QUICK") == "1"
MAX_NEW = 16 if QUICK else 64
PROMPTS = 1 if QUICK else 8
LONG_PROMPT = 1024 if QUICK else 4096  # tokens
# The packaged model by default; a GPU host without its wheel passes a folder or a GGUF.
MODEL = os.environ.get("NGRAM_TRIE_RAG_TEST_MODEL") or None
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="a CUDA mechanism")


def _fp32_means_fp32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness is checked
    torch.backends.cudnn.allow_tf32 = False


def _messages(count: int = PROMPTS) -> list[list[dict]]:
    rows = read_jsonl("spec_bench/rag.jsonl", count)
    return [[{"role": "user", "content": row["turns"][0]}] for row in rows]


@pytest.fixture(scope="module")
def fp32_gen() -> SpeculativeGenerator:
    _fp32_means_fp32()
    return SpeculativeGenerator.from_pretrained(MODEL, device=DEVICE, dtype="float32")


@pytest.mark.parametrize("method", ["trie", "chain"])
def test_greedy_equals_generate_in_fp32(fp32_gen: SpeculativeGenerator, method: str) -> None:
    assert fp32_gen.model.device.type == DEVICE
    for messages in _messages():
        ids = fp32_gen.encode_prompt(messages)
        expected = greedy_reference(fp32_gen.model, ids, MAX_NEW)
        result = fp32_gen.generate(messages, max_new_tokens=MAX_NEW, method=method)
        assert result.token_ids == expected


def test_batched_rows_equal_generate_in_fp32(fp32_gen: SpeculativeGenerator) -> None:
    """Continuous batching on the device, eager steps: every request sent at once
    through the batch scheduler (rows joining as their prefills finish, leaving as they
    end) gives its own ``generate`` tokens, its own documents' drafts."""
    from concurrent.futures import ThreadPoolExecutor

    from ngram_trie_rag.serving.scheduler import BatchScheduler

    messages = _messages(max(PROMPTS, 4))
    expected = [greedy_reference(fp32_gen.model, fp32_gen.encode_prompt(m), MAX_NEW)
                for m in messages]
    with BatchScheduler(fp32_gen, max_batch=4, capacity=2048, compiled=False) as scheduler, \
            ThreadPoolExecutor(len(messages)) as pool:
        results = list(pool.map(lambda m: scheduler.generate(
            m, [m[0]["content"]], max_new_tokens=MAX_NEW, method="trie"), messages))
    assert [r.token_ids for r in results] == expected
    assert all(r.stats.engine == "batched" for r in results)


@cuda_only
def test_compiled_batched_rows_equal_generate_in_fp32(fp32_gen: SpeculativeGenerator,
                                                      capsys) -> None:
    """The batch scheduler's steps compiled (the default on CUDA: rows padded to batch
    buckets, trees to 8 or 32 nodes, CUDA graphs): every request sent at once, after the
    shapes are compiled, gives its own ``generate`` tokens, and every step replays a
    graph; the compile time reported."""
    from concurrent.futures import ThreadPoolExecutor

    from ngram_trie_rag.serving.scheduler import BatchScheduler

    messages = _messages(max(PROMPTS, 4))
    expected = [greedy_reference(fp32_gen.model, fp32_gen.encode_prompt(m), MAX_NEW)
                for m in messages]
    with BatchScheduler(fp32_gen, max_batch=4, capacity=2048) as scheduler:
        compiled = scheduler.engine.compiled
        assert compiled is not None, scheduler.engine.why_eager  # the default on CUDA
        seconds = scheduler.warm_up(timeout=1800)
        before = compiled.calls
        with ThreadPoolExecutor(len(messages)) as pool:
            results = list(pool.map(lambda m: scheduler.generate(
                m, [m[0]["content"]], max_new_tokens=MAX_NEW, method="trie"), messages))
        steps = compiled.calls - before
    assert [r.token_ids for r in results] == expected
    assert steps == scheduler.steps_run > 0  # every step replayed a graph
    with capsys.disabled():
        print(f"\ncompiled batched steps: {len(compiled.shapes())} shapes ready after "
              f"{seconds:.1f} s; {steps} of {scheduler.steps_run} steps compiled; "
              f"{len(messages)}/{len(messages)} answers equal generate (fp32)")


def test_a_long_prompt_in_fp32(fp32_gen: SpeculativeGenerator) -> None:
    """A prompt of ``LONG_PROMPT`` tokens (passages of several questions, the question
    last): the tree mask and positions far into the cache."""
    tokenizer = fp32_gen.tokenizer
    text = " ".join(row["turns"][0] for row in read_jsonl("spec_bench/rag.jsonl", 40))
    while len(tokenizer.encode(text)) < LONG_PROMPT:
        text = f"{text} {text}"
    text = tokenizer.decode(tokenizer.encode(text)[:LONG_PROMPT], skip_special_tokens=True)
    messages = [{"role": "user", "content": text + "\nSummarise the passages above."}]
    ids = fp32_gen.encode_prompt(messages)
    expected = greedy_reference(fp32_gen.model, ids, MAX_NEW)
    result = fp32_gen.generate(messages, max_new_tokens=MAX_NEW, method="trie",
                               documents=[text])
    assert len(ids) >= LONG_PROMPT and result.token_ids == expected


def test_eager_attention_with_the_tree_mask_in_fp32() -> None:
    """The additive float mask of eager attention, beside SDPA's (every other test)."""
    _fp32_means_fp32()
    gen = SpeculativeGenerator.from_pretrained(MODEL, device=DEVICE, dtype="float32",
                                               attn_implementation="eager")
    for messages in _messages(min(PROMPTS, 2)):
        ids = gen.encode_prompt(messages)
        expected = greedy_reference(gen.model, ids, MAX_NEW)
        assert gen.generate(messages, max_new_tokens=MAX_NEW, method="trie").token_ids == expected


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_architecture_matrix_greedy_equals_generate_in_fp32(family: str) -> None:
    """Every family the engine claims, at toy size with random weights: sliding windows,
    MoE, GQA, RoPE variants, learned positions."""
    _fp32_means_fp32()
    model = build(FAMILIES[family]).to(DEVICE)
    gen = pinned_generator(model)
    for seed in (1, 2):
        ids = random_prompt(160, seed=seed)
        expected = greedy_reference(model, ids, 32)
        docs = drafting_documents(expected, seed=seed)
        for method, num_draft in (("trie", 8), ("chain", 4)):
            result = gen.generate(ids, documents=docs, max_new_tokens=32, method=method,
                                  num_draft=num_draft)
            assert result.token_ids == expected, (family, method, seed)
        assert max(result.stats.accept_lengths) > 1  # trees were verified


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_architecture_matrix_through_the_static_engine_in_fp32(family: str) -> None:
    """Every family through the static engine (eager steps, trees padded to 4 or 8
    nodes): its masks built on the device from positions, sliding windows included (an
    80-token prompt crosses the toy models' 64-position windows), compaction on the
    device; plain, chain and trie equal to ``generate``."""
    from ngram_trie_rag.engine import LatencyCurve
    from ngram_trie_rag.engine.static_engine import StaticEngine

    _fp32_means_fp32()
    model = build(FAMILIES[family]).to(DEVICE)
    flat = LatencyCurve({q: 0.01 for q in (1, 2, 3, 5, 9, 17, 33)}, {}, pack_single=False)
    engine = StaticEngine(model, compiled=False, buckets=(4, 8), curve=flat)
    gen = SpeculativeGenerator(model, word_tokenizer(), engine=engine)
    ids = random_prompt(80, seed=3)
    expected = greedy_reference(model, ids, 24)
    docs = drafting_documents(expected, seed=3)
    for method, num_draft in (("none", None), ("chain", 3), ("trie", 8)):
        result = gen.generate(ids, documents=docs, max_new_tokens=24, method=method,
                              num_draft=num_draft)
        assert result.token_ids == expected, (family, method)
    assert max(result.stats.accept_lengths) > 1  # the trie's trees were verified


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_agreement_with_generate_is_reported(dtype: str, capsys) -> None:
    """Half-precision logits depend on the shape of the forward, so a tree step may pick
    another token than a one-token step where two are within rounding: reported, with
    the first divergence, not required."""
    gen = SpeculativeGenerator.from_pretrained(MODEL, device=DEVICE, dtype=dtype)
    same, firsts = 0, []
    for messages in _messages():
        ids = gen.encode_prompt(messages)
        expected = greedy_reference(gen.model, ids, MAX_NEW)
        got = gen.generate(messages, max_new_tokens=MAX_NEW, method="trie").token_ids
        assert got and expected  # both decoded something
        same += got == expected
        firsts.append(next((i for i, (a, b) in enumerate(zip(got, expected, strict=False))
                            if a != b), min(len(got), len(expected))))
    with capsys.disabled():
        print(f"\n{dtype} trie vs generate: {same}/{PROMPTS} identical, first divergence at "
              f"tokens {firsts}")


@pytest.mark.parametrize("engine", ["uniform", pytest.param("uniform-compiled",
                                                           marks=cuda_only)])
def test_one_step_shape_makes_every_method_agree_in_bf16(engine: str, capsys) -> None:
    """``engine="uniform"``: every decode forward has one shape, so in bf16 trie and chain
    give plain decoding's tokens through the same engine (docs/gpu.md); compiled too."""
    gen = SpeculativeGenerator.from_pretrained(MODEL, device=DEVICE, dtype="bfloat16",
                                               engine=engine)
    for messages in _messages():
        plain = gen.generate(messages, max_new_tokens=MAX_NEW, method="none").token_ids
        for method in ("trie", "chain"):
            got = gen.generate(messages, max_new_tokens=MAX_NEW, method=method).token_ids
            assert got == plain, method
    with capsys.disabled():
        print(f"\nbf16 {engine} engine: trie and chain equal plain on {PROMPTS} prompts")


def test_seeded_sampling_is_reproducible(fp32_gen: SpeculativeGenerator) -> None:
    """The same seed gives the same sampled answer, through trie and chain steps alike."""
    messages = _messages(1)[0]
    for method in ("trie", "chain"):
        runs = [fp32_gen.generate(messages, max_new_tokens=MAX_NEW, method=method,
                                  temperature=0.8, top_p=0.95, seed=seed).token_ids
                for seed in (7, 7, 8)]
        assert runs[0] == runs[1] and len(runs[0]) > 0, method


def _random_tree(rng: np.random.Generator, n: int, vocab: int) -> DraftTree:
    parents, depths, tokens = [], [], []
    for i in range(n):
        parent = int(rng.integers(-1, i))
        siblings = {tokens[j] for j in range(i) if parents[j] == parent}
        free = [t for t in range(vocab) if t not in siblings]
        tokens.append(int(rng.choice(free)))
        parents.append(parent)
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return DraftTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64),
                     np.array(depths, dtype=np.int64))


def test_device_acceptance_equals_the_host_walk_on_cuda() -> None:
    rng = np.random.default_rng(0)
    greedy = SamplingParams()
    for _ in range(200):
        n = int(rng.integers(1, 33))
        tree = _random_tree(rng, n, 8)
        logits = torch.randn(1 + n, 8, device=DEVICE)
        assert acceptance.device_walk(tree, logits, greedy, None) == accept(
            tree, logits, greedy, None)


@cuda_only
def test_compiled_static_engine_replays_its_graphs_in_fp32(capsys) -> None:
    """The compiled static engine (CUDA graphs, trees padded to 16 nodes): the first
    answer runs eagerly while a background thread compiles the shapes; after that every
    step replays a graph, ``trie`` and ``chain`` equal to plain decoding through the same
    engine, with no recompilation; agreement with ``generate`` reported (compiled kernels
    may round differently)."""
    from ngram_trie_rag.engine.static_engine import StaticEngine
    from ngram_trie_rag.loading import load_model

    _fp32_means_fp32()
    model, tokenizer = load_model(MODEL, device="cuda", dtype="float32")
    # one cache size for every prompt: a cache of another size is another shape to compile
    engine = StaticEngine(model, compiled=True, buckets=(16,), capacity=4096)
    gen = SpeculativeGenerator(model, tokenizer, engine=engine, num_draft=16)
    prompts = _messages()[:3]
    start = time.perf_counter()
    first = gen.generate(prompts[0], max_new_tokens=MAX_NEW, method="none")
    answered = time.perf_counter() - start
    assert engine.compile_for(4096, timeout=600), engine._compiler.failed(4096)
    compiled_after = time.perf_counter() - start
    same_as_generate = 0
    with torch.compiler.set_stance("fail_on_recompile"):
        for messages in prompts:
            plain = gen.generate(messages, max_new_tokens=MAX_NEW, method="none").token_ids
            for method in ("trie", "chain"):
                assert gen.generate(messages, max_new_tokens=MAX_NEW,
                                    method=method).token_ids == plain
            expected = greedy_reference(model, gen.encode_prompt(messages), MAX_NEW)
            same_as_generate += plain == expected
    with capsys.disabled():
        print(f"\ncompiled static engine: first answer ({len(first.token_ids)} tokens, "
              f"eager) in {answered:.1f} s, both shapes compiled after {compiled_after:.1f} "
              f"s; vs generate (fp32): {same_as_generate}/{len(prompts)} identical")


@cuda_only
def test_auto_runs_eager_then_compiled_in_fp32(monkeypatch, tmp_path, capsys) -> None:
    """``engine="auto"`` on CUDA: the first answer runs eagerly and starts the compile of
    the static engine's shapes (CUDA graphs); then every answer runs compiled, ``trie``
    equal to plain decoding through the same engine; the compile time, the compiled
    steps' costs and agreement with ``generate`` reported."""
    from ngram_trie_rag.engine.auto import AUTO_ENV, AutoEngine
    from ngram_trie_rag.loading import load_model

    monkeypatch.delenv(AUTO_ENV, raising=False)
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))  # a machine that never compiled
    _fp32_means_fp32()
    model, tokenizer = load_model(MODEL, device="cuda", dtype="float32")
    engine = AutoEngine(model)
    assert engine.compiled is not None, engine.why_eager
    gen = SpeculativeGenerator(model, tokenizer, engine=engine)
    prompts = _messages()[:3]
    start = time.perf_counter()
    first = gen.generate(prompts[0], max_new_tokens=MAX_NEW)
    assert first.stats.engine == "eager"
    assert engine.compiled.compile_for(engine.capacity, timeout=1800)
    compiled_after = time.perf_counter() - start
    same_as_generate = 0
    for messages in prompts:
        plain = gen.generate(messages, max_new_tokens=MAX_NEW, method="none")
        trie = gen.generate(messages, max_new_tokens=MAX_NEW, method="trie")
        assert plain.stats.engine == trie.stats.engine == "compiled"
        assert trie.token_ids == plain.token_ids
        expected = greedy_reference(model, gen.encode_prompt(messages), MAX_NEW)
        same_as_generate += plain.token_ids == expected
    steps = sorted(engine.compiled.compiled_costs.items())
    costs = ", ".join(f"{q}: {s * 1e3:.2f}" for q, s in steps)
    with capsys.disabled():
        print(f"\nauto on CUDA: compiled {len(engine.compiled.step_sizes())} shapes "
              f"{compiled_after:.1f} s after the start; step ms by tree size: {costs}; "
              f"vs generate (fp32): {same_as_generate}/{len(prompts)} identical")


@cuda_only
def test_one_host_sync_per_greedy_tree_step(capsys) -> None:
    """A greedy tree step of the static engine (prepare, forward, acceptance on the device,
    compaction) waits for the device once: where it reads the accepted path. Counted with
    CUDA's sync debug mode, which warns at every synchronising call."""
    import warnings

    from ngram_trie_rag.engine.static_engine import StaticEngine
    from ngram_trie_rag.loading import load_model

    model, tokenizer = load_model(MODEL, device="cuda", dtype="float32")
    engine = StaticEngine(model, compiled=False, buckets=(8,), max_new_tokens=32)
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20)
    kv, logits = engine.prefill(ids)
    last = int(logits.argmax())
    tree = _random_tree(np.random.default_rng(1), 8, 50)
    counts, sites = [], []
    for _ in range(4):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                inputs = engine.prepare(kv, last, tree)
                step_logits = engine.run(kv, inputs)
                tokens, path = engine.accept(inputs, tree, step_logits, SamplingParams(), None)
                engine.commit(kv, inputs, path)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        counts.append(len(syncs))
        sites.append([f"{w.filename}:{w.lineno}" for w in syncs])
        last = tokens[-1]
    with capsys.disabled():
        print(f"\nhost syncs per greedy tree step (static engine, eager): {counts}")
    assert counts[1:] == [1] * (len(counts) - 1), sites  # the first step allocates


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_greedy_equals_its_own_generate(scheme: str) -> None:
    """Weight-only int8 / int4 on the device's kernels (bf16 activations into them on a
    GPU, fp32 elsewhere; attention in fp64 on a GPU, row-wise on an AVX-512 CPU): the
    trie and the chain give the quantized model's own ``generate`` tokens."""
    _fp32_means_fp32()
    gen = SpeculativeGenerator.from_pretrained(MODEL, device=DEVICE, dtype="float32",
                                               quantization=scheme)
    for messages in _messages():
        expected = greedy_reference(gen.model, gen.encode_prompt(messages), MAX_NEW)
        for method in ("trie", "chain"):
            result = gen.generate(messages, max_new_tokens=MAX_NEW, method=method)
            assert result.token_ids == expected, method

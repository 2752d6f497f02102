"""The static engine: a preallocated cache, trees padded to fixed sizes, eager or compiled.

Greedy answers equal plain ``generate``'s on the packaged model (eager); on tiny random
Llama and Qwen2 models the compiled engine's answers equal the eager one's, with no
recompilation once every step shape has been compiled; the cache is never moved.
"""

from __future__ import annotations

import os
import threading
import traceback

import numpy as np
import pytest
import torch
import transformers as tf
from data_files import read_jsonl
from model_families import FAMILIES, SIZE, build, drafting_documents, random_prompt, word_tokenizer
from torch.overrides import TorchFunctionMode

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.runner import warm_up
from ngram_trie_rag.decoding.sampling import SamplingParams
from ngram_trie_rag.drafting import DraftTree
from ngram_trie_rag.engine import EagerEngine, EngineInfo, LatencyCurve, static_engine
from ngram_trie_rag.engine.compiling.own_code import own_code
from ngram_trie_rag.engine.static_engine import StaticEngine, static_engine_for
from ngram_trie_rag.engine.trees.staging import Staging
from ngram_trie_rag.reference import greedy_reference

MAX_NEW = 64
SMALL_NEW = 24
SMALL_BUCKETS = (4, 8)
FLAT = LatencyCurve({q: 0.01 for q in (1, 2, 3, 5, 9, 17, 33)}, {}, pack_single=False)
NO_COMPILER = static_engine.cpp_compiler() is None  # the engine's own test


def _static_generator(model, tokenizer, engine: StaticEngine) -> SpeculativeGenerator:
    return SpeculativeGenerator(model, tokenizer, engine=engine)


# ---- the packaged model, eager ----------------------------------------------------------

@pytest.fixture(scope="module")
def static_generator(generator):
    """A generator over the session's model (fp32) running the eager static engine, with
    the model's measured latency curve."""
    engine = StaticEngine(generator.model, compiled=False, curve=generator.engine.curve)
    return _static_generator(generator.model, generator.tokenizer, engine)


def _rag_prompts(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": row["turns"][0]}]
            for row in read_jsonl("spec_bench/rag.jsonl", count)]


_REFERENCE: dict[tuple[int, ...], list[int]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["trie", "chain"])
def test_packaged_model_greedy_equals_generate(generator, static_generator, method) -> None:
    for messages in _rag_prompts(1):
        ids = generator.encode_prompt(messages)
        key = tuple(ids)
        if key not in _REFERENCE:
            _REFERENCE[key] = greedy_reference(generator.model, ids, MAX_NEW)
        result = static_generator.generate(messages, max_new_tokens=MAX_NEW, method=method)
        assert result.token_ids == _REFERENCE[key]
        assert sum(result.stats.accept_lengths) + 1 == len(result.token_ids)


# ---- tiny models ------------------------------------------------------------------------

def _tiny(name: str, attention: str = "sdpa") -> torch.nn.Module:
    """A tiny random ``"llama"`` (default RoPE) or model of a family in FAMILIES."""
    if name == "llama":
        model = build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM)
    else:
        model = build(FAMILIES[name])
    model.set_attn_implementation(attention)
    return model


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_eager_static_equals_generate_on_tiny_llama(attention: str) -> None:
    """Bool masks (SDPA) and additive masks (eager attention) both verify trees exactly."""
    model = _tiny("llama", attention)
    engine = StaticEngine(model, compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    gen = _static_generator(model, word_tokenizer(), engine)
    for seed in (1, 2):
        ids = random_prompt(48, seed=seed)
        expected = greedy_reference(model, ids, SMALL_NEW)
        docs = drafting_documents(expected, seed=seed)
        for method, num_draft in (("trie", 8), ("chain", 3), ("none", None)):
            result = gen.generate(ids, documents=docs, max_new_tokens=SMALL_NEW,
                                  method=method, num_draft=num_draft)
            assert result.token_ids == expected, (method, seed)
        assert max(result.stats.accept_lengths) >= 1


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_uniform_steps_give_every_method_the_same_tokens_in_bf16(family: str) -> None:
    """One step shape for plain steps and trees alike: in bf16 a drafting method's tokens
    are plain decoding's, whatever it drafted; in fp32 they are ``generate``'s."""
    model = _tiny(family)
    for dtype in (torch.bfloat16, torch.float32):
        model.to(dtype)
        engine = StaticEngine(model, compiled=False, uniform=8, curve=FLAT)
        gen = _static_generator(model, word_tokenizer(), engine)
        for seed in (1, 2, 3):
            ids = random_prompt(48, seed=seed)
            plain = gen.generate(ids, max_new_tokens=SMALL_NEW, method="none").token_ids
            if dtype == torch.float32:
                assert plain == greedy_reference(model, ids, SMALL_NEW), seed
            docs = drafting_documents(plain, seed=seed)
            for method, num_draft in (("trie", 8), ("chain", 3)):
                result = gen.generate(ids, documents=docs, max_new_tokens=SMALL_NEW,
                                      method=method, num_draft=num_draft)
                assert result.token_ids == plain, (dtype, method, seed)
                assert max(result.stats.accept_lengths) > 1  # trees were verified


def test_a_uniform_engine_pads_every_step_and_refuses_larger_trees() -> None:
    engine = StaticEngine(_tiny("llama"), compiled=False, uniform=4, curve=FLAT)
    kv, logits = engine.prefill(random_prompt(20, seed=5))
    last = int(logits.argmax())
    plain = engine.prepare(kv, last, DraftTree(np.array([], dtype=np.int64),
                                               np.array([], dtype=np.int64),
                                               np.array([], dtype=np.int64)))
    assert plain.ids.shape == (1, 5) and plain.drafted == 0
    assert engine.run(kv, plain).shape[0] == 1  # the padding's logits are dropped
    chain = DraftTree(np.arange(2, 7), np.arange(-1, 4), np.arange(1, 6))  # 5 nodes
    with pytest.raises(ValueError, match="uniform step of 4 nodes"):
        engine.prepare(kv, last, chain)
    with pytest.raises(ValueError, match="positive node count"):
        StaticEngine(_tiny("llama"), uniform=0)


def test_cache_is_never_reallocated() -> None:
    model = _tiny("llama")
    engine = StaticEngine(model, compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    ids = random_prompt(30, seed=3)
    kv, logits = engine.prefill(ids)
    assert logits.shape == (model.config.vocab_size,)
    layer = kv.cache.layers[0]
    pointer, capacity = layer.keys.data_ptr(), layer.max_cache_len
    assert capacity >= len(ids) + 1024 + max(SMALL_BUCKETS) + 1
    last = int(logits.argmax())
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 1, -1, 3]),
                     np.array([1, 2, 3, 1, 2]))
    for path in ([1, 2], [4, 5], [], [1, 2, 3]):
        inputs = engine.prepare(kv, last, tree)
        assert inputs.ids.shape == (1, 1 + 8)  # padded to its bucket
        assert inputs.mask.shape == (1, 1, 9, capacity)
        out = engine.run(kv, inputs)
        assert out.shape == (1 + len(tree), model.config.vocab_size)  # real rows only
        before = kv.length
        engine.commit(kv, inputs, path)
        assert kv.length == before + 1 + len(path) == len(kv.ids)
        assert all(int(lay.cumulative_length) == kv.length for lay in kv.cache.layers)
        plain = engine.prepare(kv, last, DraftTree.empty())
        engine.run(kv, plain)
        engine.commit(kv, plain, [])
    assert layer.keys.data_ptr() == pointer and kv.cache.layers[0] is layer
    # the next request of a similar size reuses the same buffers
    kv2, _ = engine.prefill(random_prompt(40, seed=4))
    assert kv2.cache.layers[0].keys.data_ptr() == pointer and kv2.length == 40


class _HostTransfers(TorchFunctionMode):
    """Calls that, on an accelerator, move data between host and device or wait for it:
    reads of device values, tensors made from host data, and copies our own code starts
    (the model's internal dtype and same-device ``to`` calls are not transfers)."""

    READS = {"tolist", "item", "__bool__", "__int__", "__index__", "__float__", "numpy",
             "cpu", "nonzero"}
    FROM_HOST = {"tensor", "as_tensor", "from_numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in self.READS or name in self.FROM_HOST:
            self.seen.append(name)
        elif name in ("to", "copy_") and _called_from_package():
            blocking = not kwargs.get("non_blocking", False)
            self.seen.append(f"{name}{' (blocking)' if blocking else ''}")
        return func(*args, **kwargs)


def _called_from_package() -> bool:
    frames = traceback.extract_stack()[:-2]
    outside_torch = [f for f in frames if f"{os.sep}torch{os.sep}" not in f.filename]
    return f"{os.sep}ngram_trie_rag{os.sep}" in outside_torch[-1].filename


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_tree_step_reads_the_device_once_and_uploads_nothing_else(attention: str) -> None:
    """prepare, forward, acceptance and compaction of a tree step: the accepted path's one
    read is the only transfer (on a GPU the ids, positions and ancestor block travel in
    one non-blocking copy of a pinned buffer, which a CPU skips)."""
    model = _tiny("llama", attention)
    engine = StaticEngine(model, compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    ids = random_prompt(30, seed=6)
    kv, logits = engine.prefill(ids)
    expected = greedy_reference(model, ids, 6)
    last = expected[0]
    # a tree whose first branch is the greedy continuation: a path of 3 is accepted
    wrong = (expected[1] + 1) % model.config.vocab_size
    tree = DraftTree(np.array([wrong, expected[1], expected[2], expected[3]]),
                     np.array([-1, -1, 1, 2]), np.array([1, 1, 2, 3]))
    greedy = SamplingParams()
    for step_tree in (tree, DraftTree.empty()):
        with _HostTransfers() as transfers:
            inputs = engine.prepare(kv, last, step_tree)
            out = engine.run(kv, inputs)
            tokens, path = engine.accept(inputs, step_tree, out, greedy, None)
            engine.commit(kv, inputs, path)
        assert transfers.seen == ["tolist"]
        last = tokens[-1]
    assert path == [] and kv.ids[len(ids):] == expected[:5]  # compaction kept the path
    assert tokens == [expected[5]]


def test_a_reserved_cache_serves_every_smaller_request_at_one_size() -> None:
    """``reserve``: one cache size for requests of any length up to it, so a compiled
    engine compiles one size's shapes for all of them (the benchmark reserves its longest
    prompt's); a size too small for one tree is refused."""
    engine = StaticEngine(_tiny("llama"), compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    short, long = random_prompt(20, seed=1), random_prompt(300, seed=2)
    assert engine.capacity_for(len(short), 8) < engine.capacity_for(len(long), 8)
    size = engine.reserve(engine.capacity_for(len(long), 8))
    assert engine.capacity_for(len(short), 8) == engine.capacity_for(len(long), 8) == size
    pointer = engine.prefill(short, 8)[0].cache.layers[0].keys.data_ptr()
    layer = engine.prefill(long, 8)[0].cache.layers[0]
    assert layer.keys.data_ptr() == pointer and layer.max_cache_len == size
    assert engine.reserve(64) == size  # a smaller reservation keeps the larger cache
    with pytest.raises(ValueError, match="capacity 9 leaves no room for a step of 9 tokens"):
        engine.reserve(9)


def test_staging_packs_arrays_into_one_buffer() -> None:
    staging = Staging(torch.device("cpu"), size=8)
    a, b = np.arange(6).reshape(2, 3), np.eye(3, dtype=bool)
    ta, tb = staging.upload(a, b)  # grows: 15 > 8
    assert ta.dtype == tb.dtype == torch.int64
    assert ta.tolist() == a.tolist() and tb.bool().tolist() == b.tolist()
    (tc,) = staging.upload(np.array([7]))
    assert tc.tolist() == [7]


def test_compaction_matches_the_base_engine() -> None:
    """After a tree step and its commit, the next step's logits equal the base engine's."""
    model = _tiny("llama")
    static = StaticEngine(model, compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    base = EagerEngine(model, curve=FLAT)
    ids = random_prompt(25, seed=5)
    tree = DraftTree(np.array([11, 12, 13, 14]), np.array([-1, 0, -1, 2]),
                     np.array([1, 2, 1, 2]))
    results = []
    for engine in (static, base):
        with torch.inference_mode():
            kv, logits = engine.prefill(ids)
            inputs = engine.prepare(kv, 7, tree)
            step = engine.run(kv, inputs)
            engine.commit(kv, inputs, [3, 4])
            nxt = engine.prepare(kv, 20, DraftTree.empty())
            results.append((logits, step, engine.run(kv, nxt)))
    for ours, theirs in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_equals_generate_through_the_static_engine(name: str) -> None:
    """The architecture matrix through the static engine (eager): sliding windows
    (Mistral, Qwen2's windowed layer, Phi-3, Gemma 2 and 3, 64 positions here) crossed by
    an 80-token prompt, each layer type with its own mask over the full-length cache."""
    family = FAMILIES[name]
    model = build(family)
    engine = StaticEngine(model, compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    gen = _static_generator(model, word_tokenizer(), engine)
    ids = random_prompt(80, seed=3)
    expected = greedy_reference(model, ids, SMALL_NEW)
    docs = drafting_documents(expected, seed=3)
    for method, num_draft in (("none", None), ("chain", 3), ("trie", 8)):
        result = gen.generate(ids, documents=docs, max_new_tokens=SMALL_NEW, method=method,
                              num_draft=num_draft)
        assert result.token_ids == expected, method
    assert max(result.stats.accept_lengths) > 1  # the trie's trees were verified


def test_refuses_rope_that_recomputes() -> None:
    config = tf.LlamaConfig(**{**SIZE, "max_position_embeddings": 256,
                               "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                   "rope_theta": 10000.0}})
    with pytest.raises(ValueError, match="rotary"):
        StaticEngine(build(config, tf.LlamaForCausalLM), compiled=False)


def test_static_engine_for_is_cached_per_model() -> None:
    model = _tiny("llama")
    assert static_engine_for(model) is static_engine_for(model)
    assert static_engine_for(model).describe() == EngineInfo("static", False, "modules")
    assert static_engine_for(model, compiled=True).describe().name == "compiled"


# ---- compiled ---------------------------------------------------------------------------

class _CountCalls:
    """Wraps the engine's compiled step, counting the calls that reach it."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.mark.slow
@pytest.mark.skipif(NO_COMPILER, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_in_the_background_equals_eager_without_recompiles(monkeypatch, tmp_path,
                                                                  released) -> None:
    """A non-Llama family (Qwen2) through one compiled bucket and the plain step: two
    graphs, compiled on the background thread while the first answer runs eagerly, then
    every answer runs compiled, equal to the eager engine's, with no recompilation (a
    minute of the suite; more buckets cost more of it). The plain step's linear layers
    run transposed, the tree step's stock: both layouts in compiled graphs."""
    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))  # nothing stored: all timed
    model = _tiny("qwen2")
    eager = StaticEngine(model, compiled=False, buckets=(4,), curve=FLAT)
    compiled = StaticEngine(model, compiled=True, buckets=(4,), curve=FLAT,
                            transposed_rows=(1,))
    assert compiled.step_sizes() == (0, 4)
    step = compiled._compiled_fn = _CountCalls(compiled._compiled_fn)
    eager_gen = _static_generator(model, word_tokenizer(), eager)
    compiled_gen = _static_generator(model, word_tokenizer(), compiled)
    prompts = {seed: random_prompt(40, seed=seed) for seed in (1, 2)}
    capacity = compiled.capacity_for(40, SMALL_NEW)
    assert all(compiled.capacity_for(len(ids), SMALL_NEW) == capacity
               for ids in prompts.values())
    plain = {seed: eager_gen.generate(ids, max_new_tokens=SMALL_NEW, method="none").token_ids
             for seed, ids in prompts.items()}
    docs = {seed: drafting_documents(plain[seed], seed=seed) for seed in prompts}

    # compiling starts before any request has a cache; the first answer runs meanwhile
    compiled._compiler.request(capacity)
    first = compiled_gen.generate(prompts[1], documents=docs[1], max_new_tokens=SMALL_NEW,
                                  method="trie", num_draft=4)
    assert first.token_ids == plain[1]
    # as the benchmark does before it times a prompt: wait for its shapes
    assert warm_up(compiled_gen, [prompts[2]], SMALL_NEW) > 0
    assert compiled.compile_for(capacity, timeout=0) and warm_up(eager_gen, [[1, 2]], 1) == 0
    # the background thread's scratch calls: a compile, then the timed runs, per shape
    assert step.calls == len(compiled.step_sizes()) * (1 + static_engine.TIMED_RUNS)
    # and it let its OpenMP team go after each shape and after the timings
    assert released.count("ngram-trie-rag-compile") == len(compiled.step_sizes()) + 1
    assert set(compiled.compiled_costs) == {0, 4}  # its draft budgets read these
    assert compiled.curve.predict(2) == compiled.curve.predict(5) == compiled.compiled_costs[4]
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed, ids in prompts.items():
            for method, num_draft in (("none", None), ("chain", 3), ("trie", 4)):
                before = step.calls
                result = compiled_gen.generate(ids, documents=docs[seed],
                                               max_new_tokens=SMALL_NEW, method=method,
                                               num_draft=num_draft)
                assert result.token_ids == plain[seed], (method, seed)
                assert step.calls - before == len(result.stats.accept_lengths) > 0  # every step
            assert max(result.stats.accept_lengths) > 1  # trees were verified


def test_each_compiled_engine_compiles_its_own_copy_of_the_step() -> None:
    """Dynamo keeps a code object's graphs in one list with a length limit: engines that
    shared it crowded each other out after a few models and cache sizes (an error with
    fullgraph=True). Each engine's step is a copy of the code, running the same."""
    engine = StaticEngine(_tiny("llama"), compiled=False, buckets=SMALL_BUCKETS, curve=FLAT)
    first, second = own_code(engine._forward), own_code(engine._forward)
    codes = {id(engine._forward.__code__), id(first.__code__), id(second.__code__)}
    assert len(codes) == 3 and first.__self__ is engine
    kv, logits = engine.prefill(random_prompt(20, seed=4))
    inputs = engine.prepare(kv, int(logits.argmax()), DraftTree.empty())
    with torch.inference_mode():
        expected = engine._forward(inputs.ids, inputs.positions, inputs.mask, kv.cache)
        for layer in kv.cache.layers:  # the step wrote its row; write it again
            layer.cumulative_length.fill_(kv.length)
        got = first(inputs.ids, inputs.positions, inputs.mask, kv.cache)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_background_compiler_runs_each_key_once_and_reports_failures(capsys) -> None:
    from ngram_trie_rag.engine.compiling.background_compile import BackgroundCompiler

    seen = []

    def compile_key(key):
        seen.append(key)
        if key == "bad":
            raise RuntimeError("no kernel\nsecond line")

    compiler = BackgroundCompiler(compile_key, "test shapes")
    assert not compiler.ready(256) and compiler.idle()
    assert compiler.wait(256, timeout=30) and compiler.ready(256) and compiler.idle()
    assert not compiler.wait("bad", timeout=30) and compiler.idle()
    # the first line of the error and where it was raised
    where = f"at test_static_engine.py:{compile_key.__code__.co_firstlineno + 3}"
    assert compiler.failed("bad") == f"RuntimeError: no kernel {where}"
    assert compiler.failed(256) is None
    compiler.request(256)
    compiler.request("bad")
    assert compiler.wait(512, timeout=30)
    assert seen == [256, "bad", 512]  # neither asked again
    err = capsys.readouterr().err
    assert f"compiling the test shapes for bad failed (RuntimeError: no kernel {where})" in err
    assert "they run eagerly" in err


def test_the_compile_thread_ends_when_idle_and_a_new_request_starts_another() -> None:
    """An idle compile thread would keep its OpenMP thread team: with more OpenMP
    threads than cores, libgomp stops spinning between parallel regions, and every
    later step (compiled or not) pays a wake-up per region. So the thread ends once
    nothing is queued."""
    from ngram_trie_rag.engine.compiling.background_compile import BackgroundCompiler

    threads = []
    compiler = BackgroundCompiler(lambda key: threads.append(threading.current_thread()))
    assert compiler.wait(1, timeout=30)
    threads[0].join(timeout=30)
    assert not threads[0].is_alive() and compiler._thread is None
    assert compiler.wait(2, timeout=30) and compiler.ready(1)
    assert threads[1] is not threads[0]


@pytest.mark.skipif(NO_COMPILER, reason="torch.compile on a CPU needs a C++ compiler")
def test_under_cuda_graphs_a_request_runs_eagerly_while_any_size_compiles() -> None:
    """A request records its CUDA graphs on its first compiled steps, and a capture must
    not overlap a warm-up on the compile thread: under CUDA graphs a request whose shapes
    are ready still runs eagerly while another cache size compiles. The rule alone (no
    CUDA here; ``make test-gpu`` runs the graphs)."""
    from ngram_trie_rag.engine.compiling.background_compile import BackgroundCompiler

    engine = StaticEngine(_tiny("llama"), compiled=True, buckets=(4,), curve=FLAT)
    gate = threading.Event()
    engine._compiler = BackgroundCompiler(lambda capacity: capacity != 512 or gate.wait(30))
    ids = random_prompt(40, seed=1)
    capacity = engine.capacity_for(len(ids), SMALL_NEW)
    assert capacity != 512 and engine.compile_for(capacity, timeout=30)
    engine._compiler.request(512)  # another size, compiling until the gate opens
    assert engine.prefill(ids, SMALL_NEW)[0].compiled  # no CUDA graphs: compiled at once
    engine._cudagraphs = True
    assert not engine.prefill(ids, SMALL_NEW)[0].compiled
    gate.set()
    assert engine.compile_for(512, timeout=30) and engine._compiler.idle()
    assert engine.prefill(ids, SMALL_NEW)[0].compiled


# ---- choosing an engine by name -------------------------------------------------------

def test_engines_by_name_and_bad_names_refused() -> None:
    from ngram_trie_rag.bench.config import BenchConfig
    from ngram_trie_rag.engine.choice import make_engine

    model = _tiny("llama")
    assert type(make_engine(model, "eager")) is EagerEngine
    assert make_engine(model, "auto").eager is make_engine(model, "eager")
    static = make_engine(model, "static")
    assert isinstance(static, StaticEngine) and not static.compiled
    uniform = make_engine(model, "uniform")
    assert uniform.uniform == uniform.buckets[0] == 32 and uniform is not static
    if not NO_COMPILER:
        compiled = make_engine(model, "compiled")
        assert compiled.compiled and compiled._compiler is not None  # in the background
        one_shape = make_engine(model, "uniform-compiled")
        assert one_shape.compiled and one_shape._compiler is None  # inside the request
        assert one_shape.step_sizes() == (32,)
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine(model, "fast")
    with pytest.raises(ValueError, match="engine must be one of"):
        SpeculativeGenerator.from_pretrained(engine="graphs")
    with pytest.raises(ValueError, match="engine must be one of"):
        BenchConfig(data="x.jsonl", engine="graphs")


def test_compiled_without_a_cpp_compiler_runs_eagerly_and_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setattr(static_engine, "cpp_compiler", lambda: None)
    engine = StaticEngine(_tiny("llama"), compiled=True)
    assert not engine.compiled and engine._compiled_fn is None
    assert "no C++ compiler" in capsys.readouterr().err

"""On CUDA (``make test-gpu``): greedy speculative output token-identical to
``model.generate(do_sample=False)`` in fp32 with TF32 off, the on-device acceptance walk
equal to the host walk, and bf16 agreement with ``generate`` reported.

Skipped with a reason on a host without CUDA, and in the CPU suite (``../../conftest.py``
hides CUDA there). ``NGRAM_TRIE_RAG_TEST_MODEL``: the model to load instead of the packaged
one (a folder or a GGUF), for a host without the packaged model's wheel.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from data_files import read_jsonl

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine import device_accept
from ngram_trie_rag.reference import greedy_reference
from ngram_trie_rag.sampling import SamplingParams, accept

pytestmark = pytest.mark.gpu

MAX_NEW = 64
PROMPTS = 8
# The packaged model by default; a GPU host without its wheel passes a folder or a GGUF.
MODEL = os.environ.get("NGRAM_TRIE_RAG_TEST_MODEL") or None


def _messages() -> list[list[dict]]:
    rows = read_jsonl("spec_bench/rag.jsonl", PROMPTS)
    return [[{"role": "user", "content": row["turns"][0]}] for row in rows]


@pytest.fixture(scope="module")
def fp32_cuda() -> SpeculativeGenerator:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: exactness is checked
    torch.backends.cudnn.allow_tf32 = False
    return SpeculativeGenerator.from_pretrained(MODEL, device="cuda", dtype="float32")


@pytest.mark.parametrize("method", ["trie", "chain"])
def test_greedy_equals_generate_on_cuda_in_fp32(fp32_cuda: SpeculativeGenerator,
                                                 method: str) -> None:
    assert fp32_cuda.model.device.type == "cuda"
    for messages in _messages():
        ids = fp32_cuda.encode_prompt(messages)
        expected = greedy_reference(fp32_cuda.model, ids, MAX_NEW)
        result = fp32_cuda.generate(messages, max_new_tokens=MAX_NEW, method=method)
        assert result.token_ids == expected


def test_bf16_agreement_with_generate_is_reported(capsys) -> None:
    """bf16 logits depend on the shape of the forward, so a tree step may pick another
    token than a one-token step where two are within rounding: reported, with the
    first divergence, not required."""
    gen = SpeculativeGenerator.from_pretrained(MODEL, device="cuda", dtype="bfloat16")
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
        print(f"\nbf16 trie vs generate: {same}/{PROMPTS} identical, first divergence at "
              f"tokens {firsts}")


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
        logits = torch.randn(1 + n, 8, device="cuda")
        assert device_accept.accept(tree, logits, greedy, None) == accept(
            tree, logits, greedy, None)


def test_compiled_static_engine_on_cuda_in_fp32(capsys) -> None:
    """The compiled static engine (CUDA graphs, trees padded to 16 nodes): ``trie`` and
    ``chain`` equal to plain decoding through the same engine; agreement with
    ``generate`` reported (the compiled kernels may round differently)."""
    from ngram_trie_rag.engine.static_engine import StaticEngine
    from ngram_trie_rag.loading import load_model

    torch.backends.cuda.matmul.allow_tf32 = False
    model, tokenizer = load_model(MODEL, device="cuda", dtype="float32")
    engine = StaticEngine(model, compiled=True, buckets=(16,), max_new_tokens=MAX_NEW)
    gen = SpeculativeGenerator(model, tokenizer, engine=engine, num_draft=16)
    same_as_generate = 0
    for messages in _messages()[:3]:
        plain = gen.generate(messages, max_new_tokens=MAX_NEW, method="none").token_ids
        for method in ("trie", "chain"):
            assert gen.generate(messages, max_new_tokens=MAX_NEW,
                                method=method).token_ids == plain
        expected = greedy_reference(model, gen.encode_prompt(messages), MAX_NEW)
        same_as_generate += plain == expected
    with capsys.disabled():
        print(f"\ncompiled static engine vs generate (fp32): {same_as_generate}/3 identical")


def test_host_syncs_per_greedy_step_are_counted(capsys) -> None:
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
    counts = []
    for _ in range(3):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                inputs = engine.prepare(kv, last, tree)
                step_logits = engine.run(kv, inputs)
                tokens, path = device_accept.accept(tree, step_logits, SamplingParams(), None)
                engine.commit(kv, inputs, path)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
        last = tokens[-1]
    with capsys.disabled():
        print(f"\nhost syncs per greedy tree step (static engine, eager): {counts}")
    assert min(counts) >= 1  # the path is read on the host

"""The fused quantized decoder layer (two C++ calls around attention): each row alone,
bitwise; close to the layer's own modules; the engines' Llama step bitwise the model's
forward through it; installed exactly where it applies. The packaged model's answers
through it, against its own ``generate``, are in ``test_quantization.py``."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from model_families import (
    FAMILIES,
    accepted,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
)

from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine.cpu.forward import forward
from ngram_trie_rag.engine.cpu.llama_step import LlamaStep
from ngram_trie_rag.engine.kv_cache import cache_kwargs, new_cache
from ngram_trie_rag.engine.quant import fused_layer, quantize_model, w8a32
from ngram_trie_rag.engine.quant.apply import SUMMARY
from ngram_trie_rag.engine.trees.tree_attention import tree_inputs
from ngram_trie_rag.reference import greedy_reference

pytestmark = pytest.mark.skipif(not w8a32.supported_cpu() or fused_layer.kernel() is None,
                                reason="the fused layer needs an AVX-512 CPU and a compiler")

FUSED_FAMILIES = ["llama-rope-llama3", "mistral-window", "qwen2", "qwen2-window"]
TREE = DraftTree(np.array([5, 6, 7, 8, 9, 10, 11]), np.array([-1, 0, 1, -1, 3, 0, 5]),
                 np.array([1, 2, 3, 1, 2, 2, 3]), np.ones(7, dtype=np.int64), 1)


def _quantized(name: str, scheme: str) -> torch.nn.Module:
    model = quantize_model(build(FAMILIES[name]), scheme)
    assert getattr(model, SUMMARY)["fused_layers"] == model.config.num_hidden_layers
    return model


def _unfused(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose layers run their own modules."""
    plain = copy.deepcopy(model)
    for layer in plain.modules():
        if fused_layer.of(layer) is not None:
            del layer.forward
    return plain


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("name", FUSED_FAMILIES)
def test_rows_alone_are_bitwise_the_rows_together(name: str, scheme: str) -> None:
    model = _quantized(name, scheme)
    ids = torch.tensor([random_prompt(40, seed=1)])
    with torch.inference_mode():
        together = model(ids).logits[0, 30:]
        cache = new_cache()
        model(input_ids=ids[:, :30], **cache_kwargs(model, cache), use_cache=True)
        alone = [model(input_ids=ids[:, i:i + 1], **cache_kwargs(model, cache),
                       use_cache=True).logits[0, -1] for i in range(30, 40)]
        modules = _unfused(model)(ids).logits[0, 30:]
    assert torch.equal(torch.stack(alone), together)
    # another summation order than the modules' (RMSNorm, SiLU), not another function
    assert torch.allclose(together, modules, rtol=0, atol=1e-4 * modules.abs().max())
    assert not torch.equal(together, modules)


@pytest.mark.parametrize("tree", [None, TREE], ids=["single", "tree"])
def test_llama_step_is_bitwise_the_model_forward(tree: DraftTree | None) -> None:
    model = _quantized("llama-rope-llama3", "int4")
    step = LlamaStep(model)
    assert step.layers[0].fused is not None
    prefix = torch.tensor([random_prompt(50, seed=2)])
    results = []
    for use in (None, step):
        with torch.inference_mode():
            cache = new_cache()
            model(input_ids=prefix, **cache_kwargs(model, cache), use_cache=True)
            if tree is None:
                ids, pos, mask = torch.tensor([[4]]), torch.tensor([[50]]), None
            else:
                ids = torch.tensor([[4, *(tree.tokens % 96).tolist()]])
                pos, mask = tree_inputs(tree, 50, model.device, model.dtype)
            logits = forward(model, use, ids, pos, mask, cache, "stock", False)
        results.append((logits, [t for layer in cache.layers for t in (layer.keys, layer.values)]))
    (want, want_cache), (got, got_cache) = results
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache, strict=True))


def test_a_long_forward_runs_the_modules() -> None:
    model = _quantized("qwen2", "int8")
    ids = torch.tensor([random_prompt(fused_layer.MAX_ROWS + 1, seed=3)])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, _unfused(model)(ids).logits)


@pytest.mark.parametrize("name", ["qwen2-window", "mistral"])
def test_tree_decoding_equals_generate_through_the_fused_layers(name: str) -> None:
    model = _quantized(name, "int4")
    ids = random_prompt(60, seed=4)
    expected = greedy_reference(model, ids, 24)
    gen = pinned_generator(model)
    result = gen.generate(ids, documents=drafting_documents(expected), max_new_tokens=24,
                          method="trie", num_draft=8)
    assert result.token_ids == expected
    assert accepted(result) > 0  # trees were verified, not only single steps


@pytest.mark.parametrize(("name", "scheme"), [("qwen3", "int8"), ("phi3", "int4"),
                                              ("gemma2", "int8"), ("llama-rope-llama3", "w8a8")])
def test_other_layers_and_schemes_keep_their_modules(name: str, scheme: str) -> None:
    model = quantize_model(build(FAMILIES[name]), scheme)
    assert getattr(model, SUMMARY)["fused_layers"] == 0
    assert not any(fused_layer.of(m) for m in model.modules())


def test_a_bf16_model_keeps_its_modules() -> None:
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]).to(torch.bfloat16), "int8")
    assert getattr(model, SUMMARY)["fused_layers"] == 0


def test_without_a_compiler_the_layers_run_their_modules(no_compiler, caplog) -> None:
    no_compiler(fused_layer)
    with caplog.at_level("WARNING", logger=fused_layer.__name__):
        model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int8")
    assert "no C++ compiler 'no-such-c++' on PATH" in caplog.text
    assert getattr(model, SUMMARY)["fused_layers"] == 0
    ids = random_prompt(40, seed=5)
    expected = greedy_reference(model, ids, 16)
    result = pinned_generator(model).generate(
        ids, documents=drafting_documents(expected), max_new_tokens=16, method="trie",
        num_draft=8)
    assert result.token_ids == expected


def test_a_batch_is_each_sequence_alone() -> None:
    """Two sequences in one forward (their positions shared, as (1, Q, D) cos and sin):
    each gets its own logits, bitwise."""
    model = _quantized("qwen2", "int4")
    ids = torch.tensor([random_prompt(24, seed=6), random_prompt(24, seed=7)])
    with torch.inference_mode():
        both = model(ids).logits
        alone = [model(ids[i:i + 1]).logits[0] for i in range(2)]
    assert torch.equal(both[0], alone[0]) and torch.equal(both[1], alone[1])

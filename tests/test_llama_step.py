"""The Llama step computes bitwise the module forward's logits and cache, in every
variant the modules run too: stock or transposed linear layout, packed or stock
single-query attention, tree masks. Its own prepacked layout rounds differently and is
checked for closeness here and for greedy exactness in ``test_exactness.py``."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine import EagerEngine
from ngram_trie_rag.engine.cpu import gqa_attention, linear_layout, llama_step
from ngram_trie_rag.engine.cpu.forward import forward
from ngram_trie_rag.engine.cpu.llama_step import LlamaStep
from ngram_trie_rag.engine.kv_cache import cache_kwargs, new_cache
from ngram_trie_rag.engine.trees.tree_attention import tree_inputs

# Two branches below the last committed token, depths 1-3.
TREE = DraftTree(np.array([5, 6, 7, 8, 9, 10, 11]), np.array([-1, 0, 1, -1, 3, 0, 5]),
                 np.array([1, 2, 3, 1, 2, 2, 3]), np.ones(7, dtype=np.int64), 1)
PAST = 300


def _with_modules(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` set up to run every variant through its modules too (what a modules
    engine installs), after checking the step applies to it."""
    assert llama_step.applies(model)
    if gqa_attention.applies(model):
        gqa_attention.install(model)
    linear_layout.install(model)
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    """The packaged model in both dtypes, loaded for this module alone: the variants'
    installation changes the model, which no other module's model should see."""
    from ngram_trie_rag.loading import load_model

    return {dtype: _with_modules(load_model(None, dtype=getattr(torch, dtype))[0])
            for dtype in ("float32", "bfloat16")}


_PREFILLED: dict[int, object] = {}


def _prefilled(model) -> object:
    """The cache after ``PAST`` random tokens, computed once per model (every run starts
    from a copy of it)."""
    if id(model) not in _PREFILLED:
        gen = torch.Generator().manual_seed(0)
        prefix = torch.randint(0, model.config.vocab_size, (1, PAST), generator=gen)
        with torch.inference_mode():
            cache = new_cache()
            model(input_ids=prefix, **cache_kwargs(model, cache), use_cache=True,
                  logits_to_keep=1)
        _PREFILLED[id(model)] = cache
    return _PREFILLED[id(model)]


def _run(model, step: LlamaStep | None, tree: DraftTree | None, layout: str,
         packed: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits of one forward after ``PAST`` random cached tokens, and the keys and
    values every layer holds afterwards."""
    vocab = model.config.vocab_size
    with torch.inference_mode():
        cache = copy.deepcopy(_prefilled(model))
        if tree is None:
            ids, pos, mask = torch.tensor([[4]]), torch.tensor([[PAST]]), None
        else:
            ids = torch.tensor([[4, *(tree.tokens % vocab).tolist()]])
            pos, mask = tree_inputs(tree, PAST, model.device, model.dtype)
        logits = forward(model, step, ids, pos, mask, cache, layout, packed)
    return logits, [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _assert_same(model, tree: DraftTree | None, layout: str, packed: bool) -> None:
    step = LlamaStep(model)
    want, want_cache = _run(model, None, tree, layout, packed)
    got, got_cache = _run(model, step, tree, layout, packed)
    assert got.shape == want.shape == (1 + (len(tree) if tree else 0), model.config.vocab_size)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache, strict=True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["stock", "transposed"])
@pytest.mark.parametrize("variant", ["single", "single-packed", "tree"])
def test_step_is_bitwise_the_module_forward(models, dtype, layout, variant) -> None:
    model = models[dtype]
    _assert_same(model, TREE if variant == "tree" else None, layout,
                 packed=variant != "single")


@pytest.mark.parametrize("variant", ["single", "tree"])
def test_prepacked_layout_is_close_and_follows_weight_changes(models, variant) -> None:
    model = models["float32"]
    tree = TREE if variant == "tree" else None
    step = LlamaStep(model)
    want, _ = _run(model, None, tree, "stock", packed=True)
    got, _ = _run(model, step, tree, "prepacked", packed=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    weight = model.model.layers[0].mlp.down_proj.weight
    kept = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(0.5)  # an in-place change: the packed copies must follow
        want, _ = _run(model, None, tree, "stock", packed=True)
        got, _ = _run(model, step, tree, "prepacked", packed=True)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    finally:
        with torch.no_grad():
            weight.copy_(kept)


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_step_on_other_head_layouts(kv_heads: int) -> None:
    torch.manual_seed(0)
    model, _ = tiny_llama(seed=4, vocab_size=32)
    if kv_heads != model.config.num_key_value_heads:  # plain multi-head attention
        from transformers import LlamaForCausalLM

        model.config.num_key_value_heads = kv_heads
        model = LlamaForCausalLM(model.config).eval()
    _with_modules(model)
    for tree in (None, TREE):  # masked GQA is packed where there is GQA
        _assert_same(model, tree, "stock",
                     packed=tree is not None and gqa_attention.applies(model))


def test_unmasked_forward_of_several_tokens_is_refused(generator) -> None:
    step = LlamaStep(generator.model)
    with pytest.raises(ValueError, match="single query"):
        step(torch.tensor([[4, 5]]), torch.tensor([[0, 1]]), None, new_cache())


def test_applies_only_where_the_structure_holds(generator) -> None:
    model = generator.model
    cfg = model.config
    attention = cfg._attn_implementation
    try:
        cfg._attn_implementation = "eager"
        assert not llama_step.applies(model)
    finally:
        cfg._attn_implementation = attention
    handle = model.model.layers[3].mlp.register_forward_hook(lambda *args: None)
    try:
        assert not llama_step.applies(model)  # a hook the step would bypass
    finally:
        handle.remove()
    model.train()
    try:
        assert not llama_step.applies(model)
    finally:
        model.eval()
    assert llama_step.applies(model)
    step = generator.engine.step
    assert step is not None  # the packaged model is a Llama: its steps run directly
    assert SpeculativeGenerator(model, generator.tokenizer).engine.step is step
    assert EagerEngine(model).step is step  # one step (and its weight copies) per model
    with pytest.raises(ValueError, match="Llama step only"):
        forward(model, None, torch.tensor([[4]]), torch.tensor([[0]]), None, new_cache(),
                "prepacked", False)


def test_a_modules_engine_leaves_the_step_to_later_engines() -> None:
    """Building an engine that runs the modules installs the gated attention on the
    model; later engines over the same model must still run the Llama step (the step
    does its own attention, whatever the configured one)."""
    model, _ = tiny_llama(seed=4, vocab_size=32)
    assert EagerEngine(model, direct_step=False).step is None
    assert llama_step.applies(model)
    assert EagerEngine(model).step is not None


def test_other_architectures_run_the_modules() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    assert not llama_step.applies(Qwen2ForCausalLM(cfg).eval())  # q/k/v biases

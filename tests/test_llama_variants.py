"""Models that look like Llama but differ: each runs the direct Llama step only where it
is bitwise the module forward, and greedy output is ``generate``'s either way.

Also the RoPE variants whose frequencies follow the sequence length (``dynamic``,
``longrope``): a step may not straddle the length where they change, and Phi-3
recomputes its cache there as its ``generate`` does.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from model_families import (
    SIZE,
    accepted,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
)

from ngram_trie_rag.engine.cpu import llama_step
from ngram_trie_rag.engine.models.rope_limits import UNLIMITED, RopeLimit, rope_limit
from ngram_trie_rag.reference import greedy_reference

HALF_HEAD = 8  # rotary frequencies per head (head_dim 16)
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
             "short_factor": [1.0] * HALF_HEAD, "long_factor": [4.0] * HALF_HEAD}


def _llama(**changes) -> tf.LlamaConfig:
    return tf.LlamaConfig(**{**SIZE, **changes})


# name -> (config, model class, whether the direct step applies)
VARIANTS = {
    "attention-bias": (lambda: _llama(attention_bias=True), tf.LlamaForCausalLM, False),
    "mlp-bias": (lambda: _llama(mlp_bias=True), tf.LlamaForCausalLM, False),
    "rope-linear": (lambda: _llama(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                    "rope_theta": 10000.0}),
                    tf.LlamaForCausalLM, True),
    "rope-yarn": (lambda: _llama(rope_parameters={"rope_type": "yarn", "factor": 16.0,
                                                  "rope_theta": 10000.0,
                                                  "original_max_position_embeddings": 256}),
                  tf.LlamaForCausalLM, True),
    # max_position_embeddings 256: the answer runs up to the context window
    "rope-dynamic": (lambda: _llama(max_position_embeddings=256,
                                    rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                     "rope_theta": 10000.0}),
                     tf.LlamaForCausalLM, True),
    # short factors up to 256 tokens, long ones after: the answer crosses over
    "rope-longrope": (lambda: _llama(rope_parameters={**_LONGROPE,
                                                      "original_max_position_embeddings": 256}),
                      tf.LlamaForCausalLM, True),
    "tied-embeddings": (lambda: _llama(tie_word_embeddings=True), tf.LlamaForCausalLM, True),
    # Phi-3 drops and recomputes its cache where the answer crosses 256 tokens
    "phi3-longrope": (lambda: tf.Phi3Config(**SIZE, original_max_position_embeddings=256,
                                            rope_parameters=dict(_LONGROPE)),
                      tf.Phi3ForCausalLM, False),
}


def _check_exact(model: torch.nn.Module, gen, prompt_len: int = 220) -> None:
    ids = random_prompt(prompt_len, seed=2)
    new = min(64, gen.context_window - len(ids))
    expected = greedy_reference(model, ids, new)
    result = gen.generate(ids, documents=drafting_documents(expected), max_new_tokens=64,
                          num_draft=8)
    assert result.token_ids == expected
    assert accepted(result) > 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_llama_like_variants_are_exact(name: str) -> None:
    make_config, model_class, direct = VARIANTS[name]
    model = build(make_config(), model_class)
    assert llama_step.applies(model) == direct
    gen = pinned_generator(model)
    assert (gen.engine.step is not None) == direct
    _check_exact(model, gen)


def test_a_hook_registered_after_the_engine_runs_through_the_modules() -> None:
    """The engine chose the step; a hook that changes a layer's output arrives later.
    ``generate`` runs the hook, so the generator's forwards must too."""
    model = build(_llama(), tf.LlamaForCausalLM)
    gen = pinned_generator(model)
    assert gen.engine.step is not None

    def scale(module, args, output):
        return (output[0] * 1.5, *output[1:]) if isinstance(output, tuple) else output * 1.5

    handle = model.model.layers[0].register_forward_hook(scale)
    try:
        assert not llama_step.applies(model)
        _check_exact(model, gen)
    finally:
        handle.remove()
    assert llama_step.applies(model)


def test_rope_limits_by_variant() -> None:
    assert rope_limit(build(_llama(), tf.LlamaForCausalLM)) is None
    dynamic = rope_limit(build(VARIANTS["rope-dynamic"][0](), tf.LlamaForCausalLM))
    assert dynamic == RopeLimit(256, trees_after=False)
    phi3 = rope_limit(build(VARIANTS["phi3-longrope"][0](), tf.Phi3ForCausalLM))
    assert phi3 == RopeLimit(256, trees_after=True, recompute=True)
    # a step at `past` runs positions past .. past + depth: sequence length past + depth + 1
    assert [phi3.depth(p) for p in (200, 255, 256, 257)] == [55, 0, 0, UNLIMITED]
    assert [phi3.recomputes(p) for p in (255, 256, 257)] == [False, True, False]
    assert [dynamic.depth(p) for p in (250, 255, 256, 300)] == [5, 0, 0, 0]

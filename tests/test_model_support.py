"""Models whose cache cannot take a draft tree are refused when the generator is built,
with a ValueError that names the family: never an IndexError, never a wrong answer."""

from __future__ import annotations

import pytest
import transformers as tf
from model_families import VOCAB, build, word_tokenizer

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine.models.attention_windows import attention_windows, window_sizes
from ngram_trie_rag.engine.models.support import check_supported

_SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2}

REFUSED = {
    "mamba": (lambda: tf.MambaConfig(**_SMALL, state_size=4), tf.MambaForCausalLM,
              "MambaForCausalLM"),
    "jamba": (lambda: tf.JambaConfig(**_SMALL, intermediate_size=64, num_attention_heads=4,
                                     num_key_value_heads=2, num_experts=2, attn_layer_period=2,
                                     attn_layer_offset=1, expert_layer_period=2,
                                     mamba_d_state=4),
              tf.JambaForCausalLM, "JambaForCausalLM"),
    "lfm2-conv": (lambda: tf.Lfm2Config(**_SMALL, intermediate_size=64, num_attention_heads=4,
                                        num_key_value_heads=2,
                                        layer_types=["conv", "full_attention"]),
                  tf.Lfm2ForCausalLM, "'conv'"),
    "t5": (lambda: tf.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1,
                               num_heads=2, d_kv=16),
           tf.T5ForConditionalGeneration, "encoder-decoder"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_models_without_a_rollback_cache_are_refused_by_name(name: str) -> None:
    make_config, model_class, named = REFUSED[name]
    model = build(make_config(), model_class)
    with pytest.raises(ValueError, match=named) as raised:
        SpeculativeGenerator(model, word_tokenizer())
    assert "model.generate()" in str(raised.value)


def test_mamba_message_says_why() -> None:
    model = build(tf.MambaConfig(**_SMALL, state_size=4), tf.MambaForCausalLM)
    with pytest.raises(ValueError, match="mamba.*recurrent"):
        check_supported(model)


def test_attention_families_pass_and_report_their_windows() -> None:
    assert attention_windows(tf.MistralConfig(sliding_window=64)).sliding_window == 64
    assert attention_windows(tf.MistralConfig(sliding_window=None)).uniform
    qwen = tf.Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=32,
                          max_window_layers=2)
    windows = attention_windows(qwen)
    assert not windows.uniform and windows.sliding_window == 32
    chunked = dict(attention_windows(tf.Llama4TextConfig(attention_chunk_size=16)).by_type)
    assert chunked["chunked_attention"].kind == "chunked"


def test_window_sizes_read_both_transformers_layouts() -> None:
    """Transformers before 5.2x returns one kwargs dict for all layers (what a GPU image
    with 5.17 runs), later ones a dict per layer: both give the same windows."""
    types = ["sliding_attention", "full_attention", "chunked_attention"]
    per_layer = [{"sliding_window": 32}, {}, {"sliding_window": 32}]
    assert window_sizes(types, per_layer) == [32, None, 32]
    assert window_sizes(types, {"sliding_window": 32}) == [32, None, 32]
    assert window_sizes(["full_attention"] * 2, {}) == [None, None]


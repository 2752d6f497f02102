"""Tiny random causal LMs of many families, built from configs (nothing downloaded).

Every family the engine claims to verify exactly is here at toy size (hidden 64, two
layers, four query heads over two key/value heads where the family has GQA), with a
64-token sliding window where the family has one, so that prompts of a few hundred
tokens run several windows past it. Prompts are integer ids over a small vocabulary
(:func:`word_tokenizer` names id ``i`` ``t{i}`` for the text paths). No model has an
end-of-sequence token, so every answer runs its full length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 96
WINDOW = 64
INIT = 0.1  # a wider init than the 0.02 default: fewer near-ties between logits

SIZE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 4096, "initializer_range": INIT,
         "bos_token_id": 0, "eos_token_id": None, "pad_token_id": 0}
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}


@dataclass(frozen=True)
class Family:
    """A family at toy size: ``build()`` returns its config; ``model_class`` decodes."""

    name: str
    model_class: type
    build: Callable[[], tf.PretrainedConfig]
    window: int | None = None  # the sliding window some layers apply, if any


def _gpt2() -> tf.GPT2Config:
    return tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                         initializer_range=INIT, bos_token_id=0, eos_token_id=None)


def _gpt_neox() -> tf.GPTNeoXConfig:
    return tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=4096, initializer_range=INIT,
                            bos_token_id=0, eos_token_id=None)


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama-rope-llama3", tf.LlamaForCausalLM,
           lambda: tf.LlamaConfig(**SIZE, rope_parameters=dict(_LLAMA3_ROPE))),
    Family("mistral", tf.MistralForCausalLM,
           lambda: tf.MistralConfig(**SIZE, sliding_window=None)),
    Family("mistral-window", tf.MistralForCausalLM,
           lambda: tf.MistralConfig(**SIZE, sliding_window=WINDOW), WINDOW),
    Family("mixtral", tf.MixtralForCausalLM,
           lambda: tf.MixtralConfig(**SIZE, num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=None)),
    Family("qwen2", tf.Qwen2ForCausalLM, lambda: tf.Qwen2Config(**SIZE)),
    # layer 0 full, layer 1 sliding: a mask per layer type
    Family("qwen2-window", tf.Qwen2ForCausalLM,
           lambda: tf.Qwen2Config(**SIZE, use_sliding_window=True, sliding_window=WINDOW,
                                  max_window_layers=1), WINDOW),
    Family("qwen2-moe", tf.Qwen2MoeForCausalLM,
           lambda: tf.Qwen2MoeConfig(**SIZE, moe_intermediate_size=64,
                                     shared_expert_intermediate_size=64, num_experts=4,
                                     num_experts_per_tok=2)),
    Family("qwen3", tf.Qwen3ForCausalLM, lambda: tf.Qwen3Config(**SIZE, head_dim=16)),
    Family("phi3", tf.Phi3ForCausalLM, lambda: tf.Phi3Config(**SIZE, sliding_window=None)),
    Family("phi3-window", tf.Phi3ForCausalLM,
           lambda: tf.Phi3Config(**SIZE, sliding_window=WINDOW), WINDOW),
    Family("gemma2", tf.Gemma2ForCausalLM,
           lambda: tf.Gemma2Config(**SIZE, head_dim=16, sliding_window=WINDOW), WINDOW),
    Family("gemma3", tf.Gemma3ForCausalLM,
           lambda: tf.Gemma3TextConfig(**SIZE, head_dim=16, sliding_window=WINDOW,
                                       layer_types=["sliding_attention", "full_attention"]),
           WINDOW),
    Family("gpt-neox", tf.GPTNeoXForCausalLM, _gpt_neox),
    Family("gpt2", tf.GPT2LMHeadModel, _gpt2),
]}


def build(family: Family | tf.PretrainedConfig, model_class: type | None = None,
          seed: int = 0) -> torch.nn.Module:
    """A random-initialised fp32 model in eval mode, without an end-of-sequence token."""
    config = family.build() if isinstance(family, Family) else family
    model_class = family.model_class if isinstance(family, Family) else model_class
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def word_tokenizer(vocab_size: int = VOCAB) -> tf.PreTrainedTokenizerFast:
    """Id ``i`` is the word ``t{i}``; no end-of-sequence token."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0")


def random_prompt(length: int, seed: int = 0, vocab_size: int = VOCAB) -> list[int]:
    """``length`` ids drawn from ``[2, vocab_size)`` (no BOS, no padding)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab_size, (length,), generator=gen).tolist()


def drafting_documents(answer: list[int], seed: int = 0, copies: int = 3) -> list[list[int]]:
    """Documents that make drafts both right and wrong: ``answer`` itself, and copies
    with every fifth token (at a different offset per copy) replaced. The trie then
    offers sibling branches, so verification walks real trees and compaction keeps
    accepted rows that are not the first ones of the block."""
    gen = torch.Generator().manual_seed(seed)
    docs = [list(answer)]
    for c in range(copies):
        doc = list(answer)
        for i in range(c + 1, len(doc), 5):
            doc[i] = int(torch.randint(2, VOCAB, (1,), generator=gen))
        docs.append(doc)
    return docs


def pinned_generator(model: torch.nn.Module, tokenizer=None):
    """A generator over ``model`` with a flat latency curve pinned (nothing measured:
    seconds per model, and every draft is worth verifying). Call with ``num_draft``."""
    from ngram_trie_rag import SpeculativeGenerator
    from ngram_trie_rag.engine import EagerEngine, LatencyCurve

    curve = LatencyCurve({q: 0.01 for q in (1, 2, 3, 5, 9, 17, 33)}, {}, pack_single=False)
    return SpeculativeGenerator(model, tokenizer or word_tokenizer(),
                                engine=EagerEngine(model, curve=curve))


def accepted(result) -> int:
    """Draft tokens accepted over a generation (each step's accept length less its
    bonus token)."""
    return sum(a - 1 for a in result.stats.accept_lengths)

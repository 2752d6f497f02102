"""Tiny random causal LMs built from a config (no weights on disk) for fast property tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", unk_token="t0")
    return fast


def tiny_llama(seed: int = 0, vocab_size: int = 16, init_scale: float = 0.5,
               layers: int = 2, eos: int = 1) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A 2-layer Llama; a large ``init_scale`` makes next-token distributions peaky."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=init_scale,
                         eos_token_id=eos, bos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model, tiny_tokenizer(vocab_size)

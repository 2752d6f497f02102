"""Tiny randomly initialised models built offline, for tests and smoke checks.

No reranker or second embedder ships with weights here, yet the CrossEncoder path and the
"index built with another embedder" check must run for real. These builders write a
2-layer BERT (reusing the packaged MiniLM tokenizer) to a folder that sentence-transformers
loads like any downloaded model. Random weights give meaningless scores: use them to test
plumbing, never quality.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ngram_trie_rag.retrieval.embedder import packaged_minilm_path


def _tiny_bert_config(vocab_size: int, hidden: int, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        **extra,
    )


def build_tiny_sentence_transformer(path: str | os.PathLike, dim: int = 32, seed: int = 0) -> Path:
    """Save a tiny mean-pooling sentence-transformer with embedding size ``dim`` to ``path``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel

    path = Path(path)
    raw = path / "_hf"
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_path()))
    torch.manual_seed(seed)
    BertModel(_tiny_bert_config(tokenizer.vocab_size, dim)).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    model = SentenceTransformer(str(raw), device="cpu")  # adds mean pooling
    model.save(str(path))
    return path


def build_tiny_cross_encoder(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny single-logit BERT cross-encoder to ``path``."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_path()))
    torch.manual_seed(seed)
    config = _tiny_bert_config(tokenizer.vocab_size, 32, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@contextmanager
def limited_threads(n: int = 1) -> Iterator[None]:
    """Run torch and FAISS with ``n`` threads, restoring the previous counts afterwards.

    On a shared, oversubscribed CPU, OpenMP thread pools spin against each other: a
    135M-model forward measured 4.5-14 s with 2 threads vs 0.9 s with 1 here. Tests use
    this so they stay fast when other test runs share the machine.
    """
    import faiss
    import torch

    torch_before, faiss_before = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        faiss.omp_set_num_threads(faiss_before)

"""The transformers-only embedding path gives sentence-transformers' vectors, without importing it.

``Embedder`` runs plain folders (the packaged MiniLM among them) through ``st_pipeline`` so a
fresh process that embeds one query skips importing sentence-transformers. These tests hold
it to the library's own output, check the import really is skipped, and that any folder
outside the plain shape is left to sentence-transformers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ngram_trie_rag.retrieval.embedder import Embedder, packaged_minilm_path
from ngram_trie_rag.retrieval.st_pipeline import plain_pipeline, read_spec

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-5
LONG = " ".join(["The trie stores n-grams of the retrieved passages and proposes draft tokens "
                 "that the model verifies in one forward pass."] * 30)  # > 256 word pieces
TEXTS = [
    "How does the trie pick draft tokens?",
    "",
    LONG,
    "Übergrößenträger, naïve café — 東京は日本の首都です 🚀",
    "FAISS searches normalised vectors by inner product, which equals cosine similarity.",
    "a",
    "Speculative decoding drafts tokens and keeps the longest prefix the model agrees with.",
    "Paris is the capital of France.",
    "   leading and trailing spaces   ",
    "Ελληνικά και русский текст in one sentence.",
    "Retrieval-augmented generation grounds answers in documents.",
]


def _sentence_transformer(folder: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape and a.dtype == np.float32
    return float(np.abs(a - b).max())


@pytest.fixture(scope="module")
def minilm_st():
    return _sentence_transformer(packaged_minilm_path())


def test_long_text_is_truncated(minilm_st) -> None:
    assert len(minilm_st.tokenizer(LONG)["input_ids"]) > 256 == minilm_st.max_seq_length


@pytest.mark.parametrize("batch_size", [64, 3])
def test_minilm_documents_match_sentence_transformers(minilm_st, batch_size: int) -> None:
    embedder = Embedder(device="cpu", batch_size=batch_size)
    ours = embedder.encode(TEXTS)
    theirs = minilm_st.encode_document(TEXTS, batch_size=batch_size, normalize_embeddings=True)
    assert embedder.plain is not None and embedder._model is None  # the plain path ran
    assert _max_diff(ours, theirs) <= TOLERANCE
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_minilm_queries_match_sentence_transformers(minilm_st) -> None:
    embedder = Embedder(device="cpu")
    ours = embedder.encode_queries(TEXTS)
    theirs = minilm_st.encode_query(TEXTS, batch_size=64, normalize_embeddings=True)
    assert _max_diff(ours, theirs) <= TOLERANCE
    one = embedder.encode_queries("How does the trie pick draft tokens?")
    assert _max_diff(one, theirs[:1]) <= TOLERANCE
    assert embedder.encode([]).shape == (0, 384)


def test_fresh_process_never_imports_sentence_transformers() -> None:
    code = (
        "import json, sys\n"
        "from ngram_trie_rag.retrieval import Embedder\n"
        "e = Embedder()\n"
        "out = {'dim': e.dim, 'st_after_dim': 'sentence_transformers' in sys.modules,\n"
        "       'weights_after_dim': e.plain.model is not None}\n"
        "e.encode_queries(['x'])\n"
        "out['st_after_encode'] = 'sentence_transformers' in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"dim": 384, "st_after_dim": False, "weights_after_dim": False,
                   "st_after_encode": False}


# Folders saved by the installed sentence-transformers: new module spellings, other poolings.
@pytest.mark.parametrize("pooling, bert_config", [
    ("mean", {}),
    ("cls", {}),
    ("max", {}),
    ("mean", {"max_seq_length": 16, "do_lower_case": True}),
])
def test_tiny_saved_folders_match(tmp_path: Path, pooling: str, bert_config: dict) -> None:
    from retrieval_support import build_tiny_sentence_transformer

    folder = build_tiny_sentence_transformer(tmp_path / "tiny", dim=32)
    _edit(folder / "1_Pooling" / "config.json", pooling_mode=pooling)
    _edit(folder / "sentence_bert_config.json", **bert_config)
    spec = read_spec(folder)
    assert spec is not None and (spec.pooling, spec.dimension) == (pooling, 32)
    texts = [text.upper() for text in TEXTS]
    ours = Embedder(folder, device="cpu", batch_size=4).encode(texts)
    theirs = _sentence_transformer(folder).encode(texts, batch_size=4, normalize_embeddings=True)
    assert _max_diff(ours, theirs) <= TOLERANCE


def _configs_only(tmp_path: Path) -> Path:
    """The packaged MiniLM folder's json files, without weights."""
    source, folder = packaged_minilm_path(), tmp_path / "configs"
    for path in source.rglob("*.json"):
        target = folder / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return folder


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


def test_packaged_configs_are_plain(tmp_path: Path) -> None:
    spec = read_spec(_configs_only(tmp_path))
    assert spec is not None
    assert (spec.dimension, spec.pooling, spec.max_seq_length, spec.normalize) == (
        384, "mean", 256, True)


def _with_dense(folder: Path) -> None:
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))


def _with_prompts(folder: Path) -> None:
    _edit(folder / "config_sentence_transformers.json",
          prompts={"query": "query: ", "document": "passage: "})


def _with_weighted_pooling(folder: Path) -> None:
    _edit(folder / "1_Pooling" / "config.json",
          pooling_mode_mean_tokens=False, pooling_mode_weightedmean_tokens=True)


def _with_two_poolings(folder: Path) -> None:
    _edit(folder / "1_Pooling" / "config.json", pooling_mode_cls_token=True)


def _with_query_length(folder: Path) -> None:
    _edit(folder / "sentence_bert_config.json", query_length=32)


def _with_seq2seq_encoder(folder: Path) -> None:
    _edit(folder / "config.json", model_type="t5")


@pytest.mark.parametrize("change", [_with_dense, _with_prompts, _with_weighted_pooling,
                                    _with_two_poolings, _with_query_length,
                                    _with_seq2seq_encoder])
def test_other_folders_go_to_sentence_transformers(tmp_path: Path, change) -> None:
    folder = _configs_only(tmp_path)
    change(folder)
    assert plain_pipeline(folder) is None
    assert Embedder(folder).plain is None


def test_prompted_folder_still_embeds_through_sentence_transformers(tmp_path: Path) -> None:
    """A folder with a query prompt keeps sentence-transformers' prompt handling."""
    source, folder = packaged_minilm_path(), tmp_path / "prompted"
    folder.mkdir()
    for path in source.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / "config_sentence_transformers.json").unlink()
    _with_prompts(folder)
    embedder = Embedder(folder, device="cpu")
    assert embedder.plain is None
    queries = embedder.encode_queries(TEXTS[:3])
    plain = Embedder(device="cpu").encode(["query: " + text for text in TEXTS[:3]])
    assert embedder._model is not None and _max_diff(queries, plain) <= TOLERANCE

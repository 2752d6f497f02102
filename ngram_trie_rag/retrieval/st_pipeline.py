"""Run a plain sentence-transformers folder (Transformer -> Pooling -> optional Normalize)
with transformers alone.

Importing sentence-transformers pulls scikit-learn, scipy and more: seconds in a fresh process
that embeds one query, while transformers and torch are loaded anyway. For the common plain
pipeline this module reproduces what sentence-transformers' ``encode`` computes: the same
tokenizer call (pad to the longest, truncate at ``max_seq_length``), the same ``AutoModel``
forward in eval and inference mode, the same pooling, batches in the same length order.
:func:`plain_pipeline` returns None for anything else (a Dense layer, prompts, custom code,
other pooling), so the caller can hand that folder to sentence-transformers itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def _spellings(*names: str) -> frozenset[str]:
    return frozenset(f"sentence_transformers.{name}" for name in names)


# modules.json "type" values: the pre-6 alias, the package export and the defining module.
_TRANSFORMER = _spellings("models.Transformer", "base.modules.Transformer",
                          "base.modules.transformer.Transformer")
_POOLING = _spellings("models.Pooling", "sentence_transformer.modules.Pooling",
                      "sentence_transformer.modules.pooling.Pooling")
_NORMALIZE = _spellings("models.Normalize", "base.modules.Normalize",
                        "base.modules.normalize.Normalize",
                        "sentence_transformer.modules.Normalize")
# Encoders that sentence-transformers loads with plain AutoModel (not a seq2seq encoder half).
_ENCODER_TYPES = frozenset({"albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert",
                            "electra", "mpnet", "roberta", "xlm-roberta"})
_TEXT_ONLY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
# Legacy pooling flags, in the order sentence-transformers reads them.
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "sqrt",
                   "pooling_mode_weightedmean_tokens": "weightedmean",
                   "pooling_mode_lasttoken": "lasttoken"}
# sentence_bert_config.json keys that may appear, each only at its inert value.
_INERT = {"transformer_task": ("feature-extraction",), "module_output_name": ("token_embeddings",),
          "modality_config": (_TEXT_ONLY,), "unpad_inputs": (False, True),
          "query_length": (), "document_length": (), "query_expansion": (),
          "processing_kwargs": ({},),
          "model_args": ({},), "model_kwargs": ({},), "tokenizer_args": ({},),
          "processor_kwargs": ({},), "config_args": ({},), "config_kwargs": ({},)}
# A processor or adapter here would change what sentence-transformers loads.
_FOREIGN_FILES = ("adapter_config.json", "processor_config.json", "preprocessor_config.json",
                  "video_preprocessor_config.json", "sentence_roberta_config.json",
                  "sentence_distilbert_config.json", "sentence_camembert_config.json",
                  "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                  "sentence_xlnet_config.json")


@dataclass(frozen=True)
class PipelineSpec:
    """What a plain folder asks for, read from its json files alone."""

    folder: Path
    dimension: int
    pooling: str  # "mean" | "cls" | "max"
    max_seq_length: int | None
    do_lower_case: bool
    normalize: bool


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _transformer_settings(folder: Path) -> tuple[int | None, bool] | None:
    """(max_seq_length, do_lower_case) when sentence_bert_config.json asks for nothing else."""
    path = folder / "sentence_bert_config.json"
    config = _json(path) if path.exists() else {}
    if not isinstance(config, dict):
        return None
    for key, value in config.items():
        if key in ("max_seq_length", "do_lower_case"):
            continue
        if key not in _INERT or (value is not None and value not in _INERT[key]):
            return None
    max_len = config.get("max_seq_length")
    if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
        return None
    return max_len, bool(config.get("do_lower_case", False))


def _pooling_mode(config: dict) -> str | None:
    """The single pooling mode (mean, cls, max), as sentence-transformers resolves it."""
    mode = config.get("pooling_mode")
    if mode is None:
        legacy = [m for key, m in _LEGACY_POOLING.items() if config.get(key)]
        mode = legacy or ["mean"]  # no flag set means mean
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    return mode if mode in ("mean", "cls", "max") else None


def _pooling(folder: Path, entry: dict) -> tuple[int, str] | None:
    config = _json(folder / entry.get("path", "") / "config.json")
    if not isinstance(config, dict):
        return None
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    mode = _pooling_mode(config)
    if not isinstance(dimension, int) or dimension < 1 or mode is None:
        return None
    return dimension, mode


def _normalize_is_plain(folder: Path, entry: dict) -> bool:
    path = folder / entry.get("path", "") / "config.json"
    config = _json(path) if path.is_file() else {}
    return (isinstance(config, dict)
            and config.get("module_input_name", "sentence_embedding") == "sentence_embedding"
            and config.get("module_output_name") in (None, "sentence_embedding"))


def _no_prompts(folder: Path) -> bool:
    """True unless config_sentence_transformers.json adds a prompt or changes the output."""
    path = folder / "config_sentence_transformers.json"
    if not path.exists():
        return True
    config = _json(path)
    if not isinstance(config, dict):
        return False
    prompts = config.get("prompts") or {}
    return (isinstance(prompts, dict) and not any(prompts.values())
            and config.get("model_type", "SentenceTransformer") == "SentenceTransformer"
            and config.get("truncate_dim") is None and not config.get("requirements"))


def _plain_encoder(folder: Path) -> bool:
    config = _json(folder / "config.json")
    return (isinstance(config, dict) and config.get("model_type") in _ENCODER_TYPES
            and not any("attn_implementation" in key for key in config))


def read_spec(folder: str | Path) -> PipelineSpec | None:
    """The folder's plain pipeline, or None when sentence-transformers must run it."""
    folder = Path(folder)
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list) or len(modules) not in (2, 3):
        return None
    if not all(isinstance(m, dict) and not m.get("kwargs") and isinstance(m.get("type"), str)
               and isinstance(m.get("path", ""), str) and ".." not in m.get("path", "")
               for m in modules):
        return None
    types = [m.get("type") for m in modules]
    if (types[0] not in _TRANSFORMER or modules[0].get("path") not in ("", ".")
            or types[1] not in _POOLING or (len(types) == 3 and types[2] not in _NORMALIZE)):
        return None
    if any((folder / name).exists() for name in _FOREIGN_FILES):
        return None
    settings = _transformer_settings(folder)
    pooling = _pooling(folder, modules[1])
    normalize = len(modules) == 3
    if settings is None or pooling is None or not _no_prompts(folder) or not _plain_encoder(folder):
        return None
    if normalize and not _normalize_is_plain(folder, modules[2]):
        return None
    return PipelineSpec(folder, pooling[0], pooling[1], settings[0], settings[1], normalize)


def plain_pipeline(folder: str | Path, device: str | None = None) -> PlainPipeline | None:
    """A :class:`PlainPipeline` for ``folder`` (weights not loaded yet), or None."""
    spec = read_spec(folder)
    return PlainPipeline(spec, device) if spec is not None else None


class PlainPipeline:
    """Tokenizer + ``AutoModel`` + pooling for one plain folder; weights load on first use."""

    def __init__(self, spec: PipelineSpec, device: str | None = None) -> None:
        self.spec = spec
        self.device = device
        self.tokenizer: Any = None
        self.model: Any = None

    @property
    def dimension(self) -> int:
        return self.spec.dimension

    def load(self) -> PlainPipeline:
        """Load tokenizer and weights the way sentence-transformers' Transformer module does."""
        if self.model is not None:
            return self
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        folder = str(self.spec.folder)
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        model = AutoModel.from_pretrained(folder, config=config, trust_remote_code=False)
        max_len = self.spec.max_seq_length
        kwargs = {"model_max_length": max_len} if max_len is not None else {}
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kwargs)
        positions = getattr(config, "max_position_embeddings", -1)
        if max_len is None and positions != -1:
            tokenizer.model_max_length = min(tokenizer.model_max_length, positions)
        if self.spec.do_lower_case:
            _lowercase(tokenizer)
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer, self.model = tokenizer, model.to(device).eval()
        return self

    def encode(self, texts: Sequence[str], batch_size: int = 32,
               progress: bool = False) -> np.ndarray:
        """Unit-norm embeddings, float32 (N, dimension), in the order of ``texts``."""
        import torch
        from torch.nn.functional import normalize
        from tqdm.auto import trange

        self.load()
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        # Longest first, as sentence-transformers batches (same argsort, so same batches).
        order = np.argsort([-len(text) for text in texts])
        device = next(self.model.parameters()).device
        rows: list[torch.Tensor] = []
        with torch.inference_mode():
            for start in trange(0, len(texts), batch_size, desc="Batches", disable=not progress):
                batch = [texts[i] for i in order[start:start + batch_size]]
                features = self.tokenizer(batch, padding=True, truncation="longest_first",
                                          return_tensors="pt")
                features = {key: value.to(device) for key, value in features.items()}
                tokens = self.model(**features, return_dict=True).last_hidden_state  # (B, T, H)
                pooled = _pool(tokens, features["attention_mask"], self.spec.pooling)  # (B, H)
                if self.spec.normalize:
                    pooled = normalize(pooled, p=2, dim=-1)
                rows.extend(normalize(pooled, p=2, dim=1).cpu())
        vectors = torch.stack([rows[i] for i in np.argsort(order)])  # (N, H)
        return np.ascontiguousarray(vectors.float().numpy(), dtype=np.float32)


def _pool(tokens: Any, mask: Any, mode: str) -> Any:
    """sentence-transformers' padded pooling: tokens (B, T, H), mask (B, T) -> (B, H)."""
    import torch

    if mode == "cls":
        first = mask.to(torch.int).argmax(dim=1)  # first unmasked token
        index = first.unsqueeze(-1).unsqueeze(1).expand(-1, 1, tokens.shape[-1])
        return torch.gather(tokens, 1, index).squeeze(1)
    weights = mask.unsqueeze(-1).to(tokens.dtype)  # (B, T, 1)
    if mode == "max":
        return tokens.masked_fill(weights.expand_as(tokens) == 0, float("-inf")).max(dim=1).values
    wide = torch.float32 if tokens.dtype in (torch.float16, torch.bfloat16) else tokens.dtype
    total = (tokens * weights).sum(dim=1, dtype=wide)
    count = torch.clamp(weights.sum(dim=1, dtype=wide), min=1e-9)
    return (total / count).to(tokens.dtype)


def _lowercase(tokenizer: Any) -> None:
    """Lowercase inputs before the tokenizer's own normalisation (``do_lower_case``)."""
    if not tokenizer.is_fast:
        try:
            tokenizer.do_lower_case = True
        except AttributeError:
            tokenizer.basic_tokenizer.do_lower_case = True
        return
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as Normalizers

    current = tokenizer.backend_tokenizer.normalizer
    if isinstance(current, Normalizers):
        parts = list(current)
    else:
        parts = [current] if current is not None else []
    if not any(isinstance(part, Lowercase) for part in parts):
        tokenizer.backend_tokenizer.normalizer = Normalizers([Lowercase(), *parts])

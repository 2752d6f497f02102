"""argparse types for numbers with a range and number lists, so a bad number is a usage
error up front.

``type=int`` takes ``--k -3`` or ``--max-new-tokens 0`` and leaves the handler to fail on
them later, sometimes after minutes of indexing or model loading; these refuse them while
the command line is parsed, in argparse's one line naming the flag. The flags every
command that runs a model shares (``--model``, ``--device``, ``--dtype``; ``--engine``,
``--capacity``) are added here too, so they are spelled and checked alike.
"""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def repetition_window(text: str) -> int:
    """``--repetition-stop``'s n, at least 2: one repeated token is often legitimate
    ("1 1")."""
    value = _int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def byte_size(text: str) -> int:
    """``"500000"``, ``"20M"``, ``"1.5GB"`` -> bytes (powers of 1024), at least 1."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 500000, 20M or 1G, "
                                         f"got {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)``, for a sweep's axes and a list of levels."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_model_flags(parser: argparse.ArgumentParser, *, dtype_default: str | None = None,
                    what: str = "the model") -> None:
    """``--model``, ``--device`` and ``--dtype``, spelled and read alike by every command
    that loads a model (:func:`ngram_trie_rag.loading.load_model`)."""
    parser.add_argument("--model", default=None, metavar="ID|PATH",
                        help=f"{what}: a Hugging Face hub id (e.g. Qwen/Qwen2.5-0.5B-Instruct; "
                        "downloaded as Transformers does), a local folder or a .gguf file "
                        "(default: the packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    default = dtype_default or "fp32 on CPU, bf16 on CUDA"
    parser.add_argument("--dtype", choices=DTYPES, default=dtype_default,
                        help=f"auto: the model's own (default: {default}; fp32 is what greedy "
                        "exactness is checked in)")


def capacity_positions(text: str) -> int:
    """``--capacity``'s cache positions: an integer of at least the engines' minimum."""
    from ..engine.engine_names import check_capacity

    value = _int(text)
    try:
        check_capacity(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_engine_flags(parser: argparse.ArgumentParser, *, note: str = "",
                     extra: tuple[str, ...] = ()) -> None:
    """``--engine`` and ``--capacity``, spelled and read alike by every command that runs
    the local engine (``from_pretrained(engine=..., capacity=...)``); ``note`` ends the
    help of ``--engine`` with what the command does with it; ``extra`` are values only
    this command takes (``serve``'s ``local``)."""
    from ..engine.engine_names import ENGINES, MIN_CAPACITY

    parser.add_argument("--engine", choices=ENGINES + tuple(extra), default="auto",
                        help="what runs the forwards: auto (the engine's own choice for the "
                        "device; default), eager (a cache that grows as it goes), static "
                        "(a preallocated cache, trees padded to fixed sizes), compiled "
                        "(static, its step compiled in the background), uniform (static, "
                        "every step one size), uniform-compiled (that size compiled)"
                        + (f"; {note}" if note else ""))
    parser.add_argument("--capacity", type=capacity_positions, default=None, metavar="N",
                        help=f"cache positions (at least {MIN_CAPACITY}) a preallocating "
                        "engine (any but eager) reserves and compiles for (default: the "
                        "engine's own size)")


def engine_flags(args: argparse.Namespace) -> tuple[str, int | None]:
    """``(--engine, --capacity)``, or a ValueError when the capacity does not fit the
    engine (argparse checks each flag alone, not the two together)."""
    from ..engine.engine_names import check_capacity

    try:
        return args.engine, check_capacity(args.capacity, args.engine)
    except ValueError as exc:
        raise ValueError(f"--capacity {args.capacity} with --engine {args.engine}: {exc}"
                         ) from None


def add_quantize_flag(parser: argparse.ArgumentParser) -> None:
    """``--quantize``, read alike by every command that loads the model it answers with
    (``from_pretrained(quantization=...)``)."""
    from ..engine.quant.names import SCHEMES

    parser.add_argument("--quantize", choices=SCHEMES, default=None,
                        help="quantize the loaded weights: int8 or int4 (weight-only; CPU and "
                        "CUDA kernels), w8a8 (int8 weights and per-token int8 activations; "
                        "CPU); answers stay the quantized model's own greedy ones; default: "
                        "the weights as loaded")

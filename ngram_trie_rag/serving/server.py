"""vLLM's own OpenAI-compatible server with the trie proposer: its command line and
environment (``ngram-trie-rag serve`` runs them where vLLM is installed).

Where vLLM is not installed, or with ``--engine local``, ``serve`` runs our own server over
the local engine instead (:mod:`.local_server`), which takes the same requests. For vLLM's,
:func:`server_argv` builds the argument list of
``python -m vllm.entrypoints.openai.api_server`` (the module form; it works where the
``vllm`` console script does not) with the proposer in ``--speculative-config``, for a
process to replace itself with. Clients pass each request's documents as
``extra_body={"vllm_xargs": {"ngram_trie_documents": ["text", ...]}}``; vLLM copies
``vllm_xargs`` into ``SamplingParams.extra_args``, where the proposer reads them.

On a CPU with tensor parallelism, vLLM binds each rank's threads to a NUMA node and
refuses when there are fewer nodes than ranks; :func:`cpu_thread_binding` splits the
CPUs this process may use between the ranks instead (``VLLM_CPU_OMP_THREADS_BIND``).
"""

from __future__ import annotations

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
    """The environment for the server: the caller's (hub settings included, so a hub id
    downloads unless the caller set ``HF_HUB_OFFLINE``), plus thread binding for CPU ranks."""
    env = dict(os.environ)
    if not on_gpu and tensor_parallel_size > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tensor_parallel_size))
    return env

"""``ngram-trie-rag serve`` and ``bench-serve`` without vLLM: the command line they build,
the CPU binding for tensor-parallel ranks, the summary of a run, which server ``serve``
runs and which flags each refuses, and a clear error where vLLM is missing. vLLM's runs
are in tests/with_vllm (vLLM's own environment); the local server's in
tests/test_local_server.py."""

from __future__ import annotations

import importlib.util
import json

import pytest

from ngram_trie_rag.bench.serve import summarise, table
from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.serving.server import (
    PROPOSER,
    cpu_thread_binding,
    server_argv,
    speculative_config,
)


def test_server_argv_puts_the_proposer_in_vllms_server() -> None:
    argv = server_argv("/models/m", port=9000, tensor_parallel_size=2,
                       num_speculative_tokens=5, extra=["--max-model-len", "4096"])
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"model": PROPOSER, "num_speculative_tokens": 5}
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--served-model-name") + 1] == "m"
    assert argv[-2:] == ["--max-model-len", "4096"]
    grammars = json.loads(argv[argv.index("--structured-outputs-config") + 1])
    assert grammars == {"backend": "xgrammar", "disable_any_whitespace": True}
    own = server_argv("/m", extra=["--structured-outputs-config={\"backend\": \"guidance\"}"])
    assert "--structured-outputs-config" not in own  # the caller's setting alone


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_config(0)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        server_argv("/m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="3 ranks"):
        cpu_thread_binding(3, [0, 1])


def test_cpu_ranks_get_disjoint_cpus() -> None:
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [4, 5, 6, 7, 8]) == "4,5|6,7"


def test_print_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "/models/m", "--print-command", "--",
                 "--max-model-len", "2048"]) == 0
    line = capsys.readouterr().out
    assert "vllm.entrypoints.openai.api_server" in line and line.strip().endswith("2048")


NO_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                             reason="vLLM is installed")


@NO_VLLM
def test_serve_without_vllm_serves_locally_and_refuses_vllms_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--tensor-parallel-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "--tensor-parallel-size apply to vLLM's server" in err
    assert "vLLM is not installed here" in err
    assert main(["serve", "--model", "/models/m"]) == 2  # the local server loads it
    err = capsys.readouterr().err
    assert "/models/m" in err and "vLLM is not installed here" in err


def test_serve_engine_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "local", "--print-command"]) == 2
    assert "--print-command apply to vLLM's server" in capsys.readouterr().err
    assert main(["serve", "--engine", "local", "--", "--max-model-len", "2048"]) == 2
    assert "arguments after --" in capsys.readouterr().err
    assert main(["serve", "--engine", "warp"]) == 2
    assert "'local'" in capsys.readouterr().err  # argparse lists local among the choices
    assert main(["ask", "--engine", "local", "docs", "q"]) == 2  # local is serve's alone
    assert "invalid choice: 'local'" in capsys.readouterr().err


def test_vllms_server_refuses_the_local_engines_flags() -> None:
    from ngram_trie_rag.commands.cli import build_parser
    from ngram_trie_rag.commands.serve import local_engine_flags, runs_locally

    parse = build_parser().parse_args
    eager = parse(["serve", "--engine", "eager"])
    assert not runs_locally(eager)
    refused = local_engine_flags(eager)
    assert "--engine local" in refused and "no --engine eager" in refused
    assert "--max-model-len" in local_engine_flags(parse(["serve", "--capacity", "4096"]))
    assert "--max-batch" in local_engine_flags(parse(["serve", "--max-batch", "4"]))
    assert "--prefill-chunk" in local_engine_flags(parse(["serve", "--prefill-chunk", "64"]))
    assert runs_locally(parse(["serve", "--engine", "local"]))
    assert not runs_locally(parse(["serve", "--print-command"]))  # vLLM's command line


def test_summary_reports_each_method_against_plain_vllm() -> None:
    plain = {"concurrency": 4, "wall_s": 2.0, "outputs": [[1, 2, 3], [4, 5]],
             "latencies_s": [1.0, 2.0]}
    trie = {"concurrency": 4, "wall_s": 1.0, "outputs": [[1, 2, 3], [4, 6]],
            "latencies_s": [0.5, 1.0], "vllm:spec_decode_num_accepted_tokens": 3.0,
            "vllm:spec_decode_num_drafts": 2.0, "vllm:spec_decode_num_draft_tokens": 8.0}
    rows = summarise({"vllm": {"levels": [plain]}, "vllm-trie": {"levels": [trie]}})
    by = {r["method"]: r for r in rows}
    assert by["vllm"]["output_tokens_per_s"] == 2.5 and by["vllm"]["exact_match_rate"] == 1.0
    assert by["vllm-trie"]["output_tokens_per_s"] == 5.0
    assert by["vllm-trie"]["exact_match_rate"] == 0.5
    assert by["vllm-trie"]["mean_accept_length"] == 2.5  # 5 tokens in 5 - 3 steps
    assert by["vllm"]["mean_accept_length"] == 1.0
    assert by["vllm-trie"]["p90_latency_s"] == 1.0
    assert "| vllm-trie | 4 | 5.0 | 2.00x |" in table(rows)


def test_bench_serve_refuses_unknown_methods(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench-serve", "--data", "x.jsonl", "--methods", "vllm,warp"]) == 2
    assert "unknown methods ['warp']" in capsys.readouterr().err


def test_summary_compares_local_methods_with_plain_local() -> None:
    plain = {"concurrency": 2, "wall_s": 1.0, "outputs": ["Paris.", "Rome"],
             "output_tokens": [3, 2], "latencies_s": [0.5, 1.0], "accepted_tokens": 0}
    trie = {**plain, "outputs": ["Paris.", "Roma"], "accepted_tokens": 2, "wall_s": 0.5}
    rows = {r["method"]: r for r in summarise({"local": {"levels": [plain]},
                                               "local-trie": {"levels": [trie]}})}
    assert rows["local"]["exact_match_rate"] == 1.0
    assert rows["local-trie"]["exact_match_rate"] == 0.5
    assert rows["local-trie"]["mean_accept_length"] == 5 / 3
    assert rows["local-trie"]["output_tokens_per_s"] == 10.0
    assert "| local-trie | 2 | 10.0 | 2.00x |" in table(list(rows.values()))


@NO_VLLM
def test_bench_serve_without_vllm_refuses_vllm_methods(capsys: pytest.CaptureFixture) -> None:
    from ngram_trie_rag.bench.serve import LOCAL_METHODS, default_methods

    assert default_methods() == LOCAL_METHODS
    assert main(["bench-serve", "--data", "x.jsonl", "--methods", "local,vllm-trie"]) == 2
    err = capsys.readouterr().err
    assert "vllm-trie need vLLM, which is not installed" in err and "local,local-trie" in err

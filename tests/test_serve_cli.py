"""``ngram-trie-rag serve`` and ``bench-serve`` without vLLM: the command line they build,
the CPU binding for tensor-parallel ranks, the summary of a run, and a clear error where
vLLM is missing. The runs themselves are in tests/with_vllm (vLLM's own environment)."""

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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_serve_without_vllm_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "/models/m"]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err


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

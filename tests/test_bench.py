"""The benchmark harness end to end on two real prompts, plus its loaders, CLI and charts.

The model runs once per module (fp32, greedy, 24 new tokens): exactness is asserted,
timings are only checked for shape, never for value.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from data_files import SHARED_DATA

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench import (
    METHODS,
    BenchConfig,
    BenchItem,
    DataFormatError,
    SweepConfig,
    bench_table,
    load_items,
    run_benchmark,
    run_sweep,
    sweep_tables,
    write_json,
)
from ngram_trie_rag.bench.background_load import background_load
from ngram_trie_rag.bench.config import normalise_methods
from ngram_trie_rag.bench.data import parse_row
from ngram_trie_rag.bench.plots import write_plots
from ngram_trie_rag.bench.quality import score
from ngram_trie_rag.bench.runner import answer_text, encode_item, rotated
from ngram_trie_rag.bench.sweep import replay_cell
from ngram_trie_rag.commands.bench import add_parser, bench_config, sweep_config
from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.decoding.repetition import repeat_cut
from ngram_trie_rag.prompts import rag_prompt

RAG = SHARED_DATA / "spec_bench" / "rag.jsonl"
HAGRID = SHARED_DATA / "hagrid" / "hagrid.jsonl"
MAX_NEW = 24

METHOD_KEYS = {
    "tokens_per_s", "decode_tokens_per_s", "speedup", "decode_speedup", "mean_accept_length",
    "accept_length_hist", "draft_time_share", "exact_match_rate", "oracle_share",
    "new_tokens", "total_s", "prefill_s", "decode_s", "steps", "prompts", "mismatched_prompts",
    "own_oracle_share", "same_size_share", "quality",
}
META_KEYS = {
    "model", "dtype", "threads", "torch", "transformers", "machine", "date", "command", "data",
    "rows_used", "max_new_tokens", "drafter", "hf_pld", "oracle_accept_length", "methods",
    "warmup", "oracle_by_max_draft", "repetition_stop",
}
RUN_KEYS = {"new_tokens", "total_s", "prefill_s", "decode_s", "accept_lengths", "exact", "steps",
            "oracle_accept_length"}

needs_data = pytest.mark.skipif(not RAG.is_file(), reason=f"benchmark data not found at {RAG}")


@pytest.fixture(scope="module")
def gen() -> SpeculativeGenerator:
    return SpeculativeGenerator.from_pretrained(dtype="float32")


@pytest.fixture(scope="module")
def results(gen: SpeculativeGenerator, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One full run, written to disk and read back (the file is what users get)."""
    # num_draft pinned so that the model-free replay can be checked against the real run
    cfg = BenchConfig(data=str(RAG), limit=2, max_new_tokens=MAX_NEW, num_draft=8, warmup=0,
                      command="test_bench")
    doc = run_benchmark(cfg, generator=gen, progress=False)
    path = write_json(doc, tmp_path_factory.mktemp("bench") / "results.json")
    return json.loads(path.read_text())


# ---- end to end -------------------------------------------------------------------------
@needs_data
def test_results_schema(results: dict) -> None:
    assert set(results) == {"meta", "methods", "prompts"}
    assert META_KEYS <= set(results["meta"])
    assert results["meta"]["rows_used"] == 2
    drafter = results["meta"]["drafter"]
    assert (drafter["n"], drafter["prefix_len"], drafter["num_draft"]) == (13, 3, 8)
    assert drafter["generator_config"]["n"] == 13
    assert list(results["methods"]) == list(METHODS)
    for name, m in results["methods"].items():
        assert METHOD_KEYS <= set(m), name
        assert m["tokens_per_s"] > 0 and m["decode_tokens_per_s"] > 0
        assert sum(m["accept_length_hist"].values()) == m["steps"]
    for name in ("vanilla", "plain"):  # one token per forward
        assert results["methods"][name]["mean_accept_length"] == 1.0, name
    for name in ("chain", "trie"):  # the answers copy from the passages in the prompts
        assert results["methods"][name]["mean_accept_length"] > 1.0, name
    assert results["methods"]["vanilla"]["speedup"] == pytest.approx(1.0)
    assert results["methods"]["vanilla"]["draft_time_share"] is None
    assert 0.0 <= results["methods"]["trie"]["draft_time_share"] < 1.0
    assert len(results["prompts"]) == 2
    for p in results["prompts"]:
        assert {"index", "id", "prompt_tokens", "oracle_accept_length", "reference_ids",
                "hf_prefill_s", "methods"} <= set(p)
        assert set(p["methods"]) == set(METHODS)
        for name, run in p["methods"].items():
            assert RUN_KEYS <= set(run), name
            assert isinstance(run["exact"], bool)
            assert run["decode_s"] == pytest.approx(run["total_s"] - run["prefill_s"])


@needs_data
def test_drafters_are_exact(results: dict) -> None:
    for name in ("trie", "chain", "plain", "vanilla"):
        assert results["methods"][name]["exact_match_rate"] == 1.0, name
        assert results["methods"][name]["mismatched_prompts"] == []
    for p in results["prompts"]:
        assert len(p["reference_ids"]) == p["methods"]["vanilla"]["new_tokens"]


@needs_data
def test_accept_lengths_add_up(results: dict) -> None:
    """Every token after the first (prefill) comes from exactly one verification step."""
    for p in results["prompts"]:
        for name in ("vanilla", "plain", "chain", "trie"):
            run = p["methods"][name]
            assert sum(run["accept_lengths"]) == run["new_tokens"] - 1, name
        assert set(p["methods"]["plain"]["accept_lengths"]) <= {1}  # no drafts
        pld = p["methods"]["hf-pld"]
        if pld["accept_lengths"] is not None:
            first = pld["extra"]["prefill_forward_tokens"]
            assert sum(pld["accept_lengths"]) == pld["new_tokens"] - first


@needs_data
def test_oracle_is_reported(results: dict) -> None:
    oracle = results["meta"]["oracle_accept_length"]
    assert oracle > 1.0  # the answers copy from the passages in the prompts
    trie = results["methods"]["trie"]
    assert trie["oracle_share"] == pytest.approx(trie["mean_accept_length"] / oracle)
    # fp32 answers are the reference's, so the own-answer oracle is the same one
    assert trie["own_oracle_share"] == pytest.approx(trie["oracle_share"])
    for p in results["prompts"]:
        for run in p["methods"].values():
            assert run["oracle_accept_length"] == p["oracle_accept_length"]
            assert "token_ids" not in run  # stored only for answers that differ
    # the capped ceiling: at most K draft tokens a step, growing with K up to the oracle
    capped = results["meta"]["oracle_by_max_draft"]
    assert list(capped) == ["1", "2", "4", "8", "16", "32", "64"]
    values = list(capped.values())
    assert values == sorted(values) and 1.0 <= values[0] and values[-1] <= oracle + 1e-9
    # a tree of at most 8 nodes a step never accepts more than the 8-capped oracle, nor,
    # step by step, more than the best copy with the nodes it verified
    assert trie["mean_accept_length"] <= capped["8"] + 1e-9
    for name in ("trie", "chain"):
        assert 0.0 < results["methods"][name]["same_size_share"] <= 1.0
    assert results["methods"]["plain"]["same_size_share"] == 1.0  # no nodes, nothing to miss
    assert results["methods"]["hf-pld"]["same_size_share"] is None  # sizes not observable
    for p in results["prompts"]:
        run = p["methods"]["trie"]
        assert len(run["draft_sizes"]) == run["steps"] and sum(run["draft_sizes"]) == run["drafted"]


@needs_data
def test_replay_matches_the_real_run(gen: SpeculativeGenerator, results: dict) -> None:
    """The sweep's model-free replay reproduces the tree drafter's steps exactly, and
    the draft sizes it reports (what ``scripts/ceiling.py`` costs) are the run's."""
    items = load_items(RAG, limit=2)
    cell = gen.reshaped(n=13, prefix_len=3, num_draft=8)
    for item, p in zip(items, results["prompts"], strict=True):
        answer = p["reference_ids"]
        if len(answer) < MAX_NEW:  # ended by EOS: the last step's depth cap may differ
            continue
        ids = encode_item(gen, item)
        drafted: list[int] = []
        run = p["methods"]["trie"]
        assert replay_cell(cell, ids, None, answer, drafted=drafted) == run["accept_lengths"]
        assert len(drafted) == len(run["accept_lengths"]) and max(drafted) <= 8
        assert sum(drafted) == run["drafted"]


@needs_data
def test_pinned_budget_methods_run_beside_the_adaptive_one(gen: SpeculativeGenerator) -> None:
    """``trie@K`` verifies at most K nodes a step on its own generator, and stays exact."""
    from ngram_trie_rag.bench.methods import make_runners

    runners = make_runners(gen, ("vanilla", "trie", "trie@2", "chain@3"), None, 10, 3)
    item = load_items(RAG, limit=1)[0]
    ids = encode_item(gen, item)
    reference = runners["vanilla"](ids, None, MAX_NEW, 0.0).token_ids
    for name, cap in (("trie@2", 2), ("chain@3", 3)):
        run = runners[name](ids, None, MAX_NEW, 0.0)
        assert run.token_ids == reference
        assert run.drafted <= cap * len(run.accept_lengths)
        assert max(run.accept_lengths) <= cap + 1


@needs_data
def test_answer_quality_is_scored_against_the_gold_answers(gen: SpeculativeGenerator,
                                                           results: dict) -> None:
    """Spec-Bench RAG rows carry ``reference`` answers: every method's own answer is
    scored per prompt, and the summary holds the means."""
    items = load_items(RAG, limit=2)
    for name, m in results["methods"].items():
        quality = m["quality"]
        assert quality["scored"] == 2, name
        for key in ("exact_match", "f1", "contains"):
            assert 0.0 <= quality[key] <= 1.0, (name, key)
        per_prompt = [p["methods"][name]["quality"] for p in results["prompts"]]
        assert quality["f1"] == pytest.approx(sum(q["f1"] for q in per_prompt) / 2)
    for item, p in zip(items, results["prompts"], strict=True):
        assert p["answers"] == list(item.answers)
        expected = score(answer_text(gen, p["reference_ids"]), item.answers)
        assert p["methods"]["vanilla"]["quality"] == pytest.approx(expected)
        # fp32: every answer is the reference's, so is every score
        assert p["methods"]["trie"]["quality"] == p["methods"]["vanilla"]["quality"]


@needs_data
def test_repetition_stop_cuts_every_method_alike(gen: SpeculativeGenerator) -> None:
    """Row 1 of Spec-Bench RAG loops within 64 tokens at n = 10: the Hugging Face methods
    (a stopping criterion, then a cut) and the generator (its option) keep one prefix."""
    from ngram_trie_rag.bench.methods import make_runners

    item = load_items(RAG, limit=2)[1]
    ids = encode_item(gen, item)
    full = make_runners(gen, ("vanilla",), None, 10, 3)["vanilla"](ids, None, 64, 0.0)
    cut = repeat_cut(full.token_ids, 10)
    assert cut is not None and not full.extra["repetition_cut"]
    runners = make_runners(gen, ("vanilla", "hf-pld", "trie", "chain@4"), None, 10, 3,
                           repetition_stop=10)
    for name, runner in runners.items():
        run = runner(ids, None, 64, 0.0)
        assert run.token_ids == full.token_ids[:cut], name
        assert run.extra["repetition_cut"], name
        if run.accept_lengths is not None:  # steps count the kept answer only
            first = run.extra.get("prefill_forward_tokens", 1)
            assert sum(run.accept_lengths) == run.new_tokens - first, name
        if run.draft_sizes is not None:
            assert len(run.draft_sizes) == len(run.accept_lengths), name


def test_gold_answers_from_ctxs_rows_and_the_stop_in_the_results(
        gen: SpeculativeGenerator, tmp_path: Path) -> None:
    """NQ-open shaped rows (``ctxs`` + ``answers``), with the repetition stop on."""
    path = _jsonl(tmp_path / "nq.jsonl", [
        {"question": "What is the capital of France?", "answers": ["Paris"],
         "ctxs": [{"title": "France", "text": "The capital of France is Paris."}]},
        {"question": "What colour is the sky?", "answers": ["blue", "light blue"],
         "ctxs": [{"title": "Sky", "text": "On a clear day the sky is blue."}]},
    ])
    cfg = BenchConfig(data=str(path), max_new_tokens=12, methods=("hf-pld", "trie"),
                      warmup=0, repetition_stop=4, command="test_bench")
    doc = run_benchmark(cfg, generator=gen, progress=False)
    assert doc["meta"]["repetition_stop"] == 4
    assert [p["answers"] for p in doc["prompts"]] == [["Paris"], ["blue", "light blue"]]
    for name, m in doc["methods"].items():
        assert m["quality"]["scored"] == 2 and m["exact_match_rate"] == 1.0, name
    text = bench_table(doc)
    assert "F1" in text and "contains" in text and "repetition stop n=4" in text
    json.dumps(doc, allow_nan=False)


@needs_data
def test_table_and_plots(results: dict, tmp_path: Path) -> None:
    text = bench_table(results)
    for name in METHODS:
        assert name in text
    assert "F1" in text and "contains" in text  # the rows had gold answers
    unscored = {**results, "methods": {
        name: {**m, "quality": {"exact_match": None, "f1": None, "contains": None,
                                "scored": 0}}
        for name, m in results["methods"].items()}}
    assert "contains" not in bench_table(unscored)
    files = write_plots(results, tmp_path / "plots")
    assert {f.name for f in files} == {"speedup.png", "accept_lengths.png", "tokens_per_s.png"}
    for f in files:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 5000


@pytest.mark.skipif(not HAGRID.is_file(), reason="HAGRID data not found")
def test_sweep_replay(gen: SpeculativeGenerator) -> None:
    """Documents as the draft source (HAGRID rows), cells replayed without the model."""
    cfg = SweepConfig(data=str(HAGRID), limit=1, max_new_tokens=16, ns=(8, 13),
                      prefix_lens=(3,), num_drafts=(8, 32), replay=True, warmup=0,
                      command="test_sweep")
    doc = run_sweep(cfg, generator=gen, progress=False)
    backoff = run_sweep(replace(cfg, method="backoff"), generator=gen, progress=False)
    assert backoff["meta"]["method"] == "backoff"
    for paper, union in zip(doc["cells"], backoff["cells"], strict=True):
        assert union["label"] == paper["label"]
        assert union["mean_accept_length"] > 1.0  # the answer quotes its documents
    assert "drafter backoff" in sweep_tables(backoff)
    labels = [c["label"] for c in doc["cells"]]
    assert labels == ["n8-lp3-k8", "n13-lp3-k8", "n13-lp3-k32"]
    for c in doc["cells"]:
        assert c["mean_accept_length"] > 1.0  # the answer quotes its documents
        assert c["tokens_per_s"] is None and c["exact_match_rate"] is None  # not measured
    assert doc["reference"]["tokens_per_s"] > 0
    text = sweep_tables(doc)
    assert "n \\ L_p" in text and "num_draft" in text
    json.dumps(doc, allow_nan=False)


# ---- CLI ------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ngram-trie-rag")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_bench_flags() -> None:
    args = _parser().parse_args([
        "bench", "--data", "x.jsonl", "--limit", "5", "--max-new-tokens", "64",
        "--methods", "trie,chain", "--model", "/m", "--dtype", "bfloat16", "--threads", "2",
        "--n", "10", "--prefix-len", "2", "--num-draft", "16", "--warmup", "0",
        "--out", "r.json", "--plot", "charts",
    ])
    assert args.func.__name__ == "cmd_bench"
    cfg = bench_config(args)
    assert cfg.methods == ("vanilla", "trie", "chain")  # the reference always runs
    assert (cfg.limit, cfg.max_new_tokens, cfg.model, cfg.dtype, cfg.threads) == (
        5, 64, "/m", "bfloat16", 2)
    assert (cfg.n, cfg.prefix_len, cfg.num_draft, cfg.warmup) == (10, 2, 16, 0)
    assert (cfg.pld_num_tokens, cfg.pld_max_ngram) == (10, 3)
    assert args.out == "r.json" and args.plot == "charts"
    assert cfg.repetition_stop is None
    stop = bench_config(_parser().parse_args(["bench", "--data", "x.jsonl", "--out", "r.json",
                                              "--repetition-stop", "8"]))
    assert stop.repetition_stop == 8
    with pytest.raises(ValueError, match="repetition_stop"):
        BenchConfig(data="x", repetition_stop=1)


def test_background_load_spins_beside_the_block_and_stops_after() -> None:
    """``--background-load N``: N processes busy on a core each while the run lasts."""
    cfg = bench_config(_parser().parse_args(["bench", "--data", "x.jsonl", "--out", "r.json",
                                             "--background-load", "2"]))
    assert cfg.background_load == 2
    with pytest.raises(ValueError, match="background_load"):
        BenchConfig(data="x", background_load=-1)
    before = set(multiprocessing.active_children())
    with background_load(1) as count:
        [child] = set(multiprocessing.active_children()) - before
        assert count == 1 and child.is_alive()
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 30
        busy = False
        while stat.exists() and not busy and time.monotonic() < deadline:
            time.sleep(0.2)
            busy = int(stat.read_text().rsplit(")", 1)[1].split()[11]) > 0  # utime ticks
        assert busy or not stat.exists()  # spinning (checked where /proc exists)
    assert not child.is_alive()


def test_background_load_ends_with_a_killed_benchmark(tmp_path: Path) -> None:
    """A benchmark killed outright (no ``finally`` runs) leaves no spinner behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, time\n"
        "from ngram_trie_rag.bench.background_load import background_load\n"
        "if __name__ == '__main__':\n"
        "    with background_load(1):\n"
        "        import multiprocessing\n"
        "        print(multiprocessing.active_children()[0].pid, flush=True)\n"
        "        time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        spinner = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60
    while _alive(spinner) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(spinner)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cli_bench_defaults() -> None:
    cfg = bench_config(_parser().parse_args(["bench", "--data", "x.jsonl", "--out", "r.json"]))
    assert cfg.methods == METHODS and cfg.max_new_tokens == 128 and cfg.dtype == "float32"
    assert (cfg.n, cfg.prefix_len, cfg.num_draft, cfg.warmup) == (13, 3, None, 1)


def test_cli_sweep_flags() -> None:
    args = _parser().parse_args([
        "sweep", "--data", "x.jsonl", "--n", "8,13", "--prefix-len", "2,3",
        "--num-draft", "8,64", "--replay", "--out", "s.json",
    ])
    assert args.func.__name__ == "cmd_sweep"
    cfg = sweep_config(args)
    assert (cfg.ns, cfg.prefix_lens, cfg.num_drafts, cfg.replay) == ((8, 13), (2, 3), (8, 64),
                                                                     True)
    assert cfg.method == "trie"
    assert sweep_config(_parser().parse_args(
        ["sweep", "--data", "x", "--method", "backoff", "--out", "s.json"])).method == "backoff"
    # the n x L_p grid at num_draft 8, then the num_draft row at (13, 3), without repeats
    assert cfg.cells() == [(8, 2, 8), (8, 3, 8), (13, 2, 8), (13, 3, 8), (13, 3, 64)]


def test_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["bench", "--out", "r.json"])  # --data is required
    with pytest.raises(SystemExit):
        _parser().parse_args(["sweep", "--data", "x", "--n", "8,a", "--out", "s.json"])
    out = str(tmp_path / "r.json")
    assert main(["bench", "--data", str(RAG), "--methods", "beam", "--out", out]) == 2
    assert "unknown method" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert main(["bench", "--data", str(bad), "--out", out]) == 2  # fails before loading
    assert "expected one of" in capsys.readouterr().err
    assert not Path(out).exists()


def test_config_helpers() -> None:
    assert normalise_methods("trie, vanilla,trie") == ("vanilla", "trie")
    assert normalise_methods("trie,trie@8,chain@16") == ("vanilla", "trie", "trie@8", "chain@16")
    for bad in ("trie@0", "trie@", "plain@8", "trie@x", "trie8"):
        with pytest.raises(ValueError, match="unknown method"):
            normalise_methods(bad)
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    with pytest.raises(ValueError, match="prefix_len"):
        BenchConfig(data="x", n=3, prefix_len=3)
    with pytest.raises(ValueError, match="sweep method"):
        SweepConfig(data="x", method="chain")
    with pytest.raises(ValueError, match="no valid cell"):
        SweepConfig(data="x", ns=(2,), prefix_lens=(3,), num_drafts=(8,), fixed_n=3,
                    fixed_prefix_len=3)


# ---- data loaders -----------------------------------------------------------------------
def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_data
def test_load_spec_bench() -> None:
    items = load_items(RAG, limit=3)
    assert len(items) == 3
    first = json.loads(RAG.read_text().splitlines()[0])
    assert items[0].text == first["turns"][0]
    assert items[0].documents is None and items[0].shape == "spec_bench"
    assert items[0].id == str(first["question_id"])
    # gold answers: ``reference`` is a list of lists of strings, flattened
    assert items[0].answers == tuple(a for group in first["reference"] for a in group)


@pytest.mark.skipif(not HAGRID.is_file(), reason="HAGRID data not found")
def test_load_context_question_prefers_documents() -> None:
    item = load_items(HAGRID, limit=1)[0]
    row = json.loads(HAGRID.read_text().splitlines()[0])
    assert item.shape == "context"  # not turns[0]: the documents are the draft source
    assert item.documents == [p.strip() for p in row["context"].split("\n\n")]
    assert item.text == rag_prompt(item.documents, row["question"])
    assert item.text.startswith("Context:\n" + item.documents[0])


def test_load_docs_query(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [
        {"id": "q1", "docs": ["Alpha is first.", "Beta is second."], "query": "Which is first?"},
        {"docs": ["Gamma."], "query": "What?"},
    ])
    a, b = load_items(path)
    assert a.id == "q1" and a.documents == ["Alpha is first.", "Beta is second."]
    assert a.text == ("Context:\nAlpha is first.\n\nBeta is second.\n\n"
                      "Question: Which is first?\nAnswer the question based on the context.")
    assert b.id == "1"  # no id field: the row's position


def test_load_ctxs_question_gzip(tmp_path: Path) -> None:
    path = tmp_path / "nq.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"question": "who?", "answers": ["x"],
                            "ctxs": [{"title": "T", "text": "Body text."}]}) + "\n")
    (item,) = load_items(path)
    assert item.documents == ["T\nBody text."] and item.shape == "ctxs"
    assert item.answers == ("x",)


def test_gold_answers_are_optional_and_checked() -> None:
    assert parse_row({"turns": ["hi"]}).answers is None
    assert BenchItem("1", "hi", None, "spec_bench").answers is None  # the old signature
    summary = parse_row({"turns": ["hi"], "reference": ["A summary."]})
    assert summary.answers == ("A summary.",)  # a list of strings, as in summarization
    nested = parse_row({"turns": ["hi"], "reference": [["a", "b"], ["c"]]})
    assert nested.answers == ("a", "b", "c")
    row = {"docs": ["d"], "query": "q"}
    for bad, message in (("Paris", "must be a list"), ([], "holds no answer"),
                         ([""], r"answers\[0\] must be a non-empty string"),
                         ([["a", 3]], r"answers\[0\]\[1\] must be a non-empty string")):
        with pytest.raises(DataFormatError, match=message):
            parse_row({**row, "answers": bad})


def test_unknown_shape_names_the_expected_fields(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "u.jsonl", [{"prompt": "hi", "answer": "yo"}])
    with pytest.raises(DataFormatError) as err:
        load_items(path)
    msg = str(err.value)
    assert "u.jsonl line 1" in msg and "['answer', 'prompt']" in msg
    for field in ("'turns'", "'context'", "'question'", "'docs'", "'query'"):
        assert field in msg


def test_malformed_rows(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"turns": ["ok"]}\n{not json\n')
    with pytest.raises(DataFormatError, match="broken.jsonl line 2: not valid JSON"):
        load_items(broken)
    with pytest.raises(DataFormatError, match="non-empty string"):
        parse_row({"docs": ["ok", ""], "query": "q"})
    with pytest.raises(DataFormatError, match="must be a list"):
        parse_row({"turns": "not a list"})
    with pytest.raises(DataFormatError, match="no rows"):
        load_items(_jsonl(tmp_path / "empty.jsonl", []))
    with pytest.raises(FileNotFoundError):
        load_items(tmp_path / "missing.jsonl")


@needs_data
def test_structured_task_compares_with_constrained_plain_greedy(
        gen: SpeculativeGenerator) -> None:
    pytest.importorskip("xgrammar")
    cfg = BenchConfig(data=str(HAGRID), limit=1, max_new_tokens=24, methods=("trie",),
                      warmup=0, grammar="cited-json")
    doc = run_benchmark(cfg, generator=gen, progress=False)
    assert doc["meta"]["reference"] == "plain" and list(doc["methods"]) == ["plain", "trie"]
    assert doc["methods"]["trie"]["exact_match_rate"] == 1.0
    plain = doc["prompts"][0]["methods"]["plain"]
    assert plain["extra"]["forced_tokens"] == 0  # constrained greedy: one token a step
    assert "grammar cited-json" in bench_table(doc)
    with pytest.raises(ValueError, match="cannot decode under a grammar"):
        BenchConfig(data=str(HAGRID), methods=("vanilla", "trie"), grammar="cited-json")


@needs_data
def test_hf_static_is_generate_over_a_static_cache_and_only_runs_when_named(
        gen: SpeculativeGenerator) -> None:
    """The static-cache baseline gives generate's tokens (eager on a CPU) and is left out
    of the default methods."""
    from ngram_trie_rag.bench.methods import make_runners

    assert "hf-static" not in BenchConfig(data=str(RAG)).methods
    assert BenchConfig(data=str(RAG), methods="hf-static").methods == ("vanilla", "hf-static")
    runners = make_runners(gen, ("vanilla", "hf-static"), None, 10, 3)
    ids = encode_item(gen, load_items(RAG, limit=1)[0])
    reference = runners["vanilla"](ids, None, 16, 0.0).token_ids
    assert runners["hf-static"](ids, None, 16, 0.0).token_ids == reference

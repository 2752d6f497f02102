"""examples/triviaqa_reproduction.py: input shapes, answer scoring, and one small run end
to end (retrieve -> rerank -> speculative generation) with the packaged models."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest
from data_files import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
NQ = SHARED_DATA / "nq_open" / "nq-open-oracle.jsonl.gz"
WIKI = SHARED_DATA / "wiki_passages" / "passages.jsonl"

spec = importlib.util.spec_from_file_location(
    "triviaqa_reproduction", ROOT / "examples" / "triviaqa_reproduction.py")
repro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repro)


def test_answer_scoring() -> None:
    assert repro.normalize("The  Beatles!") == "beatles"
    assert repro.exact_match("The Beatles. They formed in 1960.", ["Beatles"])
    assert not repro.exact_match("It was the Beatles.", ["Beatles"])
    assert repro.contains_answer("It was the Beatles.", ["beatles"])
    assert not repro.contains_answer("Beatlesque music", ["Beatles"])  # whole words only


def test_question_shapes(tmp_path: Path) -> None:
    nq = tmp_path / "nq.jsonl.gz"
    with gzip.open(nq, "wt") as fh:
        fh.write(json.dumps({"question": "who?", "answers": ["a", "b"],
                             "ctxs": [{"title": "T", "text": "gold text"}]}) + "\n")
    hf = tmp_path / "tqa.jsonl"
    hf.write_text(json.dumps({"question": "what?", "answer": {"value": "X",
                                                              "aliases": ["ex"]}}) + "\n")
    official = tmp_path / "tqa.json"
    official.write_text(json.dumps({"Data": [{"Question": "when?",
                                              "Answer": {"Value": "Y", "Aliases": ["why"]}}]}))
    (a,), (b,), (c,) = (repro.read_questions(p) for p in (nq, hf, official))
    assert a == {"question": "who?", "answers": ["a", "b"],
                 "gold": {"title": "T", "text": "gold text"}}
    assert b["answers"] == ["X", "ex"] and b["gold"] is None
    assert c["question"] == "when?" and c["answers"] == ["Y", "why"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "no question field"}) + "\n")
    with pytest.raises(SystemExit, match="needs 'question' and 'answers'"):
        repro.read_questions(bad)


def test_corpus_shapes_and_gold(tmp_path: Path) -> None:
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"Paris is the capital."\tFrance\n2\tgold text\tT\n')
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"id": "w1", "contents": '"Rome"\nRome is in Italy.'}) + "\n")
    questions = [{"question": "q", "answers": ["x"], "gold": {"title": "T", "text": "gold text"}},
                 {"question": "r", "answers": ["y"], "gold": {"title": "U", "text": "new gold"}}]
    passages = repro.build_corpus([tsv, jsonl], questions, add_gold=True)
    texts = [p.text for p in passages]
    assert texts == ["France\nParis is the capital.", "T\ngold text", "Rome\nRome is in Italy.",
                     "U\nnew gold"]  # the first gold was already in the corpus: not duplicated
    assert [q["gold_id"] for q in questions] == ["psgs:2", "gold:1"]


@pytest.mark.skipif(not (NQ.is_file() and WIKI.is_file()), reason="shared data not found")
def test_pipeline_end_to_end_is_exact(tmp_path: Path) -> None:
    corpus = tmp_path / "wiki.jsonl"
    with open(WIKI, encoding="utf-8") as fh:
        corpus.write_text("".join(next(fh) for _ in range(30)))
    questions = tmp_path / "nq.jsonl.gz"  # 3 real NQ-open rows: every gold joins the corpus
    with gzip.open(NQ, "rt", encoding="utf-8") as src, gzip.open(questions, "wt") as dst:
        dst.write("".join(next(src) for _ in range(3)))
    out = tmp_path / "report.json"
    code = repro.main(["--questions", str(questions), "--corpus", str(corpus), "--limit", "2",
                       "--top-k", "8", "--top-n", "3", "--max-new-tokens", "24",
                       "--index-dir", str(tmp_path / "index"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["identical_to_greedy"] == 1.0
    assert report["questions"] == 2 and len(report["records"]) == 2
    assert report["gold_passage_recall@3"] is not None
    # The answers restate the retrieved passages: drafts from them were accepted.
    records = report["records"]
    assert sum(r["trie_accepted"] for r in records) > sum(r["trie_steps"] for r in records)
    assert report["mean_accept_length"] > 1.0
    assert all(r["new_tokens"] > 0 for r in report["records"])
    assert (tmp_path / "index" / "manifest.json").is_file()
    # A second run reuses the saved index (same corpus size) and gives the same answers.
    again = tmp_path / "again.json"
    repro.main(["--questions", str(questions), "--corpus", str(corpus), "--limit", "1", "--top-k",
                "8", "--top-n", "3", "--max-new-tokens", "24", "--index-dir",
                str(tmp_path / "index"), "--out", str(again)])
    second = json.loads(again.read_text())
    assert [r["prediction"] for r in second["records"]] == [
        r["prediction"] for r in report["records"][:1]]

"""The verification cost curve runs end to end on the CPU at tiny sizes (the GPU run
uses the same code at the shapes users run)."""

from __future__ import annotations

import numpy as np
import torch

from ngram_trie_rag.bench import cost_curve


def test_draft_trees_keep_the_engine_invariants() -> None:
    rng = np.random.default_rng(0)
    chain = cost_curve.draft_tree("chain", 5, rng)
    assert chain.parents.tolist() == [-1, 0, 1, 2, 3] and chain.depths.tolist() == [1, 2, 3, 4, 5]
    tree = cost_curve.draft_tree("tree", 40, rng)
    assert all(p < i for i, p in enumerate(tree.parents))
    assert all(tree.depths[i] == (1 if p < 0 else tree.depths[p] + 1)
               for i, p in enumerate(tree.parents))


def test_measure_covers_every_point() -> None:
    points = cost_curve.measure("tiny-llama", device=torch.device("cpu"), dtype=torch.float32,
                                contexts=(16, 32), sizes=(1, 4), warmup=1, repeats=2)
    keys = {(p.context, p.kind, p.draft) for p in points}
    assert keys == {(c, "plain", 0) for c in (16, 32)} | {
        (c, k, s) for c in (16, 32) for k in ("chain", "tree") for s in (1, 4)}
    assert all(p.ms > 0 and p.ratio > 0 for p in points)
    table = cost_curve.table(points)
    assert table.count("| tiny-llama |") == 4 and "K=4" in table


def test_projection_takes_the_draft_size_that_pays_best() -> None:
    from ngram_trie_rag.bench.cost_curve import Point
    from ngram_trie_rag.bench.projection import project

    points = [Point("s", 1024, "plain", 0, 10.0, 1.0),
              Point("s", 1024, "tree", 4, 12.0, 1.2), Point("s", 1024, "tree", 16, 20.0, 2.0),
              Point("s", 1024, "tree", 128, 40.0, 4.0)]
    oracle = {1: 1.5, 4: 2.4, 16: 3.0, 64: 3.2}
    (best,) = project(points, oracle)
    assert (best.best_k, best.accept) == (4, 2.4) and abs(best.speedup - 2.0) < 1e-9
    # a cap beyond the oracle's largest takes the largest measured (a lower bound)
    (only,) = project([Point("s", 1, "chain", 128, 1.0, 1.0)], oracle)
    assert only.accept == 3.2


def test_cost_curve_command_end_to_end(tmp_path, capsys) -> None:
    import json
    from pathlib import Path

    from ngram_trie_rag.commands.cli import main

    results = Path(__file__).resolve().parents[1] / "docs" / "results" / "rag-fp32.json"
    out = tmp_path / "curve.json"
    assert main(["cost-curve", "--shapes", "tiny-llama", "--contexts", "16", "--sizes", "1,4",
                 "--warmup", "1", "--repeats", "1", "--device", "cpu",
                 "--oracle", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| tiny-llama | 16 | tree |" in printed and "projected speed-up" in printed
    doc = json.loads(out.read_text())
    assert {p["kind"] for p in doc["projection"]} == {"chain", "tree"}
    assert doc["oracle"]["64"] > doc["oracle"]["1"] > 1.0
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["cost-curve", "--shapes", "tiny-llama", "--oracle", str(bad)]) == 2
    assert "oracle_by_max_draft" in capsys.readouterr().err

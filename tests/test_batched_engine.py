"""The batched engine: every row of a mixed batch decodes exactly as it would alone.

Rows join and leave mid-way (a finished row's slot goes to the next request, the last
row moving into it), with different prompt lengths, documents, answer lengths and
draft caps; each row's greedy tokens must equal ``model.generate(do_sample=False)``
in fp32 on the packaged model. A sampling row with a seed gives the tokens of the same
request run alone, and a grammar row beside free ones keeps to its own grammar.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model_families import FAMILIES, build

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine.batched import BatchedEngine, draft_cap
from ngram_trie_rag.engine.batched.step_inputs import batch_inputs, ragged_inputs
from ngram_trie_rag.reference import greedy_reference

pytestmark = pytest.mark.usefixtures("one_thread")


QUESTIONS = ("Summarise the passage in one sentence.", "What does the passage say first?",
             "List the numbers the passage gives.", "Explain the passage to a beginner.",
             "Which words does the passage repeat?", "Quote the passage's first sentence.")
_REFERENCE: dict[tuple, list[int]] = {}


def passages(count: int) -> list[str]:
    """``count`` paragraphs of the packaged sample documents, 200-700 characters each."""
    import ngram_trie_rag

    folder = Path(ngram_trie_rag.__file__).parent / "sample_docs"
    found = [p.strip() for f in sorted(folder.iterdir()) for p in f.read_text().split("\n\n")
             if 200 <= len(p.strip()) <= 700]
    return found[:count]


def cases(count: int, lengths: tuple[int, ...] = (24, 16, 32, 20, 28, 12)
          ) -> list[tuple[list[dict], list[str] | None, int]]:
    """(messages, documents, max_new_tokens): a different passage each (in the prompt and
    as the documents; every third request drafts from its prompt instead), answer lengths
    that make rows leave at different steps."""
    out = []
    for i, passage in enumerate(passages(count)):
        question = QUESTIONS[i % len(QUESTIONS)]
        messages = [{"role": "user", "content": f"Passage:\n{passage}\n\n{question}"}]
        out.append((messages, None if i % 3 == 2 else [passage], lengths[i % len(lengths)]))
    return out


def reference(generator: SpeculativeGenerator, ids: list[int], n: int) -> list[int]:
    """``model.generate(do_sample=False)``'s new tokens, computed once per prompt."""
    key = (tuple(ids), n)
    if key not in _REFERENCE:
        _REFERENCE[key] = greedy_reference(generator.model, ids, n)
    return _REFERENCE[key]


def _run_batched(gen: SpeculativeGenerator, engine: BatchedEngine, starts: list,
                 cap: int | None = None) -> list[list[int]]:
    """Decode ``starts`` (from ``gen._start``) as a scheduler would: one prefill joins at
    each step boundary while a row is free, every live row steps together, finished
    rows leave at once. Returns each request's tokens."""
    tokens: list[list[int]] = [[] for _ in starts]
    waiting = list(range(len(starts)))
    live: list[int] = []
    while waiting or live:
        if waiting and engine.free:
            i = waiting.pop(0)
            new, _, _ = gen._prefill(starts[i].request, starts[i].ids)
            tokens[i] += new
            live.append(i)
        reqs = [starts[i].request for i in live]
        if reqs:
            row_cap = cap if cap is not None else draft_cap(
                engine.curve.predict, len(reqs), max(r.drafter.num_draft for r in reqs))
            for i, (new, _, _) in zip(live, gen._batch_step(reqs, engine, row_cap),
                                           strict=True):
                tokens[i] += new
        for i in [i for i in live if starts[i].request.finish is not None]:
            engine.release(starts[i].request.kv)
            live.remove(i)
    return tokens


@pytest.mark.parametrize("cap", [None, 8])
def test_rows_joining_and_leaving_decode_as_generate(generator, cap) -> None:
    engine = BatchedEngine(generator.model, max_batch=3, capacity=1024, base=generator.engine)
    requests = cases(6)
    starts = [generator._start(m, d, None, {"max_new_tokens": n}, engine=engine)
              for m, d, n in requests]
    got = _run_batched(generator, engine, starts, cap)
    for (_, _, n), start, tokens in zip(requests, starts, got, strict=True):
        assert tokens == reference(generator, start.ids, n)
        assert start.request.stats.engine == "batched"
    drafted = sum(sum(s.request.stats.draft_sizes) for s in starts)
    accepted = sum(sum(a - 1 for a in s.request.stats.accept_lengths) for s in starts)
    assert drafted > 0 and accepted > 0  # the rows really verified trees
    assert engine.active == 0


def test_rows_in_the_curves_linear_layouts_decode_as_generate(generator, monkeypatch) -> None:
    """A batched forward runs the linear layout the base curve chose for its product
    rows (rows x nodes): transposed for a few, rowwise (where the CPU has AVX-512) for
    more, prepacked past them; tokens unchanged."""
    from ngram_trie_rag.engine import EagerEngine, LatencyCurve
    from ngram_trie_rag.engine.quant import w8a32

    sizes = (1, 2, 3, 5, 9, 17, 33, 65)
    middle = "rowwise" if w8a32.supported_cpu() else "transposed"
    curve = LatencyCurve({q: 0.01 * q for q in sizes},
                         {q: "transposed" if q < 3 else middle if q < 5 else "prepacked"
                          for q in sizes})
    gen = SpeculativeGenerator(generator.model, generator.tokenizer,
                               engine=EagerEngine(generator.model, curve=curve))
    engine = BatchedEngine(gen.model, max_batch=3, capacity=1024, base=gen.engine)
    layouts: list[str] = []
    batch = engine.step.batch

    def recorded(*args, **kwargs):  # every batched forward's layout (its fifth argument)
        layouts.append(args[4])
        return batch(*args, **kwargs)

    monkeypatch.setattr(engine.step, "batch", recorded)
    requests = cases(5)
    starts = [gen._start(m, d, None, {"max_new_tokens": n}, engine=engine)
              for m, d, n in requests]
    got = _run_batched(gen, engine, starts, cap=4)  # 1-15 product rows: all three layouts
    for (_, _, n), start, tokens in zip(requests, starts, got, strict=True):
        assert tokens == reference(generator, start.ids, n)
    assert {"transposed", middle, "prepacked"} <= set(layouts)


def test_a_seeded_sampling_row_gives_the_tokens_it_gives_alone(generator) -> None:
    engine = BatchedEngine(generator.model, max_batch=4, capacity=1024, base=generator.engine)
    messages, docs, _ = cases(6)[0]
    options = {"max_new_tokens": 32, "temperature": 0.8, "top_p": 0.95, "seed": 7}
    alone = generator.generate(messages, docs, **options).token_ids
    starts = [generator._start(messages, docs, None, dict(options), engine=engine)]
    starts += [generator._start(m, d, None, {"max_new_tokens": 24}, engine=engine)
               for m, d, _ in cases(4)[1:]]
    got = _run_batched(generator, engine, starts)
    assert got[0] == alone


def test_a_grammar_row_beside_free_rows(generator) -> None:
    pytest.importorskip("xgrammar")
    from ngram_trie_rag.decoding.grammar import Grammar

    engine = BatchedEngine(generator.model, max_batch=3, capacity=1024, base=generator.engine)
    messages, docs, _ = cases(6)[0]
    messages = [{"role": "user", "content": messages[0]["content"]
                 + "\nAnswer as JSON with an answer and a quote."}]
    grammar = Grammar.json_schema({"type": "object", "properties": {
        "answer": {"type": "string"}, "quote": {"type": "string"}},
        "required": ["answer", "quote"]})
    plain = generator.generate(messages, docs, max_new_tokens=40, method="none",
                               grammar=grammar).token_ids
    free = cases(6)[3:5]
    starts = [generator._start(messages, docs, None,
                               {"max_new_tokens": 40, "grammar": grammar}, engine=engine)]
    starts += [generator._start(m, d, None, {"max_new_tokens": n}, engine=engine)
               for m, d, n in free]
    got = _run_batched(generator, engine, starts)
    assert got[0] == plain  # constrained greedy, as decoded alone one token a step
    for (_, _, n), start, tokens in zip(free, starts[1:], got[1:], strict=True):
        assert tokens == reference(generator, start.ids, n)


def test_padding_rows_and_columns_are_invisible() -> None:
    # row 0: 3 committed, a chain of 2; row 1: 5 committed, no tree (padded to 2 nodes)
    inputs = batch_inputs([3, 5], [10, 11], [DraftTree.chain([1, 2]), DraftTree.empty()],
                          2, "cpu", __import__("torch").float32)
    visible = (inputs.mask[:, 0] == 0)
    assert inputs.positions.tolist() == [[3, 4, 5], [5, 6, 6]]
    assert inputs.columns.tolist() == [[3, 4, 5], [5, 6, 7]]
    assert visible[0, 2].tolist() == [True] * 6 + [False] * 2  # prefix + its ancestors
    assert visible[1, 0].tolist() == [True] * 6 + [False] * 2  # prefix + last
    assert visible[1, 1].tolist() == [True] * 7 + [False]  # padding: last and itself


def test_an_unpadded_step_lays_each_rows_queries_end_to_end() -> None:
    # row 0: 3 committed, a chain of 2; row 1: not stepped; row 2: 5 committed, no tree
    inputs = ragged_inputs([(3, 10, DraftTree.chain([1, 2])), None, (5, 11, DraftTree.empty())],
                           "cpu")
    assert inputs.ids.tolist() == [[10, 1, 2, 11]]
    assert inputs.positions.tolist() == [[3, 4, 5, 5]]
    assert inputs.rows.tolist() == [0, 0, 0, 2] and inputs.columns.tolist() == [3, 4, 5, 5]
    assert inputs.offsets == (0, 3, 3, 4) and inputs.width == 6
    assert inputs.attention.slots.tolist() == [0, 1, 2, 6]  # places in the (3, 3) grid
    seen = inputs.attention.allowed.bool()
    assert seen[0, 2].tolist() == [True] * 6  # prefix + its ancestors
    assert seen[2, 0].tolist() == [True] * 6  # prefix + last
    assert seen[1].sum(-1).tolist() == [1, 1, 1]  # an empty place: column 0 only
    assert seen[2, 1:].sum(-1).tolist() == [1, 1]


def test_an_unpadded_step_gives_the_padded_steps_logits(generator) -> None:
    # trees of 0, 5 and 2 nodes: unpadded the products see 1 + 6 + 3 rows, padded 3 x 9
    import torch

    engine = BatchedEngine(generator.model, max_batch=3, capacity=512, base=generator.engine)
    if not engine.ragged:
        pytest.skip("the row-wise attention kernel is not built on this machine")
    kvs = [engine.prefill(generator.encode_prompt(m), 8)[0] for m, _, _ in cases(3)]
    trees = [DraftTree.empty(), DraftTree.chain([5, 6, 7, 8, 9]), DraftTree.chain([8, 9])]
    rows = [(kv, 11 + i, tree) for i, (kv, tree) in enumerate(zip(kvs, trees, strict=True))]
    for given in (rows, rows[1:], [rows[0], rows[2]]):
        _, unpadded = engine.run_batch(given)
        engine.ragged = False
        _, padded = engine.run_batch(given)
        engine.ragged = True
        for (_, _, tree), a, b in zip(given, unpadded, padded, strict=True):
            assert a.shape == b.shape == (1 + len(tree), b.shape[-1])
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
            assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_draft_cap_shrinks_as_the_batch_grows() -> None:
    def predict(q: int) -> float:  # a CPU-like curve: 40 ms + 2.5 ms per token
        return 0.040 + 0.0025 * q

    caps = [draft_cap(predict, rows, 32) for rows in (1, 2, 4, 8, 16, 64)]
    assert caps[0] == 32
    assert caps == sorted(caps, reverse=True) and caps[-1] == 0
    assert draft_cap(lambda q: 0.01, 16, 32) == 32  # a flat (GPU-like) curve keeps trees


@pytest.mark.parametrize("family", ["qwen2", "mistral-window"])
def test_other_families_are_refused_with_the_reason(family: str) -> None:
    with pytest.raises(ValueError, match="Llama-style|sliding"):
        BatchedEngine(build(FAMILIES[family]), max_batch=2, capacity=64)


def test_a_request_that_does_not_fit_a_row_is_refused(generator) -> None:
    engine = BatchedEngine(generator.model, max_batch=1, capacity=64, base=generator.engine)
    with pytest.raises(ValueError, match=r"needs \d+ positions, more than .* 64"):
        generator._start("Hello there", None, None, {"max_new_tokens": 80}, engine=engine)


def test_the_direct_step_gives_the_modules_logits(generator) -> None:
    # on a CPU the batched step runs the direct Llama step (GQA packed, no module
    # dispatch); over the same rows and trees it must give the modules' logits
    import numpy as np
    import torch

    engine = BatchedEngine(generator.model, max_batch=3, capacity=512, base=generator.engine)
    assert engine.step is not None and engine.describe().forward == "llama-step"
    kvs = [engine.prefill(generator.encode_prompt(m), 8)[0] for m, _, _ in cases(3)]
    trees = [DraftTree.empty(),
             DraftTree(np.array([5, 6, 7]), np.array([-1, 0, 0]), np.array([1, 2, 2])),
             DraftTree(np.array([8, 9]), np.array([-1, 0]), np.array([1, 2]))]
    rows = [(kv, 11 + i, tree) for i, (kv, tree) in enumerate(zip(kvs, trees, strict=True))]
    _, direct = engine.run_batch(rows)  # writes the scratch columns only: run it again
    engine.step = None
    _, modules = engine.run_batch(rows)
    for a, b in zip(direct, modules, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_compaction_and_moves_keep_each_rows_columns() -> None:
    import torch

    from ngram_trie_rag.engine.batched.slot_cache import SlotCache

    slots = SlotCache(1, 3, 1, 8, 1, torch.float32, torch.device("cpu"))
    for row in range(3):  # key (row, column) = 10 * row + column
        slots.keys[0][row, 0, :, 0] = 10 * row + torch.arange(8.0)
    # row 1 keeps block columns 5, 7 at 3, 4 (a path through a second branch)
    slots.compact(torch.tensor([1, 1]), torch.tensor([5, 7]), torch.tensor([3, 4]))
    assert slots.keys[0][1, 0, :5, 0].tolist() == [10, 11, 12, 15, 17]
    assert slots.keys[0][0, 0, :, 0].tolist() == list(range(8))  # other rows untouched
    slots.move(2, 0, 4)  # row 0 leaves: the last row moves into it
    assert slots.keys[0][0, 0, :4, 0].tolist() == [20, 21, 22, 23]


def test_the_cap_chooser_runs_the_cap_whose_steps_emit_the_most() -> None:
    from ngram_trie_rag.engine.batched import CapChooser
    from ngram_trie_rag.engine.batched.cap_chooser import EXPLORE_EVERY

    chooser = CapChooser((1, 4, 8, 16, 32, 64))
    linear = lambda q: 0.01 * q  # noqa: E731 - the curve's cap for 4 rows: 4 nodes
    rate = {0: 100.0, 1: 130.0, 4: 90.0, 8: 60.0}  # tokens/s of each cap at 4 rows
    tried = []
    for _ in range(4 * 3):  # each candidate's first tries: the curve's cap, then none
        cap = chooser.choose(4, 32, linear)
        tried.append(cap)
        chooser.observe(4, cap, int(rate[cap]), 1.0)
    assert tried[:4] == [4, 4, 4, 0] and set(tried) == {0, 1, 4, 8}
    picks = []
    for _ in range(2 * EXPLORE_EVERY):
        cap = chooser.choose(4, 32, linear)
        picks.append(cap)
        chooser.observe(4, cap, int(rate[cap]), 1.0)
    assert picks.count(1) >= len(picks) - 2  # the best, bar a neighbour tried now and then
    assert chooser.choose(1, 32, linear) == 32  # one row: its own budget decides
    # within the largest bucket: a larger num_draft never builds a tree no step takes
    assert chooser.choose(1, 100, linear) == 64 and CapChooser((8, 32)).choose(1, 48, linear) == 32

"""Follow-up prompts reuse the cache of the tokens they share with the previous request,
and decode exactly what plain greedy decoding makes from the whole prompt."""

from __future__ import annotations

from itertools import islice
from types import SimpleNamespace

from data_files import SHARED_DATA

from ngram_trie_rag.bench.data import load_items
from ngram_trie_rag.engine.prefix_reuse import MIN_REUSE, PrefixKeeper, common_prefix
from ngram_trie_rag.reference import greedy_reference


def test_common_prefix_and_what_is_taken() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0
    keeper = PrefixKeeper()
    assert keeper.take(list(range(40))) == (None, 0)  # nothing kept yet
    kept = SimpleNamespace(ids=list(range(30)), length=30, cache=SimpleNamespace(layers=[]))
    keeper.keep(kept)
    assert keeper.take([*range(MIN_REUSE - 1), -1]) == (None, 0)  # too little in common
    keeper.keep(kept)
    kv, start = keeper.take(list(range(30)))  # the same prompt: its last token again
    assert (kv, start, kv.length, kv.ids) == (kept, 29, 29, list(range(29)))
    assert keeper.take(list(range(30))) == (None, 0)  # taken: given up
    off = PrefixKeeper(enabled=False)
    off.keep(kept)
    assert off.take(list(range(30))) == (None, 0)


def test_follow_ups_reuse_the_shared_prefix_and_stay_exact(generator) -> None:
    item = next(islice(load_items(SHARED_DATA / "hagrid" / "hagrid.jsonl"), 1))
    system = {"role": "system",
              "content": "Answer from the passages:\n" + "\n".join(item.documents)}
    questions = ["Who is mentioned in the passages?", item.text,
                 "Summarize the first passage in one sentence."]
    reused = []
    for question in questions:
        ids = generator.encode_prompt([system, {"role": "user", "content": question}])
        out = generator.generate(ids, item.documents, max_new_tokens=24)
        assert out.token_ids == greedy_reference(generator.model, ids, 24)[:len(out.token_ids)]
        assert out.finish_reason == "eos" or len(out.token_ids) == 24
        reused.append((out.stats.prefix_reused, len(ids)))
    shared = common_prefix(*(generator.encode_prompt(
        [system, {"role": "user", "content": q}]) for q in questions[:2]))
    assert reused[1][0] == shared > MIN_REUSE  # the system prompt and passages
    assert all(0 < r < n for r, n in reused[1:])

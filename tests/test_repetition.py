"""The repetition stop: the cut rule on hand-made lists, then on the real packaged model,
where the speculative answers must equal plain greedy cut by the same rule."""

from __future__ import annotations

import pytest
from data_files import read_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.decoding.repetition import RepetitionStop, cut_answer, repeat_cut, trim_steps
from ngram_trie_rag.decoding.result import GenerationStats
from ngram_trie_rag.reference import greedy_reference

# ---- the rule ---------------------------------------------------------------------------


def test_docstring_example() -> None:
    tokens = [5, 1, 2, 3, 9, 1, 2, 3, 1, 2, 3]
    assert repeat_cut(tokens, 3) == 5  # "1 2 3" ends at 3 and at 7: keep 5 1 2 3 9
    assert repeat_cut(tokens, 4) is None  # no 4-gram repeats
    assert repeat_cut(tokens, 2) == 5  # "1 2" ends at 2 and at 6


def test_no_repeat_and_short_inputs() -> None:
    assert repeat_cut([], 2) is None
    assert repeat_cut([1], 2) is None
    assert repeat_cut([1, 2, 3, 4, 5, 6], 2) is None


def test_overlapping_occurrences_wait_until_one_is_wholly_before_the_other() -> None:
    # "7 7" ends at 1, 2, 3: only the one ending at 3 lies wholly after the first (3-2 >= 1)
    assert repeat_cut([7, 7, 7], 2) is None
    assert repeat_cut([7, 7, 7, 7], 2) == 2
    # "1 2 1" ends at 2 and 4 overlapping (4-3 < 2); at 6 it is wholly after: cut 4
    assert repeat_cut([1, 2, 1, 2, 1, 2, 1], 3) == 4


def test_the_first_repeat_in_scan_order_wins() -> None:
    # "4 5" ends at 3 and again at 6 (cut 5); "1 2" repeats only later, ending at 8
    tokens = [1, 2, 4, 5, 0, 4, 5, 1, 2]
    assert repeat_cut(tokens, 2) == 5
    assert repeat_cut(tokens, 2, start=7) == 7  # past the first: "1 2" is what is left


def test_start_skips_checks_but_still_indexes_earlier_ngrams() -> None:
    tokens = [1, 2, 3, 1, 2, 3]
    assert repeat_cut(tokens, 3) == 3
    assert repeat_cut(tokens, 3, start=5) == 3  # "1 2 3" at 0..2 indexed, found at 5
    assert repeat_cut(tokens, 3, start=6) is None  # nothing new to check


def test_incremental_calls_with_a_shared_index_match_one_call() -> None:
    tokens = [4, 8, 1, 2, 3, 8, 1, 2, 6, 1, 2, 3, 8, 1, 2]
    for n in (2, 3, 4):
        seen: dict = {}
        found, start = None, 0
        for end in (3, 4, 7, 9, 12, len(tokens)):
            found = repeat_cut(tokens[:end], n, start, seen)
            start = end
            if found is not None:
                break
        assert found == repeat_cut(tokens, n), n


def test_trim_steps() -> None:
    assert trim_steps([3, 1, 4], 8) == [3, 1, 4]
    assert trim_steps([3, 1, 4], 5) == [3, 1, 1]
    assert trim_steps([3, 1, 4], 3) == [3]
    assert trim_steps([3, 1, 4], 0) == []


def test_the_stop_holds_back_what_a_cut_may_remove() -> None:
    """n = 3: a token leaves once no repeat can start at or before it."""
    stop = RepetitionStop(3)
    stats = GenerationStats(accept_lengths=[], draft_sizes=[])
    assert stop.emit([5], None, stats) == ([5], None)  # prefill: nothing to repeat yet
    stats.accept_lengths.append(3)
    stats.draft_sizes.append(4)
    assert stop.emit([1, 2, 3], None, stats) == ([1, 2, 3], None)
    stats.accept_lengths.append(3)
    stats.draft_sizes.append(4)
    # the tail "1 2" began the earlier "1 2 3": it may become a repeat, so it waits
    assert stop.emit([9, 1, 2], None, stats) == ([9], None)
    stats.accept_lengths.append(2)
    stats.draft_sizes.append(2)
    # "1 2 3" repeats: cut at 5, the held-back "1 2" never leaves
    assert stop.emit([3, 1], None, stats) == ([], "repetition")
    assert stop.tokens == [5, 1, 2, 3, 9]
    assert stats.accept_lengths == [3, 1] and stats.draft_sizes == [4, 4]


def test_a_tail_that_began_no_earlier_run_leaves_at_once() -> None:
    """Held back: only tails that start an n-gram wholly before them (k <= j - n)."""
    stop = RepetitionStop(3)
    stats = GenerationStats()
    assert stop.emit([7, 8], None, stats) == ([7, 8], None)
    assert stop.emit([9, 7], None, stats) == ([9], None)  # "7" at 3 may repeat "7 8 9"
    assert stop.emit([8], None, stats) == ([], None)  # "7 8" still may
    assert stop.emit([1], None, stats) == ([7, 8, 1], None)  # "7 8 1" is new: all final
    assert stop.emit([2], "eos", stats) == ([2], "eos")


def test_the_stop_flushes_everything_when_the_answer_ends() -> None:
    stop = RepetitionStop(4)
    stats = GenerationStats()
    assert stop.emit([1, 2, 3], None, stats) == ([1, 2, 3], None)
    assert stop.emit([4, 1, 2], None, stats) == ([4], None)
    assert stop.emit([3], "eos", stats) == ([1, 2, 3], "eos")


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=60),
       sizes=st.lists(st.integers(1, 6), min_size=1, max_size=60),
       n=st.integers(2, 6))
def test_streamed_tokens_are_the_cut_answer_and_never_withdrawn(
        tokens: list[int], sizes: list[int], n: int) -> None:
    """Fed in steps of any size, what leaves is always a prefix of the answer the cut
    rule keeps, all of it by the end; and the last token leaves whenever nothing at all
    could repeat (a tail no earlier n-gram began)."""
    kept, _ = cut_answer(tokens, n)
    stop, stats, out = RepetitionStop(n), GenerationStats(), []
    i, step = 0, 0
    while i < len(tokens):
        chunk = tokens[i : i + sizes[step % len(sizes)]]
        i += len(chunk)
        step += 1
        released, finish = stop.emit(chunk, "eos" if i >= len(tokens) else None, stats)
        out += released
        assert out == kept[: len(out)]
        if finish == "repetition":
            break
    assert out == kept


# ---- the generator ----------------------------------------------------------------------
N = 10
MAX_NEW = 80  # rag-1 loops within it at n = 10; rag-4 ends with EOS first


def _messages(index: int) -> list[dict]:
    row = read_jsonl("spec_bench/rag.jsonl", index + 1)[index]
    return [{"role": "user", "content": row["turns"][0]}]


@pytest.mark.parametrize("bad", [True, 1, 0, -3])
def test_bad_window_is_refused(generator: SpeculativeGenerator, bad: object) -> None:
    error = TypeError if isinstance(bad, bool) else ValueError
    with pytest.raises(error, match="repetition_stop"):
        generator.generate("Hi", max_new_tokens=4, repetition_stop=bad)
    with pytest.raises(TypeError, match="repetition_stop"):
        generator.generate("Hi", max_new_tokens=4, repetition_stop=8.0)


@pytest.mark.slow
def test_speculative_answers_are_plain_greedy_cut_by_the_same_rule(
        generator: SpeculativeGenerator) -> None:
    cuts = 0
    for index in (1, 4):  # one answer cut by the rule, one that ends on its own
        messages = _messages(index)
        reference = greedy_reference(generator.model,
                                     generator.encode_prompt(messages), MAX_NEW)
        cut = repeat_cut(reference, N)
        expected = reference if cut is None else reference[:cut]
        cuts += cut is not None
        for method in ("trie", "chain"):
            result = generator.generate(messages, max_new_tokens=MAX_NEW, method=method,
                                        repetition_stop=N)
            assert result.token_ids == expected, (index, method)
            assert (result.finish_reason == "repetition") == (cut is not None)
            assert sum(result.stats.accept_lengths) + 1 == len(result.token_ids)
            assert len(result.stats.draft_sizes) == len(result.stats.accept_lengths)
    assert cuts >= 1  # the rule was exercised, not only the answers that end on their own


def test_streamed_text_equals_the_final_text(generator: SpeculativeGenerator) -> None:
    stream = generator.stream(_messages(1), max_new_tokens=MAX_NEW, repetition_stop=N)
    deltas = list(stream)
    result = stream.result
    assert result is not None and result.finish_reason == "repetition"
    assert "".join(deltas) == result.text
    assert result.text == generator.tokenizer.decode(result.token_ids,
                                                     skip_special_tokens=True)
    plain = generator.generate(_messages(1), max_new_tokens=MAX_NEW)
    assert plain.token_ids[: len(result.token_ids)] == result.token_ids
    assert len(plain.token_ids) > len(result.token_ids)

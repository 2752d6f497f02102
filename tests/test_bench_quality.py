"""Answer quality scores (SQuAD style) on hand-computed cases; no model."""

from __future__ import annotations

import pytest

from ngram_trie_rag.bench.quality import mean_scores, normalise, score, token_f1


def test_normalise_drops_case_punctuation_articles_and_extra_space() -> None:
    assert normalise("The  Eiffel Tower, in Paris!") == "eiffel tower in paris"
    assert normalise("An apple a day") == "apple day"
    assert normalise("theatre, another") == "theatre another"  # articles as words only
    assert normalise("  ") == ""


def test_token_f1() -> None:
    # answer "paris france" vs gold "paris": precision 1/2, recall 1 -> 2/3
    assert token_f1("Paris, France", "Paris") == pytest.approx(2 / 3)
    # "new york city" vs "york new": 2 common; precision 2/3, recall 1 -> 0.8
    assert token_f1("New York City", "york new") == pytest.approx(0.8)
    # repeated words count as often as both sides have them: "a b b" vs "b b b"
    # after normalisation "b b" (the article goes) vs "b b b": 2 common, p 1, r 2/3
    assert token_f1("a b b", "b b b") == pytest.approx(0.8)
    assert token_f1("London", "Paris") == 0.0
    assert token_f1("The", "") == 1.0  # both empty after normalisation
    assert token_f1("", "Paris") == 0.0


def test_score_takes_the_best_gold_answer() -> None:
    s = score("The answer is Wilhelm Röntgen.", ["Wilhelm Conrad Röntgen", "Röntgen"])
    assert s["exact_match"] == 0.0
    assert s["contains"] == 1.0  # "röntgen" occurs in the answer
    # vs "röntgen": 1 common of the answer's 4 tokens ("answer is wilhelm röntgen"):
    # p 1/4, r 1 -> 0.4; vs "wilhelm conrad röntgen": 2 common, p 2/4, r 2/3 -> 4/7
    assert s["f1"] == pytest.approx(4 / 7)
    assert score("the Röntgen", ["Röntgen"]) == {"exact_match": 1.0, "f1": 1.0,
                                                  "contains": 1.0}
    assert score("1910", ["10"])["contains"] == 1.0  # a substring, as defined
    with pytest.raises(ValueError, match="no gold answers"):
        score("x", [])


def test_mean_scores_skips_unscored_answers() -> None:
    a = {"exact_match": 1.0, "f1": 1.0, "contains": 1.0}
    b = {"exact_match": 0.0, "f1": 0.5, "contains": 0.0}
    assert mean_scores([a, None, b]) == {"exact_match": 0.5, "f1": 0.75, "contains": 0.5,
                                         "scored": 2}
    assert mean_scores([None]) == {"exact_match": None, "f1": None, "contains": None,
                                   "scored": 0}

"""Per-method summaries over the same prompts, as ratios of totals (Spec-Bench style).

Definitions (all pooled over prompts, so long answers weigh more, as in Spec-Bench):

- ``tokens_per_s``: total new tokens / total wall time (prefill included).
- ``decode_tokens_per_s``: tokens made after prefill (new tokens - 1 per prompt, the
  first comes from the prefill logits) / total decode time.
- ``speedup`` / ``decode_speedup``: the method's rate / the reference's rate.
- ``ttft_s``: time to the first token, the mean prefill per prompt (every method
  prefills the whole prompt: no cache is kept between runs).
- ``mean_accept_length``: tokens committed / verification forwards, bonus included.
- ``oracle_share``: mean accept length / pooled oracle accept length (the ceiling a
  context-copying drafter could reach on the reference answers).
- ``own_oracle_share``: mean accept length / the pooled oracle of the method's own
  answers. Equal to ``oracle_share`` when every answer is the reference's (fp32); in
  bf16 answers diverge after near-ties, and a diverged answer can be far more or less
  repetitive than the reference, so this is the like-for-like share.
- ``same_size_share``: tokens committed / what the best context copy could have
  committed at the same steps with the same number of draft nodes per step (this
  library's drafters only): the quality of the drafter's choice of nodes, apart from
  the budget's choice of how many.
- ``draft_time_share``: drafting time / decode time (null where it is not measured).
- ``quality``: means of ``exact_match``, ``f1`` and ``contains`` of the method's own
  answers against the rows' gold answers (:mod:`~ngram_trie_rag.bench.quality`), over
  the ``scored`` prompts that have gold answers; per prompt, not pooled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .methods import Run
from .quality import mean_scores


def ratio(num: float, den: float) -> float | None:
    """num / den, or None when the denominator is not positive."""
    return num / den if den > 0 else None


def pooled_oracle(oracle: Sequence[float], answer_lengths: Sequence[int]) -> float | None:
    """Pool per-prompt oracle means as total tokens / total steps (like the methods).

    Steps start after prefill, so a prompt's answer of n tokens has n - 1 verified ones.
    """
    steps = sum((n - 1) / o for o, n in zip(oracle, answer_lengths, strict=True) if o > 0)
    tokens = sum(n - 1 for o, n in zip(oracle, answer_lengths, strict=True) if o > 0)
    return ratio(tokens, steps)


def accept_histogram(runs: Sequence[Run]) -> dict[str, int] | None:
    """Accept length -> number of steps (keys are strings: JSON object keys)."""
    if any(r.accept_lengths is None for r in runs):
        return None
    counts = Counter(a for r in runs for a in r.accept_lengths or ())
    return {str(k): counts[k] for k in sorted(counts)}


def summarise(runs: Sequence[Run], reference: Sequence[Run],
              oracle_mean: float | None) -> dict:
    """One method's row of ``results.json``; ``reference`` holds vanilla's runs."""
    new = sum(r.new_tokens for r in runs)
    total = sum(r.total_s for r in runs)
    decode = sum(r.decode_s for r in runs)
    decoded = sum(max(r.new_tokens - 1, 0) for r in runs)
    tps, dtps = ratio(new, total), ratio(decoded, decode)
    ref_tps = ratio(sum(r.new_tokens for r in reference), sum(r.total_s for r in reference))
    ref_dtps = ratio(sum(max(r.new_tokens - 1, 0) for r in reference),
                     sum(r.decode_s for r in reference))
    counted = all(r.accept_lengths is not None for r in runs)
    accepted = [a for r in runs for a in r.accept_lengths or ()] if counted else None
    mal = ratio(sum(accepted), len(accepted)) if accepted else None
    measured = all(r.draft_s is not None and r.core_decode_s is not None for r in runs)
    exact = [bool(r.exact) for r in runs]
    return {
        "prompts": len(runs),
        "new_tokens": new,
        "total_s": total,
        "prefill_s": sum(r.prefill_s for r in runs),
        "ttft_s": ratio(sum(r.prefill_s for r in runs), len(runs)),  # the first token's wait
        "decode_s": decode,
        "tokens_per_s": tps,
        "decode_tokens_per_s": dtps,
        "speedup": ratio(tps, ref_tps) if tps is not None and ref_tps else None,
        "decode_speedup": ratio(dtps, ref_dtps) if dtps is not None and ref_dtps else None,
        "steps": len(accepted) if accepted is not None else None,
        "mean_accept_length": mal,
        "accept_length_hist": accept_histogram(runs),
        "oracle_share": ratio(mal, oracle_mean) if mal is not None and oracle_mean else None,
        "own_oracle_share": _own_oracle_share(runs, mal),
        "same_size_share": (ratio(sum(accepted), sum(r.same_size_bound or 0 for r in runs))
                            if accepted and all(r.same_size_bound is not None for r in runs)
                            else None),
        "drafted_per_step": (ratio(sum(r.drafted or 0 for r in runs), len(accepted))
                             if measured and accepted else None),
        "draft_time_share": (ratio(sum(r.draft_s or 0.0 for r in runs),
                                   sum(r.core_decode_s or 0.0 for r in runs))
                             if measured else None),
        "trie_build_s": sum(r.trie_build_s or 0.0 for r in runs) if measured else None,
        "exact_match_rate": ratio(sum(exact), len(exact)),
        "mismatched_prompts": [i for i, ok in enumerate(exact) if not ok],
        "quality": mean_scores(r.quality for r in runs),
    }


def _own_oracle_share(runs: Sequence[Run], mal: float | None) -> float | None:
    """Mean accept length over the pooled oracle of the runs' own answers."""
    if mal is None or any(r.oracle is None for r in runs):
        return None
    own = pooled_oracle([r.oracle or 0.0 for r in runs], [r.new_tokens for r in runs])
    return ratio(mal, own) if own else None

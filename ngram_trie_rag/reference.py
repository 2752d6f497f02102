"""The reference the speculative paths are checked against: plain greedy decoding.

Tests, examples, scripts and the demo all compare against the same ``generate`` call, so
it is written once, here."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_reference(model: torch.nn.Module, prompt_ids: Sequence[int],
                     max_new_tokens: int, repetition_stop: int | None = None) -> list[int]:
    """The new tokens of ``model.generate(do_sample=False)`` after ``prompt_ids``: plain
    decoding, one token per forward, nothing drafted. The attention mask is passed so
    that ``generate`` never guesses padding from the pad token. ``repetition_stop``:
    stopped and cut at the first repeated n-gram, as the generator's option does."""
    ids = torch.tensor([list(prompt_ids)], device=model.device)
    options = {}
    if repetition_stop is not None:
        from transformers import StoppingCriteriaList

        from .decoding.stopping import RepetitionCriteria

        options["stopping_criteria"] = StoppingCriteriaList(
            [RepetitionCriteria(repetition_stop, ids.shape[1])])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, max_new_tokens=max_new_tokens, **options)
    tokens = out[0, ids.shape[1]:].tolist()
    if repetition_stop is None:
        return tokens
    from .decoding.repetition import cut_answer

    return cut_answer(tokens, repetition_stop)[0]

"""The plain greedy answer every speculative greedy answer must equal, token for token."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_reference(model: torch.nn.Module, prompt_ids: Sequence[int],
                     max_new_tokens: int) -> list[int]:
    """The new tokens of ``model.generate(do_sample=False)`` after ``prompt_ids``: plain
    decoding, one token per forward, nothing drafted. The attention mask is passed so
    that ``generate`` never guesses padding from the pad token."""
    ids = torch.tensor([list(prompt_ids)], device=model.device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, ids.shape[1]:].tolist()

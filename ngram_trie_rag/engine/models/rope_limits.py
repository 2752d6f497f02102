"""How deep a draft may reach where the rotary embedding changes with the sequence length.

Most RoPE variants (default, linear, llama3, yarn) give a position the same angles
whatever else is in the forward, so a tree of any depth is exact. Two do not: their
rotary module picks its frequencies from the largest position of the forward it runs
(``transformers.modeling_rope_utils.dynamic_rope_update``), and every token of that
forward gets them.

- ``dynamic`` (NTK): once a forward reaches past ``max_position_embeddings`` (T) the
  frequencies are recomputed for that length, so beyond T every ``generate`` step
  uses frequencies of its own length. A step of several tokens there would share one
  set: past T only plain steps are exact.
- ``longrope`` (Phi-3 long context): short factors while the sequence fits in the
  original length T, long factors once it is longer. A step may not straddle T;
  beyond it every token gets the long factors and trees are exact again. Phi-3's own
  ``prepare_inputs_for_generation`` (Phi-3, PhiMoE, Phi-4-multimodal) goes further:
  the step that first reaches past T drops the cache and recomputes the whole sequence
  with the long factors. The engine does the same at that step
  (:meth:`RopeLimit.recomputes`).

A step at ``past`` with a draft ``d`` deep runs positions ``past .. past + d``, i.e.
sequence length ``past + d + 1``; :meth:`RopeLimit.depth` returns the deepest ``d`` that
gives every position the frequencies ``generate`` would give it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

UNLIMITED = 1 << 30


@dataclass(frozen=True)
class RopeLimit:
    """Trees stay within sequence length ``threshold``; past it, trees again only if
    ``trees_after``. ``recompute``: the step at ``past == threshold`` recomputes the
    cache, as Phi-3's ``generate`` does."""

    threshold: int
    trees_after: bool
    recompute: bool = False

    def depth(self, past: int) -> int:
        """The deepest draft a step at ``past`` cached tokens may verify exactly."""
        if past + 1 <= self.threshold:
            return self.threshold - past - 1
        if self.recompute and past == self.threshold:
            return 0  # a plain step that recomputes the cache
        return UNLIMITED if self.trees_after else 0

    def recomputes(self, past: int) -> bool:
        """True for the step whose forward must recompute the whole sequence."""
        return self.recompute and past == self.threshold


def rope_limit(model: torch.nn.Module) -> RopeLimit | None:
    """The model's limit, or None where the angles depend on the position alone."""
    limits = []
    for module in model.modules():  # rotary modules carry `rope_type` and the config
        rope_type, config = getattr(module, "rope_type", None), getattr(module, "config", None)
        if rope_type is None or config is None:
            continue
        by_layer = rope_type if isinstance(rope_type, dict) else {None: rope_type}
        for layer_type, kind in by_layer.items():
            if "dynamic" in str(kind):
                limits.append(RopeLimit(int(module.original_max_seq_len), False))
            elif kind == "longrope":
                params = getattr(config, "rope_parameters", None) or {}
                if layer_type is not None:
                    params = params.get(layer_type, {})
                original = (params.get("original_max_position_embeddings")
                            or config.original_max_position_embeddings)
                limits.append(RopeLimit(int(original), True, _recomputes_cache(model)))
    if not limits:
        return None
    if len(set(limits)) > 1:  # rotary modules that disagree: plain steps past the first
        return RopeLimit(min(lim.threshold for lim in limits), False)
    return limits[0]


def _recomputes_cache(model: torch.nn.Module) -> bool:
    """True where the model's ``prepare_inputs_for_generation`` drops the cache when
    the sequence first outgrows ``original_max_position_embeddings`` (Phi-3's)."""
    prepare = getattr(type(model), "prepare_inputs_for_generation", None)
    try:
        source = inspect.getsource(prepare) if prepare is not None else ""
    except (OSError, TypeError):
        return False
    return "original_max_position_embeddings" in source

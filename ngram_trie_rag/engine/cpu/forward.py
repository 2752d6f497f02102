"""One forward of the generator's: a plain step or a tree verification.

Where :mod:`~ngram_trie_rag.engine.cpu.llama_step` applies it runs the step; otherwise the
model's modules run, with the measured attention
(:mod:`~ngram_trie_rag.engine.cpu.gqa_attention`) and linear layout
(:mod:`~ngram_trie_rag.engine.cpu.linear_layout`) switched in for this forward only (both
installed once, when the engine is built). A hook registered on the model after the
engine chose the step sends the forward to the modules, which run it. The engine and
the latency curve both call this, so the curve times exactly what the generator runs.
"""

from __future__ import annotations

import torch

from ..kv_cache import cache_kwargs
from ..protocol import Layout
from . import gqa_attention, linear_layout, llama_step
from .llama_step import LlamaStep


def forward(model: torch.nn.Module, step: LlamaStep | None, input_ids: torch.Tensor,
            position_ids: torch.Tensor, mask: torch.Tensor | dict | None, cache,
            layout: Layout, packed: bool) -> torch.Tensor:
    """Logits (Q, V) for ``input_ids`` (1, Q) at ``position_ids`` (1, Q); appends their
    keys and values to ``cache``. ``layout``: the linear layout ("prepacked" and
    "rowwise" need the step). ``packed``: GQA packed (every masked forward; a plain
    step where it measured faster)."""
    if step is not None:
        if not llama_step.hooked(step.modules):
            return step(input_ids, position_ids, mask, cache, layout, packed)
        # a hook registered since the engine chose the step: the modules run it, in the
        # variant they can run without the engine's installs
        layout, packed = "stock", packed and gqa_attention.installed(model)
    if layout in ("prepacked", "rowwise"):
        raise ValueError(f"the {layout} layout runs in the Llama step only")
    if packed and not gqa_attention.installed(model):
        raise ValueError("packed GQA needs gqa_attention.install(model) first")
    if layout == "transposed" and not linear_layout.installed(model):
        raise ValueError("the transposed layout needs linear_layout.install(model) first")
    with (gqa_attention.masked_gqa(packed, single=mask is None),
          linear_layout.transposed(layout == "transposed")):
        out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                    **cache_kwargs(model, cache), use_cache=True)
    return out.logits[0]

"""One timed generation per method, all returning the same :class:`Run` record.

Timing: ``total_s`` is wall time around the whole call. Prefill is split off so that a
decode-only rate exists for every method:

- ``plain`` / ``chain`` / ``trie``: the generator's own ``stats.prefill_s`` (its first
  forward).
- ``vanilla`` / ``hf-pld`` / ``hf-static``: ``generate`` does not expose its prefill, so the caller
  measures one separate ``model(input_ids)`` forward per prompt (:func:`measure_prefill`)
  and passes it in; ``decode_s = total_s - prefill_s``.

Accept lengths (tokens committed per verification forward, bonus token included; the
first forward, the prefill, is not a step):

- ``vanilla`` / ``hf-static``: one token per forward by construction.
- ``hf-pld``: read from the tokens ``generate`` hands its streamer after every forward.
  Its first forward processes the prompt and may already verify a draft; that forward is
  counted as prefill, like the generator's, and its tokens are left out of the steps.
- ``plain`` / ``chain`` / ``trie``: the generator's ``stats.accept_lengths``.

With a repetition stop (``repetition_stop=n``) this library's methods take the option;
the Hugging Face ones stop through :class:`~ngram_trie_rag.decoding.stopping.RepetitionCriteria`
and their tokens (and per-step counts) are cut at the same point, so every method
returns the same prefix of the greedy answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..decoding.grammar import Grammar
from ..decoding.repetition import cut_answer, trim_steps
from ..decoding.stopping import RepetitionCriteria
from ..engine.kv_cache import cache_kwargs
from ..generator import SpeculativeGenerator
from .config import pinned_budget


@dataclass
class Run:
    """One method on one prompt."""

    token_ids: list[int]  # new tokens, EOS included when it ended the answer
    total_s: float
    prefill_s: float
    accept_lengths: list[int] | None  # None when they could not be counted
    draft_s: float | None = None  # drafting time inside decode (our methods only)
    core_decode_s: float | None = None  # the generator's own decode_s (for the draft share)
    trie_build_s: float | None = None
    drafted: int | None = None  # draft nodes verified, summed over steps
    draft_sizes: list[int] | None = None  # draft nodes verified, per step (our methods)
    exact: bool | None = None  # token-exact vs the reference; set by the runner
    oracle: float | None = None  # oracle accept length of this run's own answer; runner
    same_size_bound: int | None = None  # sum of oracle.same_size_bounds; runner
    quality: dict | None = None  # exact_match / f1 / contains vs gold answers; runner
    extra: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    def to_dict(self) -> dict:
        """The per-prompt JSON record. Token ids are kept only for an answer that differs
        from the reference (whose ids are stored once per prompt), so every answer can
        be re-analysed offline."""
        out = asdict(self)
        if self.exact:
            del out["token_ids"]
        out["oracle_accept_length"] = out.pop("oracle")
        out.update(new_tokens=self.new_tokens, decode_s=self.decode_s,
                   steps=len(self.accept_lengths) if self.accept_lengths is not None else None)
        return out


# (prompt ids, documents or None, max_new_tokens, measured prefill for HF methods) -> Run
Runner = Callable[[list[int], "list[str] | None", int, float], Run]


def synchronize(model: torch.nn.Module) -> None:
    """Wait for queued GPU work so that wall-clock timings mean something."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


@torch.inference_mode()
def measure_prefill(gen: SpeculativeGenerator, prompt_ids: list[int]) -> float:
    """Seconds of one prompt forward, as ``generate`` runs it (cache on, last logits only)."""
    model = gen.model
    ids = torch.tensor([prompt_ids], device=model.device)
    synchronize(model)
    start = time.perf_counter()
    out = model(input_ids=ids, **cache_kwargs(model, DynamicCache()), use_cache=True,
                logits_to_keep=1)
    out.logits[0, -1].argmax().item()
    synchronize(model)
    return time.perf_counter() - start


class _StepTokens(BaseStreamer):
    """Records how many tokens ``generate`` commits per forward (the first put is the prompt)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


@torch.inference_mode()
def _hf_generate(gen: SpeculativeGenerator, prompt_ids: list[int], max_new_tokens: int,
                 streamer: BaseStreamer | None = None, repetition_stop: int | None = None,
                 **kwargs) -> tuple[list[int], float, bool]:
    """New tokens, seconds, and whether the repetition stop cut them."""
    model = gen.model
    ids = torch.tensor([prompt_ids], device=model.device)
    if repetition_stop is not None:
        kwargs["stopping_criteria"] = StoppingCriteriaList(
            [RepetitionCriteria(repetition_stop, len(prompt_ids))])
    synchronize(model)
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, streamer=streamer, **kwargs)
    synchronize(model)
    total = time.perf_counter() - start
    tokens, cut = cut_answer(out[0, len(prompt_ids):].tolist(), repetition_stop)
    return tokens, total, cut


def run_vanilla(gen: SpeculativeGenerator, prompt_ids: list[int], max_new_tokens: int,
                prefill_s: float, repetition_stop: int | None = None) -> Run:
    """Plain greedy ``generate``: the reference output and speed."""
    tokens, total, cut = _hf_generate(gen, prompt_ids, max_new_tokens,
                                      repetition_stop=repetition_stop)
    return Run(tokens, total, prefill_s, [1] * max(len(tokens) - 1, 0),
               extra={"repetition_cut": cut})


def run_hf_pld(gen: SpeculativeGenerator, prompt_ids: list[int], max_new_tokens: int,
               prefill_s: float, num_tokens: int = 10, max_ngram: int = 3,
               repetition_stop: int | None = None) -> Run:
    """Hugging Face prompt lookup decoding with the given settings."""
    steps = _StepTokens()
    tokens, total, cut = _hf_generate(gen, prompt_ids, max_new_tokens, streamer=steps,
                                      repetition_stop=repetition_stop,
                                      prompt_lookup_num_tokens=num_tokens,
                                      max_matching_ngram_size=max_ngram)
    sizes = trim_steps(steps.sizes, len(tokens)) if cut else steps.sizes
    counted = len(sizes) >= 1 and sum(sizes) == len(tokens)
    extra = {"forward_calls": len(steps.sizes), "prefill_forward_tokens": sizes[0] if sizes else 0,
             "repetition_cut": cut}
    return Run(tokens, total, prefill_s, sizes[1:] if counted else None, extra=extra)


def run_hf_static(gen: SpeculativeGenerator, prompt_ids: list[int], max_new_tokens: int,
                  prefill_s: float, repetition_stop: int | None = None) -> Run:
    """``generate`` over a static cache (``cache_implementation="static"``): on a GPU
    Transformers compiles its decoding step, its fastest greedy configuration. The
    cache only grows across calls (Transformers keeps the longest length), so a longer
    prompt than any before may compile once more; the warm-up round takes the first."""
    tokens, total, cut = _hf_generate(gen, prompt_ids, max_new_tokens,
                                      repetition_stop=repetition_stop,
                                      cache_implementation="static")
    return Run(tokens, total, prefill_s, [1] * max(len(tokens) - 1, 0),
               extra={"repetition_cut": cut})


def run_core(gen: SpeculativeGenerator, prompt_ids: list[int], documents: list[str] | None,
             max_new_tokens: int, method: str, num_draft: int | None = None,
             grammar: Grammar | None = None, repetition_stop: int | None = None) -> Run:
    """This library's generator; ``num_draft=None`` keeps its own budget policy."""
    synchronize(gen.model)
    start = time.perf_counter()
    res = gen.generate(prompt_ids, documents=documents, max_new_tokens=max_new_tokens,
                       method=method, num_draft=num_draft, grammar=grammar,
                       repetition_stop=repetition_stop)
    synchronize(gen.model)
    total = time.perf_counter() - start
    s = res.stats
    return Run(list(res.token_ids), total, s.prefill_s, list(s.accept_lengths),
               draft_s=s.draft_s, core_decode_s=s.decode_s, trie_build_s=s.trie_build_s,
               drafted=s.drafted, draft_sizes=list(s.draft_sizes),
               extra={"trie_tokens": s.trie_tokens, "draft_source": s.draft_source,
                      "forced_tokens": s.forced_tokens,
                      "threads_used": {str(t): n for t, n in s.threads_used.items()},
                      "repetition_cut": res.finish_reason == "repetition",
                      "closed_at": s.closed_at})


def make_runners(gen: SpeculativeGenerator, names: Sequence[str], num_draft: int | None,
                 pld_num_tokens: int, pld_max_ngram: int,
                 grammar: Grammar | None = None,
                 repetition_stop: int | None = None) -> dict[str, Runner]:
    """Name -> ``runner(prompt_ids, documents, max_new_tokens, hf_prefill_s) -> Run``.

    ``plain`` is the generator with no draft (every step one token): the same forwards,
    cache and loop as ``trie``, so ``trie`` over ``plain`` is what speculation alone adds.

    ``chain`` and ``trie`` each get their own generator over the shared model, so state
    a generator keeps across calls (e.g. a learned draft budget) is never shared between
    methods, as with two separate deployments. ``trie@K`` / ``chain@K`` (see
    :func:`~ngram_trie_rag.bench.config.pinned_budget`) run the drafter with ``K``
    nodes pinned, on a generator of their own too. ``repetition_stop`` applies to
    every method alike.
    """
    own = {m: gen.reshaped() for m in ("plain", "chain", "trie")}
    r = repetition_stop
    runners = {name: _pinned_runner(gen.reshaped(), *pin, grammar, r) for name in names
               if (pin := pinned_budget(name)) is not None}
    g = grammar  # under a grammar every core method decodes constrained
    known: dict[str, Runner] = {
        "vanilla": lambda ids, docs, new, pre: run_vanilla(gen, ids, new, pre, r),
        "hf-static": lambda ids, docs, new, pre: run_hf_static(gen, ids, new, pre, r),
        "hf-pld": lambda ids, docs, new, pre: run_hf_pld(gen, ids, new, pre, pld_num_tokens,
                                                         pld_max_ngram, r),
        "plain": lambda ids, docs, new, pre: run_core(own["plain"], ids, docs, new, "none",
                                                      grammar=g, repetition_stop=r),
        "chain": lambda ids, docs, new, pre: run_core(own["chain"], ids, docs, new, "chain",
                                                      num_draft, g, r),
        "trie": lambda ids, docs, new, pre: run_core(own["trie"], ids, docs, new, "trie",
                                                     num_draft, g, r),
    }
    return {name: runners.get(name) or known[name] for name in names}


def _pinned_runner(gen: SpeculativeGenerator, method: str, num_draft: int,
                   grammar: Grammar | None = None,
                   repetition_stop: int | None = None) -> Runner:
    return lambda ids, docs, new, pre: run_core(gen, ids, docs, new, method, num_draft,
                                                grammar, repetition_stop)

"""The model's latency curve: seconds per verification forward of ``q`` new tokens.

The draft budget (:mod:`ngram_trie_rag.drafting.budget`) needs ``t(q)`` to trade accepted length
against cost, and the generator needs to know, per forward size, which linear layout
(:mod:`ngram_trie_rag.engine.cpu.linear_layout`) and which single-query attention
(:mod:`ngram_trie_rag.engine.cpu.gqa_attention`) is fastest on this host. Both are timed here,
with forwards exactly as verification runs them: a plain step unmasked, a draft (a
chain) with its tree mask, after ``past_len`` cached tokens.

Two ways, for two moments:

- :func:`latency_curve` times every size in every variant that applies: fifteen to
  twenty-five seconds for the default model on two cores, more than a whole answer, so
  it runs only when asked (``ngram-trie-rag calibrate``), never on a first generation.
- :func:`default_curve` times a plain step and one draft of sixteen nodes in the stock
  variants (and, for an fp32 model on an AVX-512 CPU, the rowwise linear layout; about
  a second for the default model) and draws a line through them, a
  little steeper than measured, so that the budget drafts small until real steps
  (:meth:`~ngram_trie_rag.drafting.budget.DraftBudget.record_latency`) say otherwise.

:mod:`ngram_trie_rag.engine.costs.curve_cache` decides which one a process gets and keeps it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...drafting.budget import interpolated
from ...drafting.draft_tree import DraftTree
from ..cpu import linear_layout, rowwise_linear
from ..cpu.linear_layout import prepack_applies
from ..cpu.llama_step import LlamaStep
from ..cpu.thread_governor import intra_op_threads
from ..models.attention_windows import AttentionWindows
from ..protocol import Layout
from ..quant import attention as quant_attention

log = logging.getLogger(__name__)

SIZES = (*range(1, 9), 10, 12, 14, 16, 20, 24, 32, 48, 64)  # K whose t(1 + K) is measured
# The transposed linear layout only pays for a few rows; larger forwards are timed in
# the stock and prepacked layouts alone, which keeps the measurement to fifteen to
# twenty-five seconds.
MAX_TRANSPOSED = 17
# A non-stock variant (another linear layout, packed single-query attention)
# must win by this factor: where both cost the same (bf16 layouts here), timing noise
# would otherwise pick one per size at random, and the two round differently.
LAYOUT_MARGIN = 0.9
# how a curve's seconds were obtained ("compiled": a compiled engine's timed steps)
SOURCES = ("default", "refined", "measured", "compiled")
# The default curve's probe: a plain step and a draft of PROBE_Q - 1 nodes after
# PROBE_PAST cached tokens; its slope is raised by PROBE_MARGIN (drafting too little
# costs a few tokens per second until real steps correct it, drafting too much on a
# steep CPU curve costs more), and is at least PROBE_MIN_SLOPE of a plain step per
# token: two noisy timings must not make a draft look free.
PROBE_Q = 17
PROBE_MID = 9  # a third probe where the step has two layouts to choose between
PROBE_PAST = 64
PROBE_MARGIN = 1.15
PROBE_MIN_SLOPE = 0.01


_RESUMED = [0]  # times this process was resumed after a pause (see note_resumed)


def note_resumed(*_: object) -> None:
    """Count a resumption of this process (a SIGCONT handler): a forward timed across a
    pause measured the pause, and is timed again (a background measurement is paused
    while the process it measures for answers)."""
    _RESUMED[0] += 1


@dataclass(frozen=True)
class LatencyCurve:
    """Measured forward costs: seconds per forward of ``q`` new tokens, each in the
    fastest linear-layer layout (see :mod:`ngram_trie_rag.engine.cpu.linear_layout`), and whether
    a plain step's attention runs packed (see :mod:`ngram_trie_rag.engine.cpu.gqa_attention`)."""

    seconds: dict[int, float]  # q -> seconds, the chosen variant's
    layouts: dict[int, Layout] = field(default_factory=dict)  # q -> layout; absent: stock
    pack_single: bool = False  # a one-token forward is faster with packed GQA
    source: str = "measured"  # one of SOURCES
    # whether a full measurement chose the layouts and packing (a probe chooses none;
    # refined seconds keep what was chosen); None: as ``source == "measured"`` says
    variants_chosen: bool | None = None

    def __post_init__(self) -> None:
        if self.variants_chosen is None:
            object.__setattr__(self, "variants_chosen", self.source == "measured")

    def layout(self, q: int) -> Layout:
        """The layout for a forward of ``q`` tokens: the nearest measured size at or
        below it decides; past the largest measured size (prefill), stock."""
        if q > max(self.seconds):
            return "stock"
        return self.layouts.get(max(p for p in self.seconds if p <= q), "stock")

    def predict(self, q: int) -> float:
        """Seconds for a forward of ``q`` tokens, interpolated between measured sizes."""
        return interpolated(self.seconds, q)

    def packed(self, q: int, packed_gqa: bool) -> bool:
        """Whether a forward of ``q`` tokens runs packed GQA attention: every draft
        where it applies, a plain step where it measured faster."""
        return packed_gqa and (q > 1 or self.pack_single)


class _ForwardTimer:
    """Times forwards of ``q`` random tokens after ``past_len`` random cached ones, as
    the generator runs them, and drops what each forward appended to the cache."""

    def __init__(self, model, step: LlamaStep | None, windows: AttentionWindows | None,
                 past_len: int) -> None:
        from ..kv_cache import cache_kwargs, new_cache

        self.model, self.step, self.windows = model, step, windows
        self.past_len = min(past_len,
                            int(getattr(model.config, "max_position_embeddings", 2048)) // 2)
        self.gen = torch.Generator().manual_seed(0)
        prefix = self._random(self.past_len)
        self.cache = new_cache(quant_attention.reads_fp64(model))
        with torch.inference_mode():
            model(input_ids=prefix, **cache_kwargs(model, self.cache), use_cache=True,
                  logits_to_keep=1)

    def _random(self, q: int) -> torch.Tensor:
        vocab = self.model.config.vocab_size
        return torch.randint(0, vocab, (1, q), generator=self.gen).to(self.model.device)

    def inputs(self, q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | dict | None]:
        """``(ids, positions, mask)`` of a plain step (q = 1) or a chain draft."""
        from ..trees.tree_attention import tree_inputs

        device = self.model.device
        ids = self._random(q)
        if q == 1:
            return ids, torch.tensor([[self.past_len]], device=device), None
        chain = DraftTree.chain(ids[0, 1:].tolist())
        pos, mask = tree_inputs(chain, self.past_len, device, self.model.dtype,
                                self.windows)
        return ids, pos, mask

    @torch.inference_mode()
    def seconds(self, inputs: tuple, layout: Layout, pack: bool) -> float:
        """Wall time of one forward over ``inputs`` in ``layout``; a forward this process
        was paused during (:func:`note_resumed`) is run again."""
        from ..cpu.forward import forward

        device = self.model.device
        while True:
            resumed = _RESUMED[0]
            sync_device(device)
            start = time.perf_counter()
            forward(self.model, self.step, *inputs, self.cache, layout, pack)
            sync_device(device)
            elapsed = time.perf_counter() - start
            self.drop_appended()
            if _RESUMED[0] == resumed:
                return elapsed

    def drop_appended(self) -> None:
        """Cut the cache back to the ``past_len`` cached tokens."""
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, : self.past_len]
            layer.values = layer.values[:, :, : self.past_len]

    def fastest(self, q: int, variants: Sequence[tuple[Layout, bool]],
                repeats: int) -> dict[tuple[Layout, bool], float]:
        """Each variant's fastest of ``repeats`` runs (after one warm-up run of this
        shape), interleaved so that drift hits all of them: contention only adds time.

        A variant this host cannot run (a kernel missing an instruction set, an op
        that fails) is left out of the result, logged at debug level. The stock layout
        is what the model's own modules compute, so its errors are raised."""
        inputs = self.inputs(q)
        best = dict.fromkeys(variants, float("inf"))
        for run in range(repeats + 1):
            for variant in list(best):
                try:
                    took = self.seconds(inputs, *variant)
                except (RuntimeError, NotImplementedError) as error:
                    if variant[0] == "stock":
                        raise
                    self.drop_appended()
                    log.debug("forward variant %s cannot run here: %s", variant, error)
                    del best[variant]
                    continue
                if run:
                    best[variant] = min(best[variant], took)
        return best


def latency_curve(model, packed_gqa: bool = False, windows: AttentionWindows | None = None,
                  past_len: int = 512, sizes: Sequence[int] = SIZES,
                  repeats: int = 3, step: LlamaStep | None = None) -> LatencyCurve:
    """Time a forward of ``1 + K`` new tokens after ``past_len`` cached ones, for every
    K in ``sizes``, as verification runs it: a plain step unmasked, a draft (here a
    chain) with its tree mask and, with ``packed_gqa``, packed masked GQA.

    On a CPU each linear layout that applies is timed (transposed up to
    ``MAX_TRANSPOSED`` tokens, rowwise up to its kernel's ``MAX_ROWS``), and for a
    plain step with ``packed_gqa`` both attentions. ``step``: the generator's Llama
    step, timed instead of the modules when it runs one (see
    :mod:`ngram_trie_rag.engine.cpu.forward`). A variant other than the stock one
    must be faster by ``LAYOUT_MARGIN``.
    """
    layouts: list[Layout] = ["stock"]
    # the step computes the transposed layout itself; the modules only once installed
    if linear_layout.applies(model) and (step is not None or linear_layout.installed(model)):
        layouts.append("transposed")
    if step is not None and prepack_applies(model):
        layouts.append("prepacked")
    if step is not None and rowwise_linear.applies(model):
        layouts.append("rowwise")
    timer = _ForwardTimer(model, step, windows, past_len)
    seconds: dict[int, float] = {}
    chosen: dict[int, Layout] = {}
    pack_single = False
    for q in [1] + [1 + k for k in sizes]:
        packs = ((False, True) if packed_gqa else (False,)) if q == 1 else (packed_gqa,)
        tried = [(lay, pack) for lay in layouts for pack in packs
                 if q <= {"transposed": MAX_TRANSPOSED,
                          "rowwise": rowwise_linear.MAX_ROWS}.get(lay, q)]
        best = timer.fastest(q, tried, repeats)
        failed = {lay for lay, _ in tried} - {lay for lay, _ in best}
        layouts = [lay for lay in layouts if lay not in failed]  # not tried again
        pack = packs[0]
        if q == 1 and len(packs) == 2:
            fastest = {p: min(t for (_, p2), t in best.items() if p2 == p) for p in packs}
            pack = pack_single = fastest[True] < LAYOUT_MARGIN * fastest[False]
        lay, seconds[q] = _winner(best, pack)
        if lay != "stock":
            chosen[q] = lay
    return LatencyCurve(seconds, chosen, pack_single, source="measured")


def default_curve(model, packed_gqa: bool = False, windows: AttentionWindows | None = None,
                  step: LlamaStep | None = None, past_len: int = PROBE_PAST,
                  repeats: int = 2) -> LatencyCurve:
    """A curve from a few timings, for a process that has no stored one: a plain step
    and a chain draft of ``PROBE_Q`` tokens, each the fastest of ``repeats`` after a
    warm-up, in the variants the curve then names: a plain step unpacked, the stock
    linear layout. Where the step can also run fp32 products in
    :mod:`~ngram_trie_rag.engine.cpu.rowwise_linear`'s kernel, each probe times both
    layouts, a draft of ``PROBE_MID`` tokens is probed too, and each probe's faster
    layout holds the sizes from the probe below it up to its own.

    Every size of ``SIZES`` lies on the lines through the probes, each slope raised by
    ``PROBE_MARGIN`` (the last one extended): the budget starts cautious and real steps
    refine it.

    On a CPU the probe runs on one thread. Only the curve's shape matters until real
    steps rescale it, one thread's is a little steeper (more cautious), and a forward
    split over every core of a busy host waits for descheduled threads: on two cores
    beside one busy process the probe took 18 s on two threads, 1.2 s on one."""
    threads = 1 if model.device.type == "cpu" else None
    layouts: list[Layout] = ["stock"]
    if step is not None and rowwise_linear.applies(model):
        layouts.append("rowwise")
    probes = (1, PROBE_MID, PROBE_Q) if len(layouts) > 1 else (1, PROBE_Q)
    with intra_op_threads(threads):
        timer = _ForwardTimer(model, step, windows, past_len)
        timed = {q: _fastest_layout(timer, q, layouts, packed_gqa and q > 1, repeats)
                 for q in probes}
    sizes = [1] + [1 + k for k in SIZES]
    seconds: dict[int, float] = {1: timed[1][1]}
    chosen: dict[int, Layout] = {}
    for lo, hi in zip(probes, probes[1:], strict=False):
        slope = max((timed[hi][1] - timed[lo][1]) / (hi - lo),
                    PROBE_MIN_SLOPE * timed[1][1]) * PROBE_MARGIN
        last = hi == probes[-1]
        for q in sizes:
            if lo < q <= hi or (last and q > hi):
                seconds[q] = seconds[lo] + slope * (q - lo)
                if q <= hi:
                    chosen[q] = timed[hi][0]
    chosen[1] = timed[1][0]
    chosen = {q: lay for q, lay in chosen.items() if lay != "stock"}
    return LatencyCurve(seconds, chosen, pack_single=False, source="default")


def _fastest_layout(timer: _ForwardTimer, q: int, layouts: Sequence[Layout], pack: bool,
                    repeats: int) -> tuple[Layout, float]:
    """The winning layout of ``layouts`` for a forward of ``q`` tokens (see
    :func:`_winner`) and its seconds."""
    return _winner(timer.fastest(q, [(lay, pack) for lay in layouts], repeats), pack)


def _winner(best: dict[tuple[Layout, bool], float], pack: bool) -> tuple[Layout, float]:
    """The layout that runs forwards packed as ``pack`` and its seconds, from
    :meth:`_ForwardTimer.fastest`'s timings: the fastest, where it beats stock by
    ``LAYOUT_MARGIN``, else stock."""
    lay = min((lay for lay, p in best if p == pack), key=lambda lay: best[lay, pack])
    if best[lay, pack] < LAYOUT_MARGIN * best["stock", pack]:
        return lay, best[lay, pack]
    return "stock", best["stock", pack]


def sync_device(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on a CPU): every timing reads the clock
    after it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

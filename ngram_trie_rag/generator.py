"""Speculative generation: prefill, then per step propose -> verify -> accept -> update.

The decode loop reads off the paper's pseudo-code; a request's state lives in one
:class:`_Request`. Per step (the cache holds ``kv.length`` tokens, the newest committed
token ``last`` is not yet cached):

    tree    = drafter.propose(room)                 # N draft nodes, maybe none
    logits  = engine.run([last] + tree)             # (1 + N, V), one forward; node i at
                                                    # kv.length + depth_i, ancestors only
    emitted = accept(tree, logits)                  # accepted path + bonus token
    engine.commit(path)                             # KV cache: drop rejected branches
    drafter.update(emitted, seconds)                # learn: trie, acceptance, latency

A step with no draft is a plain decode step. A step runs in phases, ``_plan`` (the
draft, or a grammar's closing) -> the forward -> ``_settle`` (masks, acceptance,
compaction, cut, stats, learning), so that ``_batch_step`` can run many requests' steps
with ONE forward over a batched engine (:mod:`ngram_trie_rag.serving.scheduler`).
Greedy output is token-identical to ``model.generate(do_sample=False)``; sampling is
distribution-preserving (sampling.py).
Drafting (:mod:`ngram_trie_rag.drafting`) and the forwards (:mod:`ngram_trie_rag.engine`)
live apart; this module only joins them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from .decoding.grammar import Constraint, compiler_for
from .decoding.options import GenerationOptions, options_from
from .decoding.repetition import RepetitionStop
from .decoding.result import FinishReason, GenerationResult, GenerationStats
from .decoding.sampling import SamplingParams, choose
from .decoding.stream import GenerationStream, Step
from .decoding.text_stream import TextStream
from .drafting import DraftBudget, DraftConfig, Drafter, DraftTree
from .drafting.answer_store import answer_tokens
from .drafting.batch_trees import TreeShares
from .engine import KV, Engine, engine_for
from .engine.costs.latency import LatencyCurve
from .engine.cpu import openmp_team
from .inputs import DraftDocument, Prompt, encode_documents, encode_prompt, fit_context
from .util.keywords import unknown_keywords
from .validation import check_documents, check_prompt, layer_rows, vocab_size

if TYPE_CHECKING:
    from .engine.batched import BatchedEngine

__all__ = ["DraftConfig", "GenerationOptions", "GenerationStream", "SpeculativeGenerator"]


@dataclass
class _Request:
    """One generation's state: what it decodes, with what, and how far it got."""

    engine: Engine  # runs it from prefill to the last step (chosen when it starts)
    owner: Engine  # the engine it was asked of, told when it ends (``auto`` learns from it)
    drafter: Drafter
    params: SamplingParams
    rng: torch.Generator | None
    limit: int  # new tokens at most (max_new_tokens, cut to the context window)
    stats: GenerationStats
    kv: KV | None = None
    constraint: Constraint | None = None  # the grammar the answer must match, if any
    repeats: RepetitionStop | None = None  # ends the answer once it repeats itself
    reserve: int = 0  # tokens kept back to close the grammar's structure (last known)
    last: int = -1  # the newest committed token (not in the cache yet)
    produced: int = 0
    finish: FinishReason | None = None
    decode_start: float = field(default=0.0, repr=False)


@dataclass(frozen=True)
class _Plan:
    """A step drafted, not yet verified: its tree, the tokens it may still emit, and
    when it started (for the stats' drafting time)."""

    tree: DraftTree
    room: int
    start: float


def _chances(req: _Request, tree: DraftTree) -> np.ndarray:
    """(N,) the acceptance chances of ``tree``'s nodes in rank order, by the request's
    draft budget; a grammar row's (its tokens may be forced: certain) all 1."""
    budget = req.drafter.budget
    if req.constraint is not None or budget is None or not len(tree):
        return np.ones(len(tree))
    return budget.ranked_probabilities(tree)


class _Start(NamedTuple):
    """A request set up by :meth:`SpeculativeGenerator._start`: its state, its prompt's
    ids, its stop strings, and what to do with its result (None: nothing)."""

    request: _Request
    ids: list[int]
    stop: list[str]
    keep: Callable[[GenerationResult], None] | None


_Accepted = tuple[list[int], list[int]]  # (emitted tokens, accepted query rows)


def _append_commit(commits: list, kv: KV, row: Any, path: list[int]) -> None:
    """A batched step's commit, deferred so that all rows compact together."""
    commits.append((kv, row, path))


class SpeculativeGenerator:
    """N-gram trie speculative decoding for a Hugging Face causal LM.

    Thread-safe: calls are serialised on the model's lock (one KV cache per call).
    Generators over the same model object share its engine
    (:class:`~ngram_trie_rag.engine.protocol.Engine`: lock, forwards, latency curve);
    each keeps its own draft budget.
    """

    def __init__(self, model, tokenizer, config: DraftConfig | None = None,
                 name: str | None = None, *, engine: Engine | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 **draft_kwargs: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.config = config or DraftConfig(**draft_kwargs)
        self.model_name = name or getattr(model.config, "_name_or_path", "") or "model"
        self.context_window = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.vocab_size = vocab_size(model)  # token ids the model takes and emits
        # the logits' width (may exceed the vocabulary)
        self.logits_width = layer_rows(model.get_output_embeddings()) or self.vocab_size
        self.engine = engine or engine_for(model)
        # learned across this generator's calls, one per engine and kind of curve it runs
        self._budgets: dict[tuple, DraftBudget] = {}
        openmp_team.release()  # the building thread's (weight copies): forwards may run elsewhere

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike | None = None, *, tokenizer: Any = None,
                        device: str | None = None, dtype: str | torch.dtype | None = None,
                        model_kwargs: dict[str, Any] | None = None,
                        tokenizer_kwargs: dict[str, Any] | None = None,
                        chat_template_kwargs: dict[str, Any] | None = None,
                        engine: str = "auto", capacity: int | None = None,
                        quantization: str | None = None,
                        **kwargs: Any) -> SpeculativeGenerator:
        """Load a model as Transformers does and wrap it: a hub id (``"Qwen/Qwen2.5-7B-
        Instruct"``), a local folder, a ``.gguf`` file, or ``None`` for the packaged
        default; see :func:`ngram_trie_rag.loading.load_model`.

        ``from_pretrained``'s own keywords may be given here directly, as with
        ``AutoModelForCausalLM`` (``device_map="auto"``, ``attn_implementation=...``,
        ``revision=...``): they join ``model_kwargs``. Other keywords are the drafter's
        (``n``, ``prefix_len``, ``num_draft``, ...).

        ``engine`` picks what runs the forwards (see :mod:`~ngram_trie_rag.engine.choice`):

        - ``"auto"`` (default): on CUDA eager until the process has answered once, then
          the compiled engine, compiled in the background, for every request that fits
          its cache; on a CPU eager (see :mod:`~ngram_trie_rag.engine.auto`,
          docs/configuration.md);
        - ``"eager"``: a cache that grows as it goes, the measured CPU fast paths;
        - ``"static"``: a preallocated cache, trees padded to fixed sizes, run eagerly;
        - ``"compiled"``: the static engine's step compiled (``torch.compile``, CUDA
          graphs on CUDA) in the background while answers run eagerly;
        - ``"uniform"``: the static engine with every step padded to one size, so in bf16
          the drafting methods almost always give plain decoding's tokens;
        - ``"uniform-compiled"``: ``uniform`` with its one step shape compiled on first use.

        ``capacity``: the cache positions a preallocating engine (any but ``eager``)
        reserves and compiles for, at least
        :data:`~ngram_trie_rag.engine.engine_names.MIN_CAPACITY`; ``None`` leaves the size
        to the engine. Both are checked before the weights load, so a typo costs no load.

        ``quantization``: ``"int8"`` or ``"int4"`` weight-only quantization of the loaded
        weights, or ``"w8a8"`` (int8 weights and per-token int8 activations; CPU); see
        :mod:`~ngram_trie_rag.engine.quant`. Greedy answers stay those of the quantized
        model's own ``generate``; ``None`` keeps the weights as loaded.
        """
        from .engine.choice import make_engine
        from .engine.engine_names import check_capacity, check_engine
        from .loading import DEFAULT_MODEL_NAME, LOADER_KEYS, load_model

        check_capacity(capacity, check_engine(engine))

        loader = {k: kwargs.pop(k) for k in list(kwargs) if k in LOADER_KEYS}
        config = _draft_config(kwargs)  # an unknown keyword fails before the load
        model_kwargs = {**(model_kwargs or {}), **loader}
        loaded, loaded_tokenizer = load_model(model, tokenizer=tokenizer, device=device,
                                              dtype=dtype, model_kwargs=model_kwargs,
                                              tokenizer_kwargs=tokenizer_kwargs,
                                              quantization=quantization)
        name = os.fspath(model) if model is not None else DEFAULT_MODEL_NAME
        return cls(loaded, loaded_tokenizer, config, name=name,
                   engine=make_engine(loaded, engine, capacity),
                   chat_template_kwargs=chat_template_kwargs)

    def reshaped(self, *, engine: Engine | None = None, **changes: Any) -> SpeculativeGenerator:
        """A generator over the same model and tokenizer (no reload) with its drafting
        settings changed, e.g. ``reshaped(n=9)``, on ``engine`` (None: this one's); its
        budget starts fresh."""
        return SpeculativeGenerator(self.model, self.tokenizer, replace(self.config, **changes),
                                    self.model_name, engine=engine or self.engine,
                                    chat_template_kwargs=self.chat_template_kwargs)

    @property
    def busy(self) -> bool:
        """True while a generation holds the model."""
        return self.engine.lock.locked()

    @property
    def latency_curve(self) -> LatencyCurve:
        """Seconds per verification forward by size on this host: measured (``calibrate``),
        refined from real steps, or probed (see :mod:`~ngram_trie_rag.engine.costs.curve_cache`)."""
        return self.engine.curve

    # ---- inputs ---------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Prompt -> token ids: a string as-is, chat messages via the chat template (a
        model without one reads them as :func:`~ngram_trie_rag.inputs.messages_as_text`
        writes them)."""
        return encode_prompt(self.tokenizer, prompt, self.vocab_size, self.model_name,
                             self.chat_template_kwargs)

    def encode_documents(self, documents: Sequence[DraftDocument]) -> list[list[int]]:
        """Documents -> token ids, checked (kinds, ids in the vocabulary, text content)
        and with repeats dropped, in one pass; see :mod:`ngram_trie_rag.inputs`."""
        return encode_documents(self.tokenizer, check_documents(documents, self.vocab_size))

    def drafter(self, prompt_ids: Sequence[int], documents: Sequence[Sequence[int]] | None,
                method: str | None = None, num_draft: int | None = None,
                answers: Sequence[Sequence[int]] = (), engine: Engine | None = None
                ) -> Drafter:
        """The drafter a call would use: over ``documents`` (token ids) or the prompt,
        and earlier ``answers``, with this generator's budget for ``engine`` (the one
        the request runs on; None: this generator's) unless ``num_draft`` pins the tree
        size."""
        adaptive = num_draft is None and self.config.adaptive
        budget = self._draft_budget(engine or self.engine) if adaptive else None
        return Drafter.for_request(self.config, prompt_ids, documents, budget=budget,
                                   method=method, num_draft=num_draft, answers=answers)

    def _draft_budget(self, engine: Engine) -> DraftBudget:
        """The budget for requests on ``engine``: priced by its own curve (a compiled
        engine's padded steps cost what its buckets cost), kept across calls."""
        curve = engine.curve
        key = (id(engine), curve.source == "compiled")  # a compiling engine's curve changes once
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = DraftBudget(dict(curve.seconds),
                                                      self.config.num_draft)
        return budget

    # ---- public API -----------------------------------------------------------------
    def generate(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
                 options: GenerationOptions | None = None, **changes: Any) -> GenerationResult:
        """Generate a full answer; arguments as for :meth:`stream`."""
        return self.stream(prompt, documents, options, **changes).read_all()

    def stream(self, prompt: Prompt, documents: Sequence[DraftDocument] | None = None,
               options: GenerationOptions | None = None, **changes: Any) -> GenerationStream:
        """Text deltas as they are verified; ``.result`` once exhausted.

        Args:
            prompt: a string (tokenised as-is), chat messages (chat template applied;
                without one, the plain text of :func:`~ngram_trie_rag.inputs.messages_as_text`),
                or token ids.
            documents: texts or token ids to draft from (e.g. the retrieved chunks);
                ``None`` drafts from the prompt itself. The answer is always added.
            options: a :class:`~ngram_trie_rag.decoding.options.GenerationOptions` (token budget,
                sampling, stop strings, seed, grammar, draft method and size, repetition
                stop, answer store); ``None``: the defaults.
            changes: options as keywords (``max_new_tokens=64``), applied over
                ``options``; an unknown keyword is a ``TypeError``.

        Prompt, documents and grammar are encoded and checked here, before the model is
        held, so bad input fails at the call; generation runs as the stream is read.
        """
        start = self._start(prompt, documents, options, changes)
        return GenerationStream(self.engine.lock, self.tokenizer, len(start.ids),
                                self._steps(start.request, start.ids),
                                TextStream(self.tokenizer, start.stop),
                                on_result=start.keep)

    def _start(self, prompt: Prompt, documents: Sequence[DraftDocument] | None,
               options: GenerationOptions | None, changes: dict[str, Any],
               engine: Engine | None = None) -> _Start:
        """A request's state from :meth:`stream`'s arguments, encoded and checked, to run
        on ``engine`` (None: this generator's; a batched engine for a scheduler, whose
        ``choose`` refuses a request that does not fit it)."""
        options = _options(options, changes)
        check_prompt(prompt)
        method = options.method or self.config.method
        ids = self.encode_prompt(prompt)
        fit_context(ids, self.context_window, self.model_name)  # room for an answer
        TextStream(self.tokenizer, list(options.stop))  # bad stop strings fail here
        constraint = None
        if options.grammar is not None:  # compiled (or a clear error) before the model is held
            constraint = compiler_for(self.tokenizer, self.logits_width).constraint(
                options.grammar)
        docs = self.encode_documents(documents) if documents is not None else None
        limit = min(options.max_new_tokens, self.context_window - len(ids))
        owner = engine or self.engine
        engine = owner.choose(len(ids), limit)  # runs the whole request
        engine.load_curve()  # before the stream holds the lock, which a probe takes
        store = options.answer_store
        drafter = self.drafter(ids, docs, method, options.num_draft,
                               answers=store.answers() if store is not None else (),
                               engine=engine)
        stats = GenerationStats(method=method, engine=engine.describe().name,
                                trie_build_s=drafter.build_s,
                                trie_tokens=drafter.trie.num_tokens,
                                draft_source=drafter.source,
                                num_documents=drafter.num_documents,
                                store_answers=drafter.num_answers)
        params = SamplingParams(options.temperature, options.top_p, options.top_k)
        rng = None
        if not params.greedy:
            rng = torch.Generator(device=self.model.device)
            rng.manual_seed(options.seed if options.seed is not None else torch.seed())
        repeat_n = options.repetition_stop
        request = _Request(engine, owner, drafter, params, rng, limit, stats,
                           constraint=constraint,
                           repeats=RepetitionStop(repeat_n) if repeat_n else None)
        keep = None if store is None else (  # the finished answer joins its scope's store
            lambda result: store.add(answer_tokens(result.token_ids, self.eos_token_ids)))
        return _Start(request, ids, list(options.stop), keep)

    # ---- the loop -------------------------------------------------------------------
    @torch.inference_mode()
    def _steps(self, req: _Request, ids: list[int]) -> Iterator[Step]:
        """Yields ``(new tokens, finish reason or None, stats)`` after every step."""
        try:
            yield self._prefill(req, ids)
            while req.finish is None:
                yield self._step(req)
        finally:  # finished or closed: the next request may run on another thread
            openmp_team.release()

    def _prefill(self, req: _Request, ids: list[int]) -> Step:
        start = time.perf_counter()
        kv, logits = req.engine.prefill(ids, req.limit)
        return self._prefilled(req, kv, logits, start)

    def _prefilled(self, req: _Request, kv: KV, logits: torch.Tensor, start: float) -> Step:
        """The first token after a prompt cached in ``kv`` (``logits`` (V,) after its last
        token; ``start``: when caching it began, what ``prefill_s`` counts from)."""
        req.kv = kv
        req.stats.prefix_reused = req.kv.reused
        req.stats.engine = req.kv.ran_on or req.stats.engine
        req.stats.threads_used = req.kv.threads_used  # CPU threads -> steps, as they run
        if req.constraint is not None:
            logits = req.constraint.apply(logits.unsqueeze(0), req.constraint.bitmasks(
                -1, DraftTree.empty()), req.params.greedy)[0]
        token = choose(logits, req.params, req.rng)
        if req.constraint is not None:
            req.constraint.advance([token])
        req.stats.prefill_s = time.perf_counter() - start
        req.decode_start = time.perf_counter()
        req.drafter.update([token])
        return self._emit(req, [token], None)

    def _step(self, req: _Request) -> Step:
        """One step of one request: plan, its own forward, settle."""
        plan = self._plan(req)
        if not isinstance(plan, _Plan):
            return plan
        engine, tree = req.engine, plan.tree
        inputs = engine.prepare(req.kv, req.last, tree)
        forward_start = time.perf_counter()
        req.stats.draft_s += forward_start - plan.start
        logits = engine.run(req.kv, inputs)
        # On an accelerator the forward is still running: the host work in _settle
        # that does not need its result runs before acceptance waits for it.
        return self._settle(
            req, plan, logits, forward_start,
            accept=lambda rows: engine.accept(inputs, tree, rows, req.params, req.rng),
            commit=lambda path: engine.commit(req.kv, inputs, path))

    def _batch_step(self, reqs: Sequence[_Request], engine: BatchedEngine,
                    cap: int | None = None, lock: threading.Lock | None = None,
                    shares: TreeShares | None = None) -> list[Step]:
        """One step of every request in ``reqs`` (rows of ``engine``): each drafts as
        :meth:`_step` does (trees at most ``cap`` nodes; with ``shares``, each tree then
        cut to the nodes that pay in this batch, see :mod:`~.drafting.batch_trees`),
        then ONE forward verifies all rows (under ``lock``, when given), then each row
        settles as in :meth:`_step` (its own constraint, acceptance, cut, stats), and
        the accepted paths are compacted together. Returns each request's step, in
        order."""
        out: list[Step | None] = [None] * len(reqs)
        planned: list[tuple[int, _Request, _Plan]] = []
        for i, req in enumerate(reqs):
            plan = self._plan(req, cap)
            if isinstance(plan, _Plan):
                req.stats.draft_s += time.perf_counter() - plan.start
                planned.append((i, req, plan))
            else:
                out[i] = plan  # closed by its grammar: no forward
        sharing = shares is not None and len(planned) > 1
        if sharing:
            kept = shares.lengths([_chances(r, p.tree) for _, r, p in planned])
            planned = [(i, r, replace(p, tree=p.tree.top(k)))
                       for (i, r, p), k in zip(planned, kept, strict=True)]
        if planned:
            with lock if lock is not None else contextlib.nullcontext():
                forward_start = time.perf_counter()
                row_steps, logits = engine.run_batch(
                    [(r.kv, r.last, p.tree) for _, r, p in planned])
                seconds = time.perf_counter() - forward_start
                if sharing:
                    shares.observe([len(p.tree) for _, _, p in planned], seconds)
                commits: list = []
                for (i, req, plan), row, rows in zip(planned, row_steps, logits, strict=True):
                    out[i] = self._settle(
                        req, plan, rows, forward_start, seconds=seconds,
                        accept=functools.partial(engine.accept, row, plan.tree,
                                                 params=req.params, generator=req.rng),
                        commit=functools.partial(_append_commit, commits, req.kv, row))
                engine.commit_all(commits)
        return out  # type: ignore[return-value]

    def _plan(self, req: _Request, cap: int | None = None) -> _Plan | Step:
        """A step's first phase: the draft (at most ``cap`` nodes), or the grammar's
        closing tokens when the structure must be closed now (a finished step)."""
        start = time.perf_counter()
        room = req.limit - req.produced  # tokens left before the limit
        if req.constraint is not None:  # keep room to close the structure at the limit
            closing = self._closing(req, room)
            if closing is not None:
                return self._close(req, closing, "length")
            room -= req.reserve
        # the bonus token needs a place too; some RoPE variants cap the depth
        tree = self._draft(req, min(room - 1, req.engine.depth_room(req.kv.length)), cap)
        return _Plan(tree, room, start)

    def _settle(self, req: _Request, plan: _Plan, logits: torch.Tensor,
                forward_start: float, *, accept: Callable[[torch.Tensor], _Accepted],
                commit: Callable[[list[int]], None], seconds: float | None = None) -> Step:
        """A step's last phase, once the forward is under way: the constraint's masks on
        this request's logits (1 + N, V), acceptance, compaction, the cut at the limit
        or an EOS, stats, learning, the emitted step. ``seconds``: the forward's cost
        when it was shared with other requests (then the draft budget does not learn a
        single forward's cost from it); None: timed here."""
        host_s = 0.0  # host work in the forward's shadow, not the forward's cost
        if req.constraint is not None:  # each node's row: what its own path lets follow
            masks_start = time.perf_counter()
            allowed = req.constraint.bitmasks(req.last, plan.tree)
            host_s = time.perf_counter() - masks_start
            req.stats.draft_s += host_s
            logits = req.constraint.apply(logits, allowed, req.params.greedy)
        tokens, path = accept(logits)
        shared = seconds is not None
        if seconds is None:
            seconds = time.perf_counter() - forward_start - host_s
        commit(path)
        tokens, finish = self._cut(tokens[:plan.room])  # a drafter may overshoot the limit
        req.stats.draft_sizes.append(len(plan.tree))
        req.stats.accept_lengths.append(len(tokens))
        req.stats.last_forward_s = seconds
        req.drafter.update(tokens, None if shared else seconds)
        if req.constraint is not None:
            req.constraint.advance(tokens)
        return self._emit(req, tokens, finish)

    def _closing(self, req: _Request, room: int) -> list[int] | None:
        """The closing tokens when the structure must be closed now, else None (with
        ``req.reserve`` refreshed near the limit). A step emits at most ``num_draft + 1``
        tokens, so the closing length is re-read only within that of the limit; where no
        closing fits the room, nothing is kept back and the answer may end cut."""
        if req.produced > 1 and room > req.reserve + self.config.num_draft + 8:
            return None
        closing = req.constraint.closing(room)
        req.reserve = len(closing) if closing else 0
        return closing if closing and len(closing) >= room else None

    def _close(self, req: _Request, closing: list[int], why: FinishReason) -> Step:
        """End the answer with the grammar's closing tokens (see
        :mod:`~ngram_trie_rag.decoding.grammar_closing`), after every held-back token."""
        tokens: list[int] = []
        if req.repeats is not None:
            tokens, _ = req.repeats.emit([], why, req.stats)
        req.stats.closed_by, req.stats.closed_at = why, req.produced
        req.produced += len(closing)
        req.finish = why
        req.stats.decode_s = time.perf_counter() - req.decode_start
        return tokens + closing, why, req.stats

    def _draft(self, req: _Request, room: int, cap: int | None = None) -> DraftTree:
        """The trie's draft; under a grammar that forces the next tokens, those tokens
        (certain to be accepted) instead, and the drafter just learns what follows.
        With drafting off (``method="none"``) every step stays one token. ``cap``: the
        most nodes (a batch's share, see :mod:`~ngram_trie_rag.engine.batched.draft_cap`;
        0: a plain step); None: the drafter's own budget alone."""
        if cap == 0:
            return DraftTree.empty()
        if req.constraint is not None and req.drafter.method != "none":
            forced = req.constraint.forced(room if cap is None else min(room, cap))
            if forced:
                req.stats.forced_tokens += len(forced)
                return DraftTree.chain(forced)
        tree = req.drafter.propose(room)
        return tree if cap is None or len(tree) <= cap else tree.top(cap)

    def _cut(self, tokens: list[int]) -> tuple[list[int], FinishReason | None]:
        """An accepted EOS ends the answer: what follows it is dropped."""
        for i, t in enumerate(tokens):
            if t in self.eos_token_ids:
                return tokens[: i + 1], "eos"
        return tokens, None

    def _emit(self, req: _Request, tokens: list[int], finish: FinishReason | None) -> Step:
        req.produced += len(tokens)
        req.last = tokens[-1]
        if finish is None and tokens[-1] in self.eos_token_ids:
            finish = "eos"
        if finish is None and req.produced >= req.limit:
            finish = "length"
        if req.repeats is not None:  # only tokens no later cut can remove leave
            tokens, finish = req.repeats.emit(tokens, finish, req.stats)
            if finish == "repetition" and req.constraint is not None:
                tokens = tokens + self._close_after_cut(req)
        req.finish = finish
        if finish is not None and req.drafter.budget is not None:  # the steps' timings live on
            req.engine.refine_curve(req.drafter.budget.refined())
        if finish is not None:
            req.owner.finished()
        req.stats.decode_s = time.perf_counter() - req.decode_start
        return tokens, finish, req.stats


    def _close_after_cut(self, req: _Request) -> list[int]:
        """The closing tokens after a repetition cut: the grammar's state goes back to
        the kept answer, then the structure is closed within the limit (nothing when it
        cannot be)."""
        kept = req.repeats.tokens
        req.constraint.restart(kept)
        closing = req.constraint.closing(req.limit - len(kept))
        if closing:
            req.stats.closed_by, req.stats.closed_at = "repetition", len(kept)
        return closing or []


def _options(options: GenerationOptions | None, changes: dict[str, Any]) -> GenerationOptions:
    """``options`` with keyword ``changes`` over it (each checked once, where it is made)."""
    if options is None:
        return options_from(**changes)
    if not isinstance(options, GenerationOptions):
        raise TypeError("options must be a GenerationOptions, got "
                        f"{type(options).__name__} (pass keywords for single options)")
    return options.with_changes(**changes) if changes else options


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """The ids ``generate`` stops on: the generation config's, else the config's/tokenizer's."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    return frozenset()


def _draft_config(kwargs: dict[str, Any]) -> DraftConfig:
    """The drafter's settings from ``from_pretrained``'s remaining keywords, refusing any
    that neither the drafter nor ``from_pretrained`` reads."""
    from .loading import LOADER_KEYS

    known = {f.name for f in fields(DraftConfig)}
    unknown = set(kwargs) - known
    if unknown:
        raise TypeError(unknown_keywords("keyword(s)", unknown, known | LOADER_KEYS))
    return DraftConfig(**kwargs)

"""Speculative generation: prefill, then draft -> verify the tree in one pass -> accept.

Per step (the committed sequence has ``past`` tokens in the KV cache and one pending
token ``last`` whose keys are not yet cached):

    tree   = proposer(trie, tail, num_draft)            # N draft nodes, maybe none
    logits = model([last] + tree, pos = past + depth,   # (1 + N, V), one forward
                   mask = prefix + ancestors only)
    tokens = accept(tree, logits)                       # accepted path + bonus token
    cache  = compact(cache, keep = [last] + path)       # drop rejected branches
    trie.extend(tokens)                                 # learn from the answer

A step with no draft is a plain decode step. Greedy output is token-identical to
``model.generate(do_sample=False)``; sampling is distribution-preserving (sampling.py).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import gqa_attention, latency_store, llama_step
from .budget import DraftBudget
from .draft_tree import DraftTree
from .forward import forward
from .kv_cache import cache_kwargs, compact, new_cache
from .latency import LatencyCurve, curve_holds, latency_curve
from .linear_layout import Layout
from .proposers import PROPOSERS
from .result import FinishReason, GenerationResult, GenerationStats
from .sampling import SamplingParams, accept, choose
from .text_stream import TextStream
from .tree_attention import tree_inputs
from .trie import NGramTrie

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]
_LATENCY_CURVES: dict[tuple, LatencyCurve] = {}  # per process, see _forward_costs
Document = str | Sequence[int]


@dataclass(frozen=True)
class DraftConfig:
    """Drafting hyper-parameters (paper names): window n, max prefix L_p, num_draft."""

    n: int = 13
    prefix_len: int = 3
    num_draft: int = 32  # the most nodes verified per step (the budget's cap when adaptive)
    method: str = "trie"  # "trie" (paper), "backoff", "chain" (prompt lookup), "none"
    adaptive: bool = True  # choose num_draft per step from latency and acceptance
    max_trie_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        if self.num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {self.num_draft}")
        if self.prefix_len < 1:
            raise ValueError(f"prefix_len (L_p) must be >= 1, got {self.prefix_len}")
        if self.n <= self.prefix_len:
            raise ValueError(
                f"n must be greater than prefix_len (L_p): n={self.n}, L_p={self.prefix_len}"
            )
        if self.method not in PROPOSERS:
            raise ValueError(f"unknown draft method {self.method!r}; use one of {list(PROPOSERS)}")


class SpeculativeGenerator:
    """N-gram trie speculative decoding for a Hugging Face causal LM.

    Thread-safe: calls are serialised on an internal lock (one KV cache per call).
    """

    def __init__(self, model, tokenizer, config: DraftConfig | None = None,
                 name: str | None = None, **draft_kwargs: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or DraftConfig(**draft_kwargs)
        self.model_name = name or getattr(model.config, "_name_or_path", "") or "model"
        self.context_window = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.sliding_window = _sliding_window(model.config)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._masked_gqa = gqa_attention.applies(model)  # CPU + SDPA + GQA: no repeat_kv
        # Steps without module dispatch where the structure allows; None: the modules.
        self.step = llama_step.for_model(model) if llama_step.applies(model) else None
        self._budget: DraftBudget | None = None
        self._costs: LatencyCurve | None = None
        # One lock per model, shared by every generator over it (they share weights and
        # compute). A plain Lock, not an RLock: a stream may be advanced from different
        # threads (e.g. asyncio.to_thread per chunk), and only a Lock can be released
        # by another thread.
        self._lock = _model_lock(model)
        self._tokenizer_lock = threading.Lock()  # fast tokenizers are not re-entrant

    @property
    def busy(self) -> bool:
        """True while a generation holds the model."""
        return self._lock.locked()

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device: str | None = None,
                        dtype: str | torch.dtype | None = None,
                        **draft_kwargs: Any) -> SpeculativeGenerator:
        """Load a local model folder (or the packaged default) and wrap it."""
        from .loading import DEFAULT_MODEL_NAME, load_model

        model, tokenizer = load_model(path, device=device, dtype=dtype)
        return cls(model, tokenizer, name=str(path) if path else DEFAULT_MODEL_NAME,
                   **draft_kwargs)

    # ---- inputs ---------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Prompt -> token ids: a string as-is, chat messages via the chat template."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            with self._tokenizer_lock:
                return list(self.tokenizer(_valid_text(prompt, "prompt"))["input_ids"])
        items = list(prompt)
        if not items:
            raise ValueError("prompt is empty")
        if all(isinstance(m, dict) for m in items):
            return self._apply_chat_template(items)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            vocab = self.model.config.vocab_size
            bad = [t for t in items if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
            return items
        raise TypeError("prompt must be a string, a list of chat messages, or a list of token ids")

    def _apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.model_name} has no chat template; pass a string prompt")
        for m in messages:
            if "role" not in m or "content" not in m:
                raise ValueError(f"chat messages need 'role' and 'content', got keys {sorted(m)}")
            if isinstance(m["content"], str):
                _valid_text(m["content"], "a chat message")
        with self._tokenizer_lock:
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def encode_documents(self, documents: Sequence[Document]) -> list[list[int]]:
        """Documents -> token ids. Documents are only drafted from, never fed to the
        model, so any length is accepted (the trie's ``max_trie_tokens`` bound applies)."""
        if isinstance(documents, str):
            raise TypeError("documents must be a list of strings or token-id lists, not a string")
        texts = [d for d in documents if isinstance(d, str)]
        for i, d in enumerate(documents):
            if isinstance(d, str) and not d.strip():
                raise ValueError(f"document {i} is empty or whitespace")
            if isinstance(d, str):
                _valid_text(d, f"document {i}")
            if not isinstance(d, str) and len(d) == 0:
                raise ValueError(f"document {i} has no tokens")
        with self._tokenizer_lock:
            encoded = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"]
                           if texts else [])
        return [list(next(encoded)) if isinstance(d, str) else list(d) for d in documents]

    # ---- public API -----------------------------------------------------------------
    def generate(self, prompt: Prompt, documents: Sequence[Document] | None = None,
                 **options: Any) -> GenerationResult:
        """Generate a full answer. Options: see :meth:`stream`."""
        stream = self.stream(prompt, documents, **options)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(self, prompt: Prompt, documents: Sequence[Document] | None = None, *,
               max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, stop: Sequence[str] | str | None = None,
               seed: int | None = None, num_draft: int | None = None,
               method: str | None = None) -> GenerationStream:
        """Text deltas as they are verified; ``.result`` once exhausted.

        Args:
            prompt: a string (tokenised as-is), chat messages (chat template applied),
                or token ids.
            documents: texts or token ids to draft from (e.g. the retrieved chunks);
                ``None`` drafts from the prompt itself. The answer is always added.
            max_new_tokens: upper bound on new tokens (generation also stops at the
                model's context window, with finish reason ``length``).
            stop: stop strings; the text ends before the first one (not emitted).
            num_draft: pin the number of verified draft nodes for this call (by default
                it adapts per step, up to ``config.num_draft``).
            method: ``"trie"``, ``"backoff"``, ``"chain"`` or ``"none"`` for this call.
        """
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if num_draft is not None and num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {num_draft}")
        if method is not None and method not in PROPOSERS:
            raise ValueError(f"unknown draft method {method!r}; use one of {list(PROPOSERS)}")
        params = SamplingParams(temperature, top_p, top_k)
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        ids = self.encode_prompt(prompt)
        if len(ids) >= self.context_window:
            raise ValueError(f"prompt has {len(ids)} tokens; the context window of "
                             f"{self.model_name} is {self.context_window}")
        docs = self.encode_documents(documents) if documents is not None else None
        text = TextStream(self.tokenizer, stops)
        costs = self._forward_costs()
        budget = self._draft_budget() if num_draft is None and self.config.adaptive else None
        steps = self._steps(ids, docs, max_new_tokens, params, seed,
                            num_draft or self.config.num_draft, method or self.config.method,
                            budget, costs)
        return GenerationStream(self, ids, steps, text)

    def _draft_budget(self) -> DraftBudget:
        """The adaptive budget over this model's latency curve."""
        if self._budget is None:
            self._budget = DraftBudget(dict(self._forward_costs().seconds),
                                       self.config.num_draft)
        return self._budget

    def _forward_costs(self) -> LatencyCurve:
        """This model's latency curve and the faster linear layout per forward size.

        One per process for each (architecture and size, dtype, device, threads),
        shared by every load of the same model and refined online by the budget. It
        comes from disk when re-timing a plain step and a draft confirms the stored
        curve (about a second), else it is measured -- fifteen to twenty-five seconds on
        two cores -- and stored (:mod:`ngram_trie_rag.latency_store`).
        """
        if self._costs is None:
            model, dev = self.model, self.model.device
            cfg = model.config
            key = (type(model).__name__, cfg.model_type, model.num_parameters(),
                   str(model.dtype), str(dev), torch.get_num_threads(),
                   cfg.num_hidden_layers, cfg.hidden_size, self.step is not None)
            if key not in _LATENCY_CURVES:
                # Measure with the model to ourselves when we can get it; a thread that
                # already holds it (an unfinished stream of its own) must not deadlock.
                held = self._lock.acquire(timeout=10)
                try:
                    _LATENCY_CURVES[key] = self._stored_or_measured(key)
                finally:
                    if held:
                        self._lock.release()
            self._costs = _LATENCY_CURVES[key]
        return self._costs

    def _stored_or_measured(self, key: tuple) -> LatencyCurve:
        """The stored curve of ``key`` if it still holds on this machine now, else a
        fresh measurement, stored for the next process."""
        setting = {"packed_gqa": self._masked_gqa, "sliding_window": self.sliding_window,
                   "step": self.step}
        stored = latency_store.load(key)
        if stored is not None and curve_holds(self.model, stored, **setting):
            return stored
        curve = latency_curve(self.model, **setting)
        latency_store.save(key, curve)
        return curve

    # ---- the loop -------------------------------------------------------------------
    def build_trie(self, ids: list[int], docs: list[list[int]] | None,
                   stats: GenerationStats | None = None) -> NGramTrie:
        """The trie a call drafts from: the documents (each its own document) plus an
        empty answer document, or the prompt continued by the answer."""
        stats = stats if stats is not None else GenerationStats()
        start = time.perf_counter()
        cfg = self.config
        trie = NGramTrie(cfg.n, cfg.prefix_len, cfg.max_trie_tokens)
        if docs:
            for d in docs:
                trie.add_document(d)
            trie.add_document([])  # the answer is a document of its own
            stats.draft_source, stats.num_documents = "documents", len(docs)
        else:
            trie.add_document(ids)  # the answer continues the prompt
        stats.trie_build_s = time.perf_counter() - start
        stats.trie_tokens = trie.num_tokens
        return trie

    @torch.inference_mode()
    def _steps(self, ids: list[int], docs: list[list[int]] | None, max_new_tokens: int,
               params: SamplingParams, seed: int | None, num_draft: int, method: str,
               budget: DraftBudget | None, costs: LatencyCurve,
               ) -> Iterator[tuple[list[int], FinishReason | None, GenerationStats]]:
        """Yields ``(new tokens, finish reason or None, stats)`` after every step.

        With a ``budget``, ``num_draft`` ranked candidates are drafted, the budget picks
        how many of them to verify, and the step's outcome updates the budget. ``costs``
        says which linear layout each forward size runs in.
        """
        model, device = self.model, self.model.device
        stats = GenerationStats(method=method)
        propose = PROPOSERS[method]
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else torch.seed())
        limit = min(max_new_tokens, self.context_window - len(ids))
        trie = self.build_trie(ids, docs, stats)
        lp = self.config.prefix_len

        start = time.perf_counter()
        cache = new_cache()
        out = model(input_ids=torch.tensor([ids], device=device), **cache_kwargs(model, cache),
                    use_cache=True, logits_to_keep=1)
        token = choose(out.logits[0, -1], params, gen)
        stats.prefill_s = time.perf_counter() - start
        decode_start = time.perf_counter()
        history = ids + [token]  # prompt + answer, for the match tail
        produced = 1
        trie.extend([token])
        finish = self._finish([token], produced, limit)
        yield [token], finish, stats
        while finish is None:
            past = len(history) - 1
            t0 = time.perf_counter()
            tree = propose(trie, history[-lp:], num_draft, limit - produced - 1)
            candidates = tree
            if budget is not None and len(tree):
                tree = candidates.top(budget.choose(candidates))
            packed = costs.packed(1 + len(tree), self._masked_gqa)
            tokens, finish = self._verify(tree, history[-1], past, limit - produced, params,
                                          gen, cache, stats, t0, costs.layout(1 + len(tree)),
                                          packed)
            if budget is not None:
                budget.record_latency(1 + len(tree), stats.last_forward_s)
                budget.observe(candidates, tokens)
            produced += len(tokens)
            history.extend(tokens)
            trie.extend(tokens)
            finish = finish or self._finish(tokens, produced, limit)
            stats.decode_s = time.perf_counter() - decode_start
            yield tokens, finish, stats

    def _verify(self, tree: DraftTree, last: int, past: int, room: int,
                params: SamplingParams, gen: torch.Generator | None, cache,
                stats: GenerationStats, t0: float, layout: Layout,
                packed: bool) -> tuple[list[int], FinishReason | None]:
        """One forward over [last] + tree; returns the emitted tokens: cut at EOS and at
        ``room``, the tokens left before the limit (a drafter may overshoot it).
        ``layout`` and ``packed`` pick the linear layout and the GQA attention
        (packed for every draft; for a plain step where it measured faster)."""
        device = self.model.device
        input_ids = torch.tensor([[last, *tree.tokens.tolist()]], device=device)
        if len(tree):
            pos, mask = tree_inputs(tree, past, device, self.model.dtype, self.sliding_window)
        else:
            pos, mask = torch.tensor([[past]], device=device), None
        t1 = time.perf_counter()
        stats.draft_s += t1 - t0
        logits = forward(self.model, self.step, input_ids, pos, mask, cache, layout, packed)
        tokens, path = accept(tree, logits, params, gen)  # syncs with the device
        stats.last_forward_s = time.perf_counter() - t1
        if len(tree):
            compact(cache, past, [0, *path])
        tokens = tokens[:room]
        finish: FinishReason | None = None
        for i, t in enumerate(tokens):
            if t in self.eos_token_ids:  # an accepted EOS ends the answer: drop what follows
                tokens, finish = tokens[: i + 1], "eos"
                break
        stats.draft_sizes.append(len(tree))
        stats.accept_lengths.append(len(tokens))
        return tokens, finish

    def _finish(self, tokens: list[int], produced: int, limit: int) -> FinishReason | None:
        if tokens and tokens[-1] in self.eos_token_ids:
            return "eos"
        return "length" if produced >= limit else None


class GenerationStream:
    """Iterator of text deltas; holds the generator's lock while it runs.

    ``result`` is set once the stream is exhausted. ``close()`` (or leaving a ``with``
    block) stops generation early and releases the lock and the KV cache.
    """

    def __init__(self, owner: SpeculativeGenerator, prompt_ids: list[int],
                 steps: Iterator, text: TextStream) -> None:
        self._owner = owner
        self._prompt_ids = prompt_ids
        self._steps = steps
        self._text = text
        self._tokens: list[int] = []
        self._locked = False
        self._done = False
        self.result: GenerationResult | None = None

    def __iter__(self) -> GenerationStream:
        return self

    def __del__(self) -> None:
        # An abandoned stream must not keep the model locked until interpreter exit.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        if not self._locked:
            self._owner._lock.acquire()
            self._locked = True
        try:
            return self._advance()
        except BaseException:
            self.close()
            raise

    def _advance(self) -> str:
        while True:
            tokens, finish, stats = next(self._steps)
            before = len(self._tokens)
            self._tokens.extend(tokens)
            delta = self._text.push(self._tokens)
            if self._text.stopped:
                self._tokens = self._trim_to_stop(before)
                finish = "stop"
            if finish is not None:
                delta += self._text.finish()
                self.result = GenerationResult(self._text.text, self._tokens, finish,
                                               len(self._prompt_ids), stats)
                self.close()
                return delta
            if delta:
                return delta

    def _trim_to_stop(self, before: int) -> list[int]:
        """Token ids up to the one that completed the stop string."""
        tok = self._owner.tokenizer
        for end in range(before + 1, len(self._tokens) + 1):
            text = tok.decode(self._tokens[:end], skip_special_tokens=True)
            if any(s in text for s in self._text._stop):
                return self._tokens[:end]
        return self._tokens

    def close(self) -> None:
        """Stop early; frees the KV cache and releases the lock. Idempotent."""
        if self._done:
            return
        self._done = True
        self._steps.close()
        if self._locked:
            self._locked = False
            self._owner._lock.release()


_MODEL_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()


def _model_lock(model) -> threading.Lock:
    """The lock serialising generation on ``model`` (one per model object)."""
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.Lock()
        return lock


def _valid_text(text: str, what: str) -> str:
    """Reject strings that cannot be encoded (lone surrogates) with a clear message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text ({exc.reason} at character "
                         f"{exc.start})") from None
    return text


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """The ids ``generate`` stops on: the generation config's, else the config's/tokenizer's."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    return frozenset()


def _sliding_window(config) -> int | None:
    """The window of sliding-attention layers for hybrid models (e.g. Gemma 3)."""
    layer_types = getattr(config, "layer_types", None) or ()
    if "sliding_attention" in layer_types:
        return int(config.sliding_window)
    return None

"""Grammar-constrained decoding (JSON schema, JSON, regex, EBNF) with xgrammar, under
tree verification.

Constrained greedy decoding takes, at every step, the argmax over the tokens the
grammar allows after the tokens so far. Speculation keeps that exactly: each node of the
draft tree gets the mask of the grammar state *after its own path*, its logits row is
masked with it, and the usual walk (:func:`ngram_trie_rag.engine.acceptance.host_walk`) accepts the
longest path of masked-argmax matches plus a bonus token. xgrammar fills every node's
mask in one call (``GrammarMatcher.traverse_draft_tree``) and restores the matcher;
afterwards the matcher advances by the tokens the step emitted.

Tokens the grammar forces (one allowed token) are certain: :meth:`Constraint.forced`
returns them so they can be drafted; verification accepts them at no risk.

Pitfalls this module handles: the chat template's added special tokens (``<|im_start|>``)
are not marked special in some tokenizers and would be allowed inside JSON strings, so
every added token except the end-of-sequence ones is banned; a node the grammar rejects
leaves its descendants' rows untouched, so the bitmask is zeroed first; compiling costs
milliseconds to seconds per schema, so compiled grammars are cached per tokenizer.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..drafting import DraftTree
from ..util.optional import require
from .grammar_closing import ClosingVocab, closing

KINDS = ("json_schema", "json", "regex", "ebnf")


@dataclass(frozen=True)
class Grammar:
    """What the answer must match. Build with :meth:`json_schema`, :meth:`json`,
    :meth:`regex` or :meth:`ebnf`; ``source`` is the schema (JSON text), pattern or
    grammar."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}; expected one of {KINDS}")

    @classmethod
    def json_schema(cls, schema: dict | str | type) -> Grammar:
        """A JSON schema (dict or JSON text) or a Pydantic model class."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, dict):
            schema = json.dumps(schema)  # key order kept: it is the properties' order
        if not isinstance(schema, str):
            raise TypeError("a JSON schema must be a dict, JSON text or a Pydantic model, "
                            f"got {type(schema).__name__}")
        return cls("json_schema", schema)

    @classmethod
    def json(cls) -> Grammar:
        """Any valid JSON value (JSON mode)."""
        return cls("json")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> Grammar:
        """A GBNF/EBNF grammar with a ``root`` rule."""
        return cls("ebnf", grammar)


def _xgrammar() -> Any:
    return require("xgrammar", "constrained decoding", "xgrammar",
                   "pip install 'ngram-trie-rag[structured]'")


class GrammarCompiler:
    """Compiles grammars for one tokenizer and vocabulary size; thread-safe, cached."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_cached: int = 64) -> None:
        xgr = _xgrammar()
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(self.info, cache_enabled=True)
        self._cache: OrderedDict[Grammar, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.max_cached = max_cached
        stops = set(self.info.stop_token_ids)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.banned = sorted(i for i in added if i not in stops and i < vocab_size)
        self._closing_vocab: ClosingVocab | None = None

    @property
    def closing_vocab(self) -> ClosingVocab:
        """What closing an answer early chooses from (built on first use, ~0.1 s)."""
        with self._lock:
            if self._closing_vocab is None:
                special = [*self.banned, *self.info.stop_token_ids]
                self._closing_vocab = ClosingVocab(self.info.decoded_vocab[:self.vocab_size],
                                                   special)
            return self._closing_vocab

    def compile(self, grammar: Grammar) -> Any:
        """The compiled grammar (cached); a ValueError says why one cannot compile."""
        with self._lock:
            hit = self._cache.get(grammar)
            if hit is not None:
                self._cache.move_to_end(grammar)
                return hit
        try:
            compiled = self._compile(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"cannot compile the {grammar.kind} grammar: {exc}") from exc
        with self._lock:
            self._cache[grammar] = compiled
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, grammar: Grammar) -> Any:
        c = self._compiler
        if grammar.kind == "json_schema":
            return c.compile_json_schema(grammar.source, any_whitespace=False)
        if grammar.kind == "json":
            return c.compile_builtin_json_grammar()
        if grammar.kind == "regex":
            return c.compile_regex(grammar.source)
        return c.compile_grammar(grammar.source)

    def constraint(self, grammar: Grammar) -> Constraint:
        return Constraint(self.compile(grammar), self.vocab_size, self.banned,
                          lambda: self.closing_vocab)


_COMPILERS: dict[tuple[int, int], GrammarCompiler] = {}
_COMPILERS_LOCK = threading.Lock()


def compiler_for(tokenizer: Any, vocab_size: int) -> GrammarCompiler:
    """One compiler (and cache) per tokenizer object and vocabulary size."""
    key = (id(tokenizer), vocab_size)
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(key)
        if compiler is None:
            compiler = _COMPILERS[key] = GrammarCompiler(tokenizer, vocab_size)
        return compiler


class Constraint:
    """One request's grammar state: masks for a draft tree, then the tokens it took."""

    def __init__(self, compiled: Any, vocab_size: int, banned: Iterable[int] = (),
                 closing_vocab: Callable[[], ClosingVocab] | None = None) -> None:
        xgr = _xgrammar()
        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self._closing_vocab = closing_vocab
        self.vocab_size = vocab_size
        self._banned = torch.tensor(sorted(banned), dtype=torch.long)
        self._bits = torch.arange(32, dtype=torch.int32)
        self._next_fill: torch.Tensor | None = None  # what may follow now, once filled

    def masks(self, last: int, tree: DraftTree) -> torch.Tensor:
        """(1 + N, V) bool: row 0 allows what may follow the committed tokens, row
        ``i + 1`` what may follow node ``i``'s path (all False for a node the grammar
        rejects, which the walk can never reach)."""
        return self._unpack(self.bitmasks(last, tree))

    def bitmasks(self, last: int, tree: DraftTree) -> torch.Tensor:
        """:meth:`masks` packed: (1 + N, ceil(V / 32)) int32, bit ``t % 32`` of word
        ``t // 32`` set when token ``t`` is allowed (banned tokens not yet cleared)."""
        n = len(tree)
        if n == 0:
            return self._committed_fill()
        bitmask = self._xgr.allocate_token_bitmask(1 + n, self.vocab_size)
        bitmask.zero_()
        first, sibling = _retrieve_arrays(tree)
        tokens = torch.cat([torch.tensor([last]), torch.as_tensor(tree.tokens)]).long()
        self.matcher.traverse_draft_tree(first, sibling, tokens, bitmask)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, greedy: bool) -> torch.Tensor:
        """Logits (R, V) with what row ``r``'s mask forbids at -inf, as far as the
        choice needs it.

        Sampling needs every forbidden token gone. Greedy decoding needs only the
        argmax right: where a row's unmasked argmax is allowed it is also the masked
        argmax (argmax takes the first maximum, and masking only removes candidates),
        so only the other rows are unpacked and masked. Under a grammar most rows'
        argmax is allowed, which saves unpacking R x V bits on most steps.
        """
        if not greedy:
            return logits.masked_fill(~self._unpack(bitmask).to(logits.device), float("-inf"))
        top = logits.argmax(-1).cpu()  # (R,)
        bad = torch.nonzero(~self._allows(bitmask, top)).flatten()
        if not bad.numel():
            return logits
        allowed = self._unpack(bitmask[bad]).to(logits.device)  # (B, V)
        bad = bad.to(logits.device)
        logits = logits.clone()
        logits[bad] = logits[bad].masked_fill(~allowed, float("-inf"))
        return logits

    def _allows(self, bitmask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(R,) bool: whether row ``r`` of ``bitmask`` allows ``tokens[r]``."""
        rows = torch.arange(len(tokens))
        words = bitmask[rows, tokens >> 5]
        allowed = ((words >> (tokens & 31).int()) & 1).bool()
        if self._banned.numel():
            allowed &= ~torch.isin(tokens, self._banned)
        return allowed

    def _fill(self, matcher: Any) -> torch.Tensor:
        """(1, W) int32: what ``matcher`` allows next, packed."""
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        bitmask.zero_()
        matcher.fill_next_token_bitmask(bitmask, 0)
        return bitmask

    def _committed_fill(self) -> torch.Tensor:
        """:meth:`_fill` of the committed matcher, filled once per step: the forced-token
        walk and a plain step's mask both need it, and :meth:`advance` moves it on."""
        if self._next_fill is None:
            self._next_fill = self._fill(self.matcher)
        return self._next_fill

    def _unpack(self, bitmask: torch.Tensor) -> torch.Tensor:
        """(R, W) int32 words -> (R, V) bool, little-endian within a word, with the
        banned tokens cleared."""
        allowed = ((bitmask.unsqueeze(-1) >> self._bits) & 1).bool()
        allowed = allowed.reshape(bitmask.shape[0], -1)[:, :self.vocab_size]
        if self._banned.numel():
            allowed[:, self._banned] = False
        return allowed

    def advance(self, tokens: Sequence[int]) -> None:
        """The tokens a step emitted, in order (each was allowed by its mask)."""
        self._next_fill = None
        for tok in tokens:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(int(tok)):
                raise RuntimeError(f"token {tok} is not allowed by the grammar here")

    def closing(self, limit: int) -> list[int] | None:
        """At most ``limit`` tokens that complete the structure from the committed
        tokens (none when the grammar may end now), or None (see
        :mod:`~ngram_trie_rag.decoding.grammar_closing`). Found on a fork: nothing is committed."""
        if self._closing_vocab is None:
            return None
        return closing(self.matcher.fork(), self._fill,
                       self._closing_vocab(), self.matcher.stop_token_ids, limit)

    def restart(self, tokens: Sequence[int]) -> None:
        """Commit exactly ``tokens`` from the start (an answer cut back after its
        tokens were committed)."""
        self.matcher.reset()
        self.advance(tokens)

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces from here (one allowed token each),
        found on a fork of the matcher, so nothing is committed."""
        if limit < 1 or self.matcher.is_terminated():
            return []
        fork = self.matcher.fork()
        out: list[int] = []
        while len(out) < limit and not fork.is_terminated():
            fill = self._fill(fork) if out else self._committed_fill()  # fork == matcher
            ids = torch.nonzero(self._unpack(fill)[0]).flatten()
            if ids.numel() != 1:
                break
            tok = int(ids[0])
            if tok in self.matcher.stop_token_ids or not fork.accept_token(tok):
                break
            out.append(tok)
        return out


def _retrieve_arrays(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """xgrammar's tree layout over 1 + N nodes (0 = the committed token): each node's
    first child and next sibling, -1 for none. Pre-order keeps children in order."""
    n = len(tree)
    first = torch.full((1 + n,), -1, dtype=torch.long)
    sibling = torch.full((1 + n,), -1, dtype=torch.long)
    last_child: dict[int, int] = {}
    for i, parent in enumerate(tree.parents.tolist()):
        node, par = i + 1, parent + 1  # parent -1 (the committed token) -> node 0
        if par in last_child:
            sibling[last_child[par]] = node
        else:
            first[par] = node
        last_child[par] = node
    return first, sibling

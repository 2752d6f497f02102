"""Per-call generation options: one frozen object, checked once where it is made.

Every entry point builds a :class:`GenerationOptions` (the generator's keywords, each
framework wrapper's fields and per-call keywords, the command line, the OpenAI client) and
every layer below it trusts the object: nothing re-checks ``temperature`` on its way down.

``num_draft`` means one thing everywhere: the number of draft nodes verified per step,
pinned for this call. ``None`` lets the engine choose it per step from what drafts have
been accepted and what a wider verification costs, up to ``DraftConfig.num_draft``.
Backends that draft a chain per step (vLLM) take their width from their own
``num_speculative_tokens`` and refuse a pinned ``num_draft``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ..drafting.answer_store import check_answer_store
from ..drafting.config import check_method
from ..util.keywords import unknown_keywords
from ..validation import check_options
from .repetition import check_repetition_stop

if TYPE_CHECKING:
    from ..drafting import AnswerStore
    from .grammar import Grammar

DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class GenerationOptions:
    """What one call decodes, and how.

    Args:
        max_new_tokens: new tokens at most (the context window may end it sooner, with
            finish reason ``length``).
        temperature: 0 is greedy (token-identical to plain decoding); above 0 samples,
            with the model's distribution kept.
        top_p: nucleus filtering; 1.0 keeps every token.
        top_k: top-k filtering; 0 keeps every token.
        stop: stop strings; the text ends before the first one (not emitted).
        seed: the sampling seed; ``None`` draws one.
        grammar: a :class:`~ngram_trie_rag.decoding.grammar.Grammar` the answer must match.
        method: ``"trie"``, ``"backoff"``, ``"chain"`` or ``"none"``; ``None``: the
            generator's ``DraftConfig.method``.
        num_draft: draft nodes verified per step, pinned (see the module docstring).
        repetition_stop: an n-gram length n >= 2: the answer ends just before its first
            repeated n-gram (a prefix of what plain decoding makes).
        answer_store: an :class:`~ngram_trie_rag.drafting.AnswerStore` to also draft from;
            the finished answer joins it. Local engine only.
        names: the caller's spelling of each option, for error messages only (a
            LangChain user reads ``max_tokens``, the name they passed); not stored.
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    grammar: Grammar | None = None
    method: str | None = None
    num_draft: int | None = None
    repetition_stop: int | None = None
    answer_store: AnswerStore | None = None
    names: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, names: Mapping[str, str] | None) -> None:
        checked = check_options(
            names, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k, seed=self.seed, num_draft=self.num_draft,
            stop=() if self.stop is None else self.stop, method=self.method)
        # Stored as checked: plain Python numbers (NumPy ones pass the checks), a tuple.
        for name, value in checked.items():
            object.__setattr__(self, name, tuple(value) if name == "stop" else value)
        if self.method is not None:
            check_method(self.method)
        check_repetition_stop(self.repetition_stop)
        check_answer_store(self.answer_store)
        if self.grammar is not None:
            from .grammar import Grammar  # a grammar exists only once its module is loaded

            if not isinstance(self.grammar, Grammar):
                raise TypeError("grammar must be an ngram_trie_rag.decoding.grammar.Grammar, got "
                                f"{type(self.grammar).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_changes(self, names: Mapping[str, str] | None = None,
                     **changes: Any) -> GenerationOptions:
        """A copy with ``changes`` applied, checked as a new object."""
        unknown = sorted(set(changes) - OPTION_FIELDS)
        if unknown:
            raise TypeError(unknown_options(unknown, names))
        # None for an option that always has a value means "unchanged"
        changes = {k: v for k, v in changes.items() if v is not None or k in OPTIONAL}
        return replace(self, names=names, **changes)


# Options only the local engine honours: vLLM drafts with its own proposer settings.
LOCAL_ONLY = ("method", "num_draft", "repetition_stop", "answer_store")
OPTION_FIELDS = frozenset(f.name for f in fields(GenerationOptions))
OPTIONAL = frozenset(f.name for f in fields(GenerationOptions) if f.default is None)


def unknown_options(unknown: list[str], names: Mapping[str, str] | None = None) -> str:
    """The message for keywords that name no option, with the supported ones."""
    spelled = [(names or {}).get(name, name) for name in OPTION_FIELDS]
    return unknown_keywords("generation option(s)", unknown, spelled)


def options_from(names: Mapping[str, str] | None = None, **values: Any) -> GenerationOptions:
    """Options from keywords in the caller's spelling (``names``: core name -> caller's).

    ``None`` values mean "the default". An unknown keyword is a ``TypeError`` listing the
    supported ones: an option nobody reads is never silently dropped.
    """
    names = dict(names or {})
    core_of = {spelled: core for core, spelled in names.items()}
    given = {core_of.get(key, key): value for key, value in values.items()}
    unknown = sorted(key for key in values if core_of.get(key, key) not in OPTION_FIELDS)
    if unknown:
        raise TypeError(unknown_options(unknown, names))
    present = {k: v for k, v in given.items() if v is not None}
    return GenerationOptions(**present, names=names)

"""What a generation returns: text, token ids, finish reason and speculative stats."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "eos", "repetition"]


@dataclass
class GenerationStats:
    """Per-request counters. Accept length = tokens emitted by one verification step
    (accepted draft tokens + the bonus token); a plain decode step has accept length 1."""

    accept_lengths: list[int] = field(default_factory=list)  # per step after prefill
    draft_sizes: list[int] = field(default_factory=list)  # draft nodes verified, per step
    prefill_s: float = 0.0
    decode_s: float = 0.0  # everything after prefill (forward, drafting, bookkeeping)
    draft_s: float = 0.0  # drafting + tree mask building, inside decode_s
    trie_build_s: float = 0.0
    trie_tokens: int = 0
    draft_source: str = "prompt"  # "documents" or "prompt"
    num_documents: int = 0
    store_answers: int = 0  # earlier answers drafted from (an AnswerStore's), 0: none
    method: str = "trie"
    engine: str = ""  # the engine that ran the forwards (EngineInfo.name: eager, compiled, ...)
    last_forward_s: float = 0.0  # the latest verification forward (for the budget)
    forced_tokens: int = 0  # tokens a grammar forced (drafted with certainty)
    threads_used: dict[int, int] = field(default_factory=dict)  # CPU threads -> steps
    # An answer under a grammar that had to end early is closed so that it parses: why
    # ("length" or "repetition") and where (the index in token_ids of the first closing
    # token, which the grammar chose, not the model); None: not closed.
    closed_by: str | None = None
    prefix_reused: int = 0  # prompt tokens whose cache the previous request left (not prefilled)
    closed_at: int | None = None

    @property
    def steps(self) -> int:
        """Forward passes after prefill."""
        return len(self.accept_lengths)

    @property
    def drafted(self) -> int:
        """Draft nodes verified, summed over steps."""
        return sum(self.draft_sizes)

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(steps=self.steps, drafted=self.drafted,
                   mean_accept_length=self.mean_accept_length)
        return out


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # new tokens only; includes the EOS token when one ended it
    finish_reason: FinishReason
    prompt_tokens: int
    stats: GenerationStats

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

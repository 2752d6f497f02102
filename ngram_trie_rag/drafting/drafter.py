"""One request's drafter: its trie and draft budget behind two calls, propose and update.

In the spirit of transformers' candidate generator (``get_candidates`` /
``update_candidate_strategy``) and vLLM's proposer, the decode loop holds nothing of the
drafter but this object:

    drafter = Drafter.for_request(config, prompt, documents, budget=budget)
    drafter.update([first])                    # the token prefill chose
    while not done:
        tree = drafter.propose(room)           # DraftTree, empty: a plain step
        emitted = verify(tree)                 # accepted path + bonus token
        drafter.update(emitted, seconds)       # learn: trie, acceptance, latency

It needs no model, no torch and no generator, so a serving engine can keep one per
request (keyed by its request id) and call the same two methods.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .budget import DraftBudget
from .config import DraftConfig, check_method
from .draft_tree import DraftTree
from .proposers import PROPOSERS
from .trie import NGramTrie


class Drafter:
    """Drafts from an :class:`NGramTrie` and learns from every emitted token.

    Args:
        trie: the draft source, already holding the request's documents (or prompt).
        context: the committed sequence so far (the prompt): its last L_p tokens are
            the first match tail.
        method: a proposer of :data:`~ngram_trie_rag.drafting.proposers.PROPOSERS`.
        num_draft: candidates ranked per step (the cap; the verified tree size when
            there is no budget).
        budget: a :class:`DraftBudget` that picks how many candidates to verify and
            learns from each step; shared across requests that share hardware.
            ``None``: every step verifies up to ``num_draft`` nodes.
    """

    def __init__(self, trie: NGramTrie, context: Sequence[int], *, method: str = "trie",
                 num_draft: int = 32, budget: DraftBudget | None = None) -> None:
        if num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {num_draft}")
        self.trie = trie
        self.method = check_method(method)
        self.num_draft = num_draft
        self.budget = budget
        self._propose = PROPOSERS[method]
        self._tail = list(context)[-trie.prefix_len:]  # last L_p committed tokens
        self._pending: tuple[DraftTree, int] | None = None  # (candidates, verified size)
        self.source = "prompt"  # what the trie was built from: "documents" or "prompt"
        self.num_documents = 0
        self.num_answers = 0  # earlier answers (an AnswerStore's) inserted as documents
        self.build_s = 0.0  # seconds to build the trie

    @classmethod
    def for_request(cls, config: DraftConfig, prompt: Sequence[int],
                    documents: Sequence[Sequence[int]] | None = None, *,
                    budget: DraftBudget | None = None, method: str | None = None,
                    num_draft: int | None = None,
                    answers: Sequence[Sequence[int]] = ()) -> Drafter:
        """A drafter over ``documents`` (each its own document, the answer one more),
        or, with none, over the prompt continued by the answer.

        ``answers`` (earlier answers of the same scope, oldest first, e.g.
        :meth:`AnswerStore.answers`) go in first, each a document of its own: the trie
        drops its oldest tokens first, so a full trie loses old answers before this
        request's documents, and frequencies count the answers like any document.
        """
        start = time.perf_counter()
        trie = NGramTrie(config.n, config.prefix_len, config.max_trie_tokens)
        for answer in answers:
            trie.add_document(answer)
        if documents:
            for doc in documents:
                trie.add_document(doc)
            trie.add_document([])  # the answer is a document of its own
        else:
            trie.add_document(prompt)  # the answer continues the prompt
        drafter = cls(trie, prompt, method=method or config.method,
                      num_draft=num_draft or config.num_draft, budget=budget)
        drafter.source = "documents" if documents else "prompt"
        drafter.num_documents = len(documents) if documents else 0
        drafter.num_answers = len(answers)
        drafter.build_s = time.perf_counter() - start
        return drafter

    def propose(self, room: int) -> DraftTree:
        """The draft tree for the next step, at most ``room`` tokens deep (empty: no
        match, or no room: a plain step)."""
        candidates = self._propose(self.trie, self._tail, self.num_draft, room)
        tree = candidates
        if self.budget is not None and len(candidates):
            tree = candidates.top(self.budget.choose(candidates))
        self._pending = (candidates, len(tree))
        return tree

    def update(self, emitted: Sequence[int], step_seconds: float | None = None) -> None:
        """Learn from the tokens a step emitted (accepted path + bonus token).

        After a :meth:`propose`, the budget learns which candidates were right and, with
        ``step_seconds`` (the verification forward's wall time), what the tree cost.
        Tokens committed without a step (prefill's) just extend the trie.
        """
        pending, self._pending = self._pending, None
        if pending is not None and self.budget is not None:
            candidates, verified = pending
            if step_seconds is not None:
                self.budget.record_latency(1 + verified, step_seconds)
            self.budget.observe(candidates, emitted)
        self.trie.extend(emitted)
        self._tail = (self._tail + list(emitted))[-self.trie.prefix_len:]

"""The context-QA prompt shared by the CLI, the demo and the benchmark, in the form the
model takes: one user message through the chat template for an instruction-tuned model,
a completion prompt for a base model (which has no chat template).

:func:`rag_request` makes that choice, once, for every caller that builds the prompt
itself: a builder that knows its text writes the completion form a base model answers
best. Chat messages that reach a base model any other way are read as the plain text
:func:`~ngram_trie_rag.inputs.messages_as_text` writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .inputs import Prompt, has_chat_template

INSTRUCTION = "Answer the question based on the context."
TEMPLATE = "Context:\n{context}\n\nQuestion: {question}\n" + INSTRUCTION
# The instruction first, then the exchange left open at "Answer:": a base model reads
# a question and continues with its answer. (Tried on the sample documents: with the
# instruction after the question, as in the chat message, Gemma-3-270M more often
# repeated a heading or an answer to another question.)
COMPLETION_TEMPLATE = INSTRUCTION + "\n\nContext:\n{context}\n\nQuestion: {question}\n{note}Answer:"
#: Where a base model's answer ends: see :data:`RagRequest.stop`.
COMPLETION_STOPS = ("\n\n", "\nQuestion:")


@dataclass(frozen=True)
class RagRequest:
    """A context-QA prompt in the model's form, and the strings that end its answer.

    ``stop`` is empty for a chat model: its template's end-of-turn token ends the answer.
    A base model has no such token and, having answered, goes on with the pattern it
    was shown: a blank line and a question of its own ("E2 means the water tank is
    empty.\\n\\nQuestion: What does error code E3 mean?..."). So its answer ends at a
    blank line, or at "\\nQuestion:" after a single line break. A single line break is
    no stop: answers copied from the documents keep their wrapped lines. The price is
    that a multi-paragraph answer keeps its first paragraph only.

    Stop strings cut text, never tokens: generation keeps the tokens up to the one
    that completed the stop string, a prefix of what plain greedy decoding makes.
    """

    prompt: Prompt
    stop: tuple[str, ...] = ()


def rag_prompt(documents: Sequence[str], question: str, note: str = "") -> str:
    """The passages, then the question: one user message for the chat template.

    The same shape as HAGRID's prompts; small instruction-tuned models answer it better
    than numbered-document templates. ``note``: a further instruction (an answer format),
    after a blank line at the end.
    """
    text = TEMPLATE.format(context=_context(documents), question=_question(question))
    return f"{text}\n\n{note}" if note else text


def rag_completion(documents: Sequence[str], question: str, note: str = "") -> str:
    """The same instruction, passages and question as plain text ending in "Answer:",
    for a base model to continue; ``note`` goes on the line before "Answer:"."""
    return COMPLETION_TEMPLATE.format(context=_context(documents),
                                      question=_question(question),
                                      note=f"{note}\n" if note else "")


def rag_messages(documents: Sequence[str], question: str,
                 note: str = "") -> list[dict[str, str]]:
    return [{"role": "user", "content": rag_prompt(documents, question, note)}]


def rag_request(tokenizer: Any, documents: Sequence[str], question: str,
                note: str = "") -> RagRequest:
    """The context-QA prompt for this tokenizer's model: one user message when it has a
    chat template (:func:`rag_messages`), else the completion prompt and its stop strings.
    ``note``: a further instruction, e.g. the answer format a grammar enforces."""
    if has_chat_template(tokenizer):
        return RagRequest(rag_messages(documents, question, note))
    return RagRequest(rag_completion(documents, question, note), COMPLETION_STOPS)


def user_prompt(tokenizer: Any, message: str) -> Prompt:
    """A ready-made message (a benchmark row's whole prompt): through the chat template
    when the model has one, else the text as it is."""
    if has_chat_template(tokenizer):
        return [{"role": "user", "content": message}]
    return message


def before_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first stop string: what a stream stopped by ``stop`` shows,
    for answers generated to a fixed length."""
    cuts = [i for s in stop if (i := text.find(s)) >= 0]
    return text[:min(cuts)] if cuts else text


def _context(documents: Sequence[str]) -> str:
    return "\n\n".join(d.strip() for d in documents)


def _question(question: str) -> str:
    if not question.strip():
        raise ValueError("the question is empty")
    return question.strip()

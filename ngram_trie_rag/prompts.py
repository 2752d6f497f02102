"""The context-QA prompt shared by the CLI, the demo and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence

TEMPLATE = "Context:\n{context}\n\nQuestion: {question}\nAnswer the question based on the context."


def rag_prompt(documents: Sequence[str], question: str) -> str:
    """The passages, then the question: one user message for the chat template.

    The same shape as HAGRID's prompts; small instruction-tuned models answer it better
    than numbered-document templates.
    """
    if not question.strip():
        raise ValueError("the question is empty")
    context = "\n\n".join(d.strip() for d in documents)
    return TEMPLATE.format(context=context, question=question.strip())


def rag_messages(documents: Sequence[str], question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": rag_prompt(documents, question)}]

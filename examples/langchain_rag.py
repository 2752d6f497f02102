"""A LangChain RAG chain whose answers are drafted from the retrieved passages.

Run from the repository root:

    python examples/langchain_rag.py [--max-tokens N] ["your question"]

The chain is the usual LCEL one; nothing in it mentions drafting. The model finds the
passages this call retrieved, drafts from them, and prints the same answer plain decoding
gives, with how many tokens each verification step produced.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_ngram_trie import ChatNGramTrie, NGramTrieRetriever

from ngram_trie_rag.retrieval import Retriever

DOCS = Path(__file__).resolve().parent / "sample_docs"
QUESTION = "How often should the Aurora K3 be descaled?"


def format_docs(docs) -> str:
    return "\n\n".join(doc.page_content for doc in docs)


def main(question: str, max_tokens: int = 96) -> None:
    retriever = NGramTrieRetriever(retriever=Retriever.build(DOCS), k=3)
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer using only this context.\n\nContext:\n{context}"),
        ("human", "{question}"),
    ])
    llm = ChatNGramTrie(max_tokens=max_tokens)
    rag = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt

    llm.invoke("Hi", max_tokens=1)  # load the model before timing
    answers = []
    for label, model in (("plain decoding", llm.bind(method="none")),
                         ("drafted from documents", llm)):
        start = time.perf_counter()
        message = (rag | model).invoke(question)
        elapsed = time.perf_counter() - start
        spec = message.response_metadata["speculative"]
        print(f"--- {label}: {elapsed:.2f} s, {spec['mean_accept_length']:.2f} tokens/step")
        print(message.content)
        answers.append(message.content)
    print("drafted from:", [d["id"] for d in spec["documents"]])
    print("same answer:", answers[0] == answers[1])
    # The chain is ordinary LCEL: add a parser, batch it, stream it, as usual.
    chain = rag | llm | StrOutputParser()
    print("streamed:", "".join(chain.stream("What does error E2 mean?")))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("question", nargs="*", help=f"default: {QUESTION!r}")
    parser.add_argument("--max-tokens", type=int, default=96, help="answer length cap")
    args = parser.parse_args()
    main(" ".join(args.question) or QUESTION, args.max_tokens)

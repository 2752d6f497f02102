"""Which model the LangChain classes run, the way langchain-huggingface takes models: a
name (hub id, folder, ``.gguf``; ``model_id`` is the same setting) or a model already
loaded with its tokenizer. A loaded model answers exactly as the same model by folder, the
traced and dumped names are the model's, and keywords nobody reads are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.callbacks import StdOutCallbackHandler
from langchain_core.messages import HumanMessage
from wrapper_refusals import assert_loaded_model_refused_on_vllm, assert_placement_refused

from langchain_ngram_trie import ChatNGramTrie, NGramTrieLLM

URL = "http://127.0.0.1:8000/v1"
FACT = ("Socrates was born in Alopece, a deme of Athens, around 470 BC. He was the son of "
        "Sophroniscus, a stonemason, and Phaenarete, a midwife.")
QUESTION = f"{FACT}\n\nWhere was Socrates born?"
CLASSES = [ChatNGramTrie, NGramTrieLLM]


def text(answer) -> str:
    return answer if isinstance(answer, str) else answer.content


@pytest.mark.parametrize("cls", CLASSES)
def test_a_loaded_model_answers_as_the_same_model_by_folder(cls, loaded_model,
                                                            model_folder) -> None:
    model, tokenizer = loaded_model
    by_object = cls(model=model, tokenizer=tokenizer, max_tokens=8)
    by_folder = cls(model=model_folder, max_tokens=8)
    expected = text(by_folder.invoke(QUESTION, documents=[FACT]))
    assert expected
    assert text(by_object.invoke(QUESTION, documents=[FACT])) == expected
    assert by_object.active_backend.generator.model is model  # run as given, not reloaded
    # The tokenizer by name: loaded from it.
    by_name = cls(model=model, tokenizer=model_folder, max_tokens=8)
    assert text(by_name.invoke(QUESTION, documents=[FACT])) == expected


def test_the_loaded_models_name_is_traced_and_dumped(loaded_model, model_folder) -> None:
    model, tokenizer = loaded_model
    llm = ChatNGramTrie(model=model, tokenizer=tokenizer, max_tokens=8)
    assert llm.model_label == model_folder  # where it was loaded from (config._name_or_path)
    assert llm._identifying_params["model"] == model_folder
    assert llm._get_ls_params()["ls_model_name"] == model_folder
    assert llm.model_dump()["model"] == model_folder and "tokenizer" not in llm.model_dump()
    assert llm.model_dump_json()  # nothing unserialisable left
    assert "LlamaForCausalLM(" not in repr(llm) and model_folder in repr(llm)
    message = llm.invoke([HumanMessage(QUESTION)])
    assert message.response_metadata["model_name"] == model_folder
    plain = NGramTrieLLM(model=model, tokenizer=tokenizer)
    assert plain.asdict()["model"] == model_folder
    # A model loaded by name with a tokenizer of the caller's: both used.
    named = ChatNGramTrie(model=model_folder, tokenizer=tokenizer, max_tokens=8)
    assert named.invoke([HumanMessage(QUESTION)]).content == message.content
    assert named.active_backend.generator.tokenizer is tokenizer
    # A name is reported as given, and no model means the packaged default.
    assert ChatNGramTrie(model="org/some-model")._identifying_params["model"] == "org/some-model"
    assert ChatNGramTrie().model_label == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize("cls", CLASSES)
def test_model_id_is_the_same_setting_as_model(cls, model_folder) -> None:
    assert cls(model_id="org/some-model").model == "org/some-model"
    assert cls(model=Path(model_folder)).model == model_folder  # a path, as text
    with pytest.raises(ValueError, match="'model_id' and 'model' name one setting"):
        cls(model_id="org/a", model="org/b")
    assert cls(base_url=URL, timeout=5).request_timeout == 5  # LangChain's standard name
    with pytest.raises(ValueError, match=r"model takes a hub id, a folder or a \.gguf path "
                                         r"\(str\), or a loaded transformers model"):
        cls(model=3)


@pytest.mark.parametrize("cls", CLASSES)
def test_unknown_keywords_are_refused_with_a_did_you_mean(cls) -> None:
    name = cls.__name__
    with pytest.raises(ValueError, match=rf"unknown {name} keyword\(s\) 'max_token' "
                                         r"\(did you mean 'max_tokens'\?\)"):
        cls(model="org/some-model", max_token=16)
    with pytest.raises(ValueError, match=r"'temprature' \(did you mean 'temperature'\?\)"):
        cls(temprature=0.5)


@pytest.mark.parametrize("cls", CLASSES)
def test_langchains_and_huggingfaces_keywords_are_accepted(cls) -> None:
    """LangChain's own fields, and the HuggingFacePipeline keywords this package reads
    (building loads nothing)."""
    llm = cls(callbacks=[StdOutCallbackHandler()], tags=["t"], metadata={"k": 1},
              verbose=True, cache=False, name="mine", custom_get_token_ids=None,
              model_id="org/some-model", device_map="auto",
              model_kwargs={"attn_implementation": "eager", "token": "hf_secret"},
              tokenizer_kwargs={"use_fast": True},
              chat_template_kwargs={"enable_thinking": False}, max_tokens=16)
    assert llm.tags == ["t"] and llm.name == "mine" and llm.model == "org/some-model"
    assert llm.backend_settings().model_kwargs == {
        "attn_implementation": "eager", "token": "hf_secret", "device_map": "auto"}
    params = llm._identifying_params
    assert params["device_map"] == "auto" and params["model_kwargs"]["token"] == "***"
    # The token reaches the loader only: never a trace, a cache key, a repr or a dump.
    for shown in (str(params), repr(llm), str(llm.model_dump()), llm.model_dump_json()):
        assert "hf_secret" not in shown
    if cls is ChatNGramTrie:
        assert cls(streaming=True, disable_streaming=True, rate_limiter=None).streaming


def test_loader_settings_that_cannot_apply_are_refused(loaded_model) -> None:
    model, tokenizer = loaded_model
    assert_placement_refused(ChatNGramTrie)
    with pytest.raises(ValueError, match="device, dtype cannot be used with a loaded model"):
        ChatNGramTrie(model=model, tokenizer=tokenizer, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="model_kwargs cannot be used with a loaded model"):
        NGramTrieLLM(model=model, model_kwargs={"attn_implementation": "eager"})
    with pytest.raises(ValueError, match="tokenizer_kwargs cannot be used with a loaded "
                                         "tokenizer"):
        NGramTrieLLM(model=model, tokenizer=tokenizer, tokenizer_kwargs={"use_fast": True})


@pytest.mark.parametrize("cls", CLASSES)
def test_a_loaded_model_is_refused_on_vllm(cls, loaded_model) -> None:
    model, _ = loaded_model
    assert_loaded_model_refused_on_vllm(cls, model)
    with pytest.raises(ValueError, match=r"device_map cannot be used .* 'vllm'"):
        cls(model="org/some-model", backend="vllm", device_map="auto")
    with pytest.raises(ValueError, match=r"tokenizer cannot be used .* 'vllm-server'"):
        cls(model="served", base_url=URL, tokenizer="org/tok")


def test_a_hub_id_loads_through_the_hub_cache(offline_hub, model_folder) -> None:
    """A hub id resolved by Transformers from a hub cache (offline): the same answer as
    the folder it was laid out from, and the id as the model's name."""
    hub_id = offline_hub
    by_id = ChatNGramTrie(model_id=hub_id, max_tokens=8)
    message = by_id.invoke([HumanMessage(QUESTION)], documents=[FACT])
    expected = ChatNGramTrie(model=model_folder, max_tokens=8).invoke([HumanMessage(QUESTION)],
                                                                documents=[FACT])
    assert message.content == expected.content
    assert by_id.model_label == message.response_metadata["model_name"] == hub_id
    assert by_id.active_backend.generator.model.config._name_or_path == hub_id

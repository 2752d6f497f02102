"""Tools, structured output and JSON mode on the chat model, against the packaged model:
calls come back as LangChain tool calls whether invoked or streamed, stay speculative and
exact, tool turns render back into the chat, and vLLM refuses what it cannot constrain."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from ngram_trie_rag.backends import Answer
from pydantic import BaseModel, Field

from langchain_ngram_trie import ChatNGramTrie
from langchain_ngram_trie.messages import to_chat, with_instruction
from langchain_ngram_trie.tools import as_tool_calls, tool_choice_name

WEATHER_QUESTION = "What is the weather in Paris?"


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "It's sunny."


@tool
def search_docs(query: str) -> str:
    """Search the documentation."""
    return "nothing found"


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(description="the person's name")
    born: int = Field(description="year of birth")


PERSON_TEXT = "Ada Lovelace was born in 1815 in London. Who is mentioned, and when were they born?"


@pytest.fixture(scope="module")
def llm() -> ChatNGramTrie:
    return ChatNGramTrie(max_tokens=64)


def test_a_tool_call_comes_back_the_same_invoked_or_streamed(llm) -> None:
    bound = llm.bind_tools([search_docs, get_weather], tool_choice="any")
    message = bound.invoke(WEATHER_QUESTION)
    assert message.content == ""
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert message.tool_calls[0]["id"].startswith("call_")
    assert message.usage_metadata["output_tokens"] > 0
    assert message.response_metadata["speculative"]["steps"] >= 1

    full = None
    for chunk in bound.stream(WEATHER_QUESTION):
        full = chunk if full is None else full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert full.usage_metadata == message.usage_metadata


async def test_async_calls_match_the_sync_ones(llm) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    message = await bound.ainvoke(WEATHER_QUESTION)
    full = None
    async for chunk in bound.astream(WEATHER_QUESTION):
        full = chunk if full is None else full + chunk
    assert message.tool_calls[0]["args"] == full.tool_calls[0]["args"] == {"city": "Paris"}


def test_the_grammar_keeps_speculative_answers_equal_to_plain_decoding(llm) -> None:
    bound = llm.bind_tools([search_docs, get_weather])
    fast = bound.invoke(WEATHER_QUESTION)
    plain = bound.invoke(WEATHER_QUESTION, method="none")
    assert fast.tool_calls[0]["args"] == plain.tool_calls[0]["args"]
    assert fast.usage_metadata == plain.usage_metadata
    assert plain.response_metadata["speculative"]["method"] == "none"


def test_tool_choice_names_a_tool_and_none_gives_text(llm) -> None:
    forced = llm.bind_tools([search_docs, get_weather], tool_choice="search_docs")
    assert forced.invoke(WEATHER_QUESTION).tool_calls[0]["name"] == "search_docs"
    text = llm.bind_tools([get_weather], tool_choice="none").invoke("Say hello.",
                                                                     max_tokens=8)
    assert text.tool_calls == [] and isinstance(text.content, str) and text.content


def test_a_conversation_with_calls_and_results_continues(llm) -> None:
    bound = llm.bind_tools([get_weather])
    call = bound.invoke(WEATHER_QUESTION)
    result = get_weather.invoke(call.tool_calls[0])
    answer = bound.invoke([HumanMessage(WEATHER_QUESTION), call, result])
    assert isinstance(answer, AIMessage)


def test_with_structured_output_by_each_method(llm) -> None:
    # The shape is the grammar's guarantee; the values are the model's (it gets the year
    # wrong), so only the name, copied from the prompt, is checked.
    for method in ("json_schema", "function_calling"):
        person = llm.with_structured_output(Person, method=method).invoke(PERSON_TEXT)
        assert isinstance(person, Person) and "Lovelace" in person.name, method
    as_dict = llm.with_structured_output(Person.model_json_schema()).invoke(PERSON_TEXT)
    assert set(as_dict) == {"name", "born"} and isinstance(as_dict["born"], int)
    raw = llm.with_structured_output(Person, include_raw=True).invoke(PERSON_TEXT)
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Person)
    assert json.loads(raw["raw"].content) == raw["parsed"].model_dump()


def test_json_mode_gives_a_json_object(llm) -> None:
    message = llm.bind(response_format={"type": "json_object"}).invoke(
        "Name three colours, as JSON.")
    assert isinstance(json.loads(message.content), dict)
    parsed = llm.with_structured_output(None, method="json_mode").invoke(PERSON_TEXT)
    assert isinstance(parsed, dict)


def test_bad_formats_fail_before_generating(llm) -> None:
    with pytest.raises(ValueError, match="names no|neither"):
        llm.bind_tools([get_weather], tool_choice="search_docs")
    with pytest.raises(ValueError, match="unknown response_format type"):
        llm.bind(response_format={"type": "yaml"}).invoke("hi")
    with pytest.raises(ValueError, match="unknown method"):
        llm.with_structured_output(Person, method="xml")


def test_tool_choice_spellings() -> None:
    names = ["get_weather", "search_docs"]
    assert [tool_choice_name(c, names) for c in (None, "auto", "any", "required", True,
                                                 "none", "get_weather")] == [
        "auto", "auto", "required", "required", "required", "none", "get_weather"]
    assert tool_choice_name({"type": "function", "function": {"name": "search_docs"}},
                            names) == "search_docs"
    assert tool_choice_name({"type": "tool", "name": "get_weather"}, names) == "get_weather"
    assert tool_choice_name({"type": "any"}, names) == "required"


def test_replies_parse_into_content_or_calls() -> None:
    def reply(text: str) -> tuple[str | None, list]:
        answer = Answer(text, "eos", 1, 1, "m", "local", {}).parsed()
        return answer.content, as_tool_calls(answer.tool_calls)

    assert reply('{"content": "Hi!"}') == ("Hi!", [])
    content, calls = reply(
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}')
    assert content == "" and calls[0]["args"] == {"city": "Oslo"} and calls[0]["id"]
    assert reply('{"tool_calls": [{"na') == ('{"tool_calls": [{"na', [])


def test_tool_turns_render_as_the_model_writes_and_reads_them() -> None:
    chat = to_chat([
        SystemMessage("Be brief."),
        HumanMessage("What is 1 + 2?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1",
                                   "type": "tool_call"}]),
        ToolMessage('{"result": 3}', tool_call_id="c1"),
        ToolMessage("Missing b", tool_call_id="c1", name="add", status="error"),
    ])
    assert chat[2] == {"role": "assistant", "content":
                       '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'}
    assert chat[3] == {"role": "tool", "content": 'Result of add (call c1): {"result": 3}'}
    assert chat[4]["content"] == "Error from add (call c1): Missing b"
    merged = with_instruction(chat, "Reply with JSON.")
    assert merged[0] == {"role": "system", "content": "Be brief.\n\nReply with JSON."}
    assert with_instruction(chat[1:], "Reply with JSON.")[0]["role"] == "system"

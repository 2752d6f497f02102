"""Tool calling and structured output with the packaged model (greedy): replies decoded
under a grammar, parsed into LlamaIndex's types, token-identical to plain decoding, and
drafted from the same sources as any call."""

from __future__ import annotations

import json

import pytest
from li_support import llm_text
from llama_index.core.agent.workflow import AgentStream, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool, QueryEngineTool, ToolMetadata
from ngram_trie_rag.decoding.grammar import Grammar
from pydantic import BaseModel, Field

from llama_index.llms.ngram_trie import NGramTrieLLM
from llama_index.llms.ngram_trie.tools import (
    complete_calls,
    inline_refs,
    reply_message,
    streamed_content,
    template_messages,
    tool_choice,
    tool_selections,
    tool_spec,
)

QUESTION = "What is the weather in Paris?"
WEATHER = "It is sunny and 21 degrees in Paris."
SYSTEM = "Answer the user's question from the tool results."


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER


def search_docs(query: str) -> str:
    """Search the documentation for a query."""
    return "no results"


TOOLS = [FunctionTool.from_defaults(search_docs), FunctionTool.from_defaults(get_weather)]


class City(BaseModel):
    name: str
    country: str
    population_millions: float


CITY_PROMPT = PromptTemplate("Describe the city of {city}.")


@pytest.fixture(scope="module")
def llm(li_llm):
    """Room for a whole reply: tool JSON is longer than the session fixture's answers."""
    return NGramTrieLLM(generator=li_llm.generator, max_new_tokens=48)


@pytest.fixture(scope="module")
def weather_call(llm):
    return llm.chat_with_tools(TOOLS, user_msg=QUESTION)


def fed_back(call_message: ChatMessage) -> list[ChatMessage]:
    """The conversation after the weather call ran, as an agent's memory holds it."""
    [call] = tool_selections(call_message)
    return [ChatMessage(role=MessageRole.SYSTEM, content=SYSTEM),
            ChatMessage(role=MessageRole.USER, content=QUESTION), call_message,
            ChatMessage(role=MessageRole.TOOL, content=get_weather(**call.tool_kwargs),
                        additional_kwargs={"tool_call_id": call.tool_id})]


# ---- tool calls -----------------------------------------------------------------------
def test_chat_with_tools_picks_the_tool_with_valid_arguments(llm, weather_call):
    [call] = llm.get_tool_calls_from_response(weather_call)
    assert (call.tool_name, call.tool_kwargs) == ("get_weather", {"city": "Paris"})
    assert call.tool_id.startswith("call_")
    assert not weather_call.message.content  # a call, no answer text
    assert weather_call.message.additional_kwargs["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert json.loads(weather_call.raw["reply"]) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert weather_call.raw["speculative"]["forced_tokens"] > 0  # JSON scaffolding drafted
    assert llm.metadata.is_function_calling_model


def test_tool_calls_equal_plain_decoding(llm, weather_call):
    plain = llm.chat_with_tools(TOOLS, user_msg=QUESTION, method="none")
    assert plain.raw["token_ids"] == weather_call.raw["token_ids"]
    assert plain.raw["speculative"]["method"] == "none"


def test_tool_required_and_a_named_tool_force_a_call(llm):
    required = llm.chat_with_tools(TOOLS, user_msg="Say hello.", tool_required=True)
    [call] = llm.get_tool_calls_from_response(required)
    tool = {t.metadata.name: t for t in TOOLS}[call.tool_name]
    tool.metadata.fn_schema.model_validate(call.tool_kwargs)  # arguments fit its schema
    named = llm.chat_with_tools(TOOLS, user_msg=QUESTION, tool_choice="search_docs")
    [call] = llm.get_tool_calls_from_response(named)
    assert call.tool_name == "search_docs" and isinstance(call.tool_kwargs["query"], str)


def test_tool_results_fed_back_give_a_final_answer(llm, weather_call):
    history = fed_back(weather_call.message)
    rendered = template_messages(history)  # roles the chat template knows
    assert [m.role for m in rendered] == [MessageRole.SYSTEM, MessageRole.USER,
                                          MessageRole.ASSISTANT, MessageRole.USER]
    assert json.loads(rendered[2].content)["tool_calls"][0]["name"] == "get_weather"
    assert rendered[3].content == f"Result of get_weather: {WEATHER}"
    final = llm.chat_with_tools(TOOLS, chat_history=history)
    assert llm.get_tool_calls_from_response(final, error_on_no_tool_call=False) == []
    assert "sunny" in final.message.content  # read from the tool's result
    assert json.loads(final.raw["reply"]) == {"content": final.message.content}
    with pytest.raises(ValueError, match="expected at least one tool call"):
        llm.get_tool_calls_from_response(final)
    plain = llm.chat_with_tools(TOOLS, chat_history=history, method="none")
    assert plain.raw["token_ids"] == final.raw["token_ids"]


def test_streamed_call_equals_the_whole_one(llm, weather_call):
    chunks = list(llm.stream_chat_with_tools(TOOLS, user_msg=QUESTION))
    assert "".join(c.delta or "" for c in chunks) == ""  # no answer text around a call
    [call] = llm.get_tool_calls_from_response(chunks[-1])
    assert (call.tool_name, call.tool_kwargs) == ("get_weather", {"city": "Paris"})
    assert chunks[-1].raw["token_ids"] == weather_call.raw["token_ids"]


async def test_async_streamed_answer_shows_text_not_json(llm, weather_call):
    history = fed_back(weather_call.message)
    whole = await llm.achat_with_tools(TOOLS, chat_history=history)
    chunks = [c async for c in await llm.astream_chat_with_tools(TOOLS, chat_history=history)]
    assert len(chunks) > 1
    assert "".join(c.delta or "" for c in chunks) == whole.message.content
    assert chunks[-1].message.content == whole.message.content
    assert all(not c.message.content.startswith("{") for c in chunks)


# ---- structured output ------------------------------------------------------------------
def test_structured_predict_is_a_valid_object_drafted_like_any_call(llm, li_calls):
    city = llm.structured_predict(City, CITY_PROMPT, city="Paris")
    assert isinstance(city, City) and city.name == "Paris"
    plain = llm.structured_predict(City, CITY_PROMPT, llm_kwargs={"method": "none"},
                                   city="Paris")
    assert plain == city
    notes = "Paris is the capital of France, with 2.1 million inhabitants."
    llm.structured_predict(City, CITY_PROMPT, llm_kwargs={"documents": [notes]}, city="Paris")
    assert li_calls.raws()[-1]["draft_origin"] == "documents"
    assert li_calls.raws()[-1]["draft_texts"] == [notes]


async def test_astructured_predict_equals_sync(llm):
    sync = llm.structured_predict(City, CITY_PROMPT, city="Rome")
    assert await llm.astructured_predict(City, CITY_PROMPT, city="Rome") == sync


def test_stream_structured_predict_fills_the_object(llm):
    partials = list(llm.stream_structured_predict(City, CITY_PROMPT, city="Rome"))
    assert len(partials) > 2
    assert partials[-1] == llm.structured_predict(City, CITY_PROMPT, city="Rome")
    names = [getattr(p, "name", None) for p in partials]
    assert names[0] in (None, "") and names[-1] == "Rome"  # filled in as it streams


async def test_astream_structured_predict_ends_with_the_object(llm):
    stream = await llm.astream_structured_predict(City, CITY_PROMPT, city="Rome")
    partials = [p async for p in stream]
    assert isinstance(partials[-1], City)
    assert partials[-1] == llm.structured_predict(City, CITY_PROMPT, city="Rome")


def test_as_structured_llm(llm):
    structured = llm.as_structured_llm(City)
    message = ChatMessage(role=MessageRole.USER, content="Describe the city of Paris.")
    response = structured.chat([message])
    assert isinstance(response.raw, City)
    assert City.model_validate_json(response.message.content) == response.raw


def test_grammar_constrains_any_call(llm):
    response = llm.complete("Is Paris in France? Answer yes or no.",
                            grammar=Grammar.regex("(yes|no)"))
    assert response.text in ("yes", "no")


# ---- an agent with a retriever tool ---------------------------------------------------------
class Lookup(BaseModel):
    input: str = Field(description="the name of who or what to look up", max_length=32)


async def test_function_agent_with_a_retriever_tool(li_index, llm, li_calls):
    engine = li_index.as_query_engine(llm=llm, similarity_top_k=1)
    tool = QueryEngineTool(engine, metadata=ToolMetadata(
        name="search_wiki", description="Look up a person, place or thing in the wiki.",
        fn_schema=Lookup))
    agent = FunctionAgent(tools=[tool], llm=llm, initial_tool_choice="search_wiki",
                          allow_parallel_tool_calls=False,
                          system_prompt="Answer questions with the search_wiki tool.")
    handler = agent.run("Who was Evan Morris?", max_iterations=3)
    results, streamed = [], []
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            results.append(event)
        elif isinstance(event, AgentStream):
            streamed.append(event.delta)
    output = await handler
    [result] = results  # the forced call, then an answer
    assert result.tool_name == "search_wiki" and not result.tool_output.is_error
    Lookup.model_validate(result.tool_kwargs)
    # The query engine behind the tool drafted from the nodes its synthesizer received.
    nodes = result.tool_output.raw_output.source_nodes
    [query_call] = [r for r in li_calls.raws() if r["draft_origin"] == "retrieved_nodes"]
    assert query_call["draft_texts"] == llm_text(nodes)
    answer = output.response.content
    assert answer and not tool_selections(output.response) and not answer.startswith("{")
    assert "".join(streamed) == answer


# ---- the reply format's pieces, without the model ---------------------------------------
def test_tool_choice_values():
    specs = [tool_spec(t) for t in TOOLS]
    assert tool_choice(specs, tool_required=False) == "auto"
    assert tool_choice(specs, tool_required=True) == "required"
    assert tool_choice(specs, False, "any") == "required"
    assert tool_choice(specs, True, "get_weather") == "get_weather"
    assert tool_choice(specs, False, {"type": "function",
                                      "function": {"name": "search_docs"}}) == "search_docs"
    with pytest.raises(ValueError, match="tool_choice 'nope'"):
        tool_choice(specs, False, "nope")


def test_nested_argument_schemas_are_inlined():
    class Point(BaseModel):
        x: int

    class Args(BaseModel):
        start: Point
        end: Point | None = None

    inlined = inline_refs(Args.model_json_schema())
    assert "$defs" not in json.dumps(inlined) and "$ref" not in json.dumps(inlined)
    assert inlined["properties"]["start"]["properties"]["x"]["type"] == "integer"


def test_cut_replies_keep_what_is_complete():
    cut = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
           '{"name": "get_weather", "argu')
    assert [(c.name, c.arguments) for c in complete_calls(cut)] == [
        ("get_weather", {"city": "Paris"})]
    assert reply_message(cut).additional_kwargs["tool_calls"][0]["function"]["name"] == (
        "get_weather")
    assert streamed_content('{"content": "It is \\"sunny') == 'It is "sunny'
    assert streamed_content('{"content": "done"} ') == "done"
    assert streamed_content('{"tool_calls": [') == ""
    assert reply_message('{"content": "It was cut her').content == "It was cut her"

"""``with_structured_output`` for the three methods LangChain names.

* ``"json_schema"`` (default): the answer is decoded under the schema's grammar
  (``response_format={"type": "json_schema", ...}``) and parsed;
* ``"json_mode"``: under a JSON-object grammar; the schema, if any, only parses (as
  LangChain's convention for JSON mode has it: the prompt must ask for the keys);
* ``"function_calling"``: BaseChatModel's own machinery, a forced call of the schema as a
  tool through :meth:`ChatNGramTrie.bind_tools`.

Pydantic classes (v1 or v2) come back as instances, TypedDicts and JSON-schema dicts as
dicts; ``include_raw=True`` gives ``{"raw", "parsed", "parsing_error"}``.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass

Method = Literal["json_schema", "json_mode", "function_calling"]
METHODS = ("json_schema", "json_mode", "function_calling")


def output_parser(schema: Any) -> JsonOutputParser:
    """A Pydantic class parses into instances; anything else into dicts."""
    if isinstance(schema, type) and is_basemodel_subclass(schema):
        return PydanticOutputParser(pydantic_object=schema)
    return JsonOutputParser()


def response_format(schema: Any, method: Method) -> dict[str, Any]:
    """OpenAI's ``response_format`` for ``method`` ("json_schema" or "json_mode")."""
    if method == "json_mode":
        return {"type": "json_object"}
    json_schema = convert_to_json_schema(schema)
    return {"type": "json_schema",
            "json_schema": {"name": json_schema.get("title", "response"), "schema": json_schema}}


def structured_runnable(llm: BaseChatModel, schema: Any, method: Method,
                        include_raw: bool) -> Runnable:
    """``llm`` bound to answer in ``schema``'s shape, followed by its parser."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if schema is None and method != "json_mode":
        raise ValueError(f"method {method!r} needs a schema (only 'json_mode' can go without)")
    bound = llm.bind(
        response_format=response_format(schema, method),
        ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
    )
    parser = output_parser(schema)
    if not include_raw:
        return bound | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser,
                                        parsing_error=lambda _: None)
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=bound) | parsed.with_fallbacks([unparsed],
                                                          exception_key="parsing_error")

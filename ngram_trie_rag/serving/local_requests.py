"""An OpenAI request body as the local engine's call: prompt, documents, options.

The local server (:mod:`.local_server`) answers what :class:`~.openai_http.OpenAIHTTPBackend`
sends (and what other OpenAI clients send): every field is either read, accepted because
it changes nothing (``user``, ``n: 1``, ``logprobs: false``...), or refused with a
``ValueError`` naming it. A field nobody reads is never silently dropped: an answer that
ignored ``n: 2`` or ``logprobs: true`` would look like one that honoured it.

Documents travel as vLLM's server takes them, ``"vllm_xargs": {DOCUMENTS: [text, ...]}``
(:data:`~.vllm_proposer.DOCUMENTS`), so one client talks to either server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..decoding.options import GenerationOptions
from .vllm_proposer import DOCUMENTS

# Fields read into the call, per endpoint.
CHAT_FIELDS = frozenset({"messages"})
COMPLETION_FIELDS = frozenset({"prompt"})
READ = frozenset({"model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                  "top_k", "stop", "seed", "stream", "stream_options", "vllm_xargs",
                  "structured_outputs", "response_format"})
# Fields that change nothing about the answer, whatever their value.
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls",
                      "request_id", "skip_special_tokens", "spaces_between_special_tokens"})
# Fields accepted only at the value that asks for nothing (the value OpenAI defaults to).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0),
    "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0), "min_tokens": (None, 0), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "ignore_eos": (None, False), "include_stop_str_in_output": (None, False),
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
}
OPTION_NAMES = {"max_new_tokens": "max_tokens"}  # the core's name -> the request's spelling


@dataclass(frozen=True)
class LocalRequest:
    """One request as the backend takes it, and how to answer it."""

    chat: bool
    prompt: str | list[int] | list[dict[str, str]]
    documents: list[str] | None
    options: GenerationOptions
    stream: bool
    include_usage: bool
    model: str | None


def parse_request(body: Any, *, chat: bool, method: str | None = None) -> LocalRequest:
    """The call a decoded JSON body asks for; ``ValueError``/``TypeError`` say what is
    wrong with it. ``method`` is the server's drafting method (``None``: the backend's)."""
    if not isinstance(body, Mapping):
        raise ValueError(f"the request body must be a JSON object, got {_kind(body)}")
    own = CHAT_FIELDS if chat else COMPLETION_FIELDS
    refuse_unread(body, own)
    prompt = messages(body.get("messages")) if chat else completion_prompt(body.get("prompt"))
    stream = _flag(body, "stream")
    usage = body.get("stream_options") or {}
    if not isinstance(usage, Mapping) or set(usage) - {"include_usage",
                                                       "continuous_usage_stats"}:
        raise ValueError("stream_options takes only include_usage")
    if usage.get("continuous_usage_stats"):
        raise ValueError("stream_options.continuous_usage_stats is not supported")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string, got {_kind(model)}")
    return LocalRequest(chat, prompt, documents(body.get("vllm_xargs")),
                        options(body, method), stream, bool(usage.get("include_usage")),
                        model)


def refuse_unread(body: Mapping[str, Any], own: frozenset[str]) -> None:
    """A ``ValueError`` naming every field this server would not honour."""
    unknown = sorted(k for k in body if k not in own | READ | HARMLESS | set(NEUTRAL))
    if unknown:
        raise ValueError(f"unsupported field(s) {', '.join(unknown)}: this server does not "
                         "read them, and would answer as if they were absent")
    changing = sorted(k for k, ok in NEUTRAL.items()
                      if k in body and not any(_same(body[k], v) for v in ok))
    if changing:
        shown = ", ".join(f"{k}={body[k]!r}" for k in changing)
        raise ValueError(f"unsupported value(s) {shown}: this server gives one choice, "
                         "without logprobs, penalties or tools")


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind (``True == 1`` in Python, not in a request)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


def messages(value: Any) -> list[dict[str, str]]:
    """Chat messages as the chat template takes them: role and text content (an array of
    text parts is joined; other parts are refused)."""
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string role")
        out.append({"role": message["role"], "content": _content(message.get("content"), i)})
    return out


def _content(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ValueError(f"messages[{i}].content: only text parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts")


def completion_prompt(value: Any) -> str | list[int]:
    """A completion prompt: a string, token ids, or a list holding one of them."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if (isinstance(value, list) and value
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value)):
        return value
    raise ValueError("prompt must be a non-empty string or list of token ids (one prompt "
                     "per request)")


def documents(xargs: Any) -> list[str] | None:
    """The request's documents from ``vllm_xargs`` (``None``: draft from the prompt)."""
    if xargs is None:
        return None
    if not isinstance(xargs, Mapping):
        raise ValueError("vllm_xargs must be an object")
    unknown = sorted(set(xargs) - {DOCUMENTS})
    if unknown:
        raise ValueError(f"unsupported vllm_xargs key(s) {', '.join(unknown)}; this server "
                         f"reads {DOCUMENTS}")
    docs = xargs.get(DOCUMENTS)
    if docs is None:
        return None
    if not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
        raise ValueError(f"vllm_xargs.{DOCUMENTS} must be a list of strings")
    return docs


def options(body: Mapping[str, Any], method: str | None = None) -> GenerationOptions:
    """The generation options of a request (checked by ``GenerationOptions`` itself, with
    the request's own field names in its messages)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif stop is not None and not (isinstance(stop, list)
                                   and all(isinstance(s, str) for s in stop)):
        raise ValueError("stop must be a string or a list of strings")
    values = {"max_new_tokens": max_tokens, "temperature": body.get("temperature"),
              "top_p": body.get("top_p"), "top_k": body.get("top_k"),
              "stop": tuple(stop) if stop else None, "seed": body.get("seed"),
              "grammar": grammar(body), "method": method}
    for name in ("max_new_tokens", "top_k", "seed"):
        value = values[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{OPTION_NAMES.get(name, name)} must be an integer, got "
                             f"{value!r}")
    if values["top_k"] == -1:  # vLLM's spelling of "no top-k"
        values["top_k"] = 0
    present = {k: v for k, v in values.items() if v is not None}
    return GenerationOptions(**present, names=OPTION_NAMES)


def grammar(body: Mapping[str, Any]) -> Any:
    """The grammar of ``structured_outputs`` (vLLM's, as :mod:`.structured_outputs` sends
    it) or ``response_format`` (OpenAI's); ``None``: unconstrained."""
    from ..decoding.grammar import Grammar

    found = []
    spec = body.get("structured_outputs")
    if spec is not None:
        if not isinstance(spec, Mapping):
            raise ValueError("structured_outputs must be an object")
        given = {k: v for k, v in spec.items() if v not in (None, False)}
        kinds = {"json": lambda v: Grammar.json_schema(v), "json_object": lambda v: Grammar.json(),
                 "regex": Grammar.regex, "grammar": Grammar.ebnf}
        unknown = sorted(set(given) - set(kinds))
        if unknown:
            raise ValueError(f"unsupported structured_outputs key(s) {', '.join(unknown)}; "
                             f"this server reads one of {', '.join(kinds)}")
        found += [kinds[k](v) for k, v in given.items()]
    form = body.get("response_format")
    if form is not None:
        if not isinstance(form, Mapping) or form.get("type") not in ("text", "json_object",
                                                                     "json_schema"):
            raise ValueError("response_format.type must be text, json_object or json_schema")
        if form["type"] == "json_object":
            found.append(Grammar.json())
        elif form["type"] == "json_schema":
            schema = (form.get("json_schema") or {}).get("schema")
            if not isinstance(schema, (Mapping, str)):
                raise ValueError("response_format.json_schema.schema must be a JSON schema")
            found.append(Grammar.json_schema(dict(schema) if isinstance(schema, Mapping)
                                             else schema))
    if len(found) > 1:
        raise ValueError("give one grammar: structured_outputs or response_format, one kind")
    return found[0] if found else None


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool) and value is not None:
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__

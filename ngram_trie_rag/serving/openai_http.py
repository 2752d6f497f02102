"""A client for vLLM's OpenAI-compatible server that sends each request's documents along.

The server is vLLM's own, started by ``ngram-trie-rag serve`` with the trie proposer in it.
A request's documents travel in the JSON body as ``"vllm_xargs": {DOCUMENTS: [text, ...]}``;
vLLM copies ``vllm_xargs`` into ``SamplingParams.extra_args``, where the proposer finds them.
With no documents none are sent, and the proposer drafts from the prompt.

Standard library only (urllib, plus a few lines of server-sent-event parsing): the two
endpoints used here do not justify an HTTP or OpenAI client dependency in the core package.
Chat messages go to ``/chat/completions`` (the server applies the chat template), a string
prompt to ``/completions`` (tokenised as-is). Async calls run the blocking client on the
generation pool (:mod:`ngram_trie_rag.wrappers.threads`), one worker per call, so concurrent calls
reach the server concurrently and vLLM batches them.

What a call yields is a stream of :class:`Delta`: text deltas, then one last delta with the
finish reason and token counts. The same shape comes from the in-process engine
(:mod:`ngram_trie_rag.serving.vllm_local`), so callers treat both alike.

Speculation statistics: vLLM's responses report per-request acceptance (mean accepted
length, draft acceptance rate, histogram) only when the server runs with
``--per-request-spec-decode-metrics summary``; otherwise ``Delta.speculative`` is ``None``
and nothing is made up. The server's ``/metrics`` always has the aggregate
``vllm:spec_decode_*`` counters.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..decoding.options import GenerationOptions
from ..wrappers.threads import iterate_blocking, run_blocking
from .local_responses import OWNER as LOCAL_OWNER
from .structured_outputs import structured_outputs
from .vllm_proposer import DOCUMENTS

DEFAULT_TIMEOUT_S = 600.0  # seconds a socket read may wait (a whole answer when not streaming)
ERROR_PREVIEW_CHARS = 500

# A completion prompt (a string, tokenised as-is) or chat messages ({"role", "content"}).
Prompt = str | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed answer.

    Invariant of a stream: every delta but the last has ``finish_reason`` ``None`` and
    non-empty ``text``; the last one has ``finish_reason`` set ("eos", "stop" or "length",
    as the local engine names them), ``text`` possibly empty, the token counts, and
    ``speculative`` when the engine reported per-request acceptance. A whole (non-streamed)
    answer is a single last delta holding all the text.
    """

    text: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    speculative: dict[str, Any] | None = None


class ServerError(RuntimeError):
    """The server answered with an error status (or an error event mid-stream)."""

    def __init__(self, status: int | None, message: str, url: str) -> None:
        where = f"HTTP {status} from {url}" if status is not None else f"error from {url}"
        super().__init__(f"{where}: {message}")
        self.status = status
        self.message = message
        self.url = url


# ---- pure parts: request bodies, events, responses ----------------------------------------
def is_chat(prompt: Prompt) -> bool:
    """Chat messages (a list of dicts) rather than a completion prompt (a string)."""
    if isinstance(prompt, str):
        return False
    if not prompt or not all(isinstance(m, Mapping) for m in prompt):
        raise TypeError("prompt must be a string or a non-empty list of chat messages")
    return True


def endpoint(prompt: Prompt) -> str:
    """The path below the base URL that serves ``prompt``."""
    return "chat/completions" if is_chat(prompt) else "completions"


def request_body(model: str, prompt: Prompt, documents: Sequence[str] | None,
                 options: GenerationOptions, *, stream: bool) -> dict[str, Any]:
    """The JSON body of one completion request.

    ``documents`` must be a flat list of strings (vLLM's ``vllm_xargs`` takes nothing
    nested); empty or ``None`` sends none, and the proposer drafts from the prompt.

    >>> request_body("m", "Hi", ["doc"], GenerationOptions(max_new_tokens=4), stream=False)
    {'model': 'm', 'max_tokens': 4, 'temperature': 0.0, 'prompt': 'Hi', \
'vllm_xargs': {'ngram_trie_documents': ['doc']}}
    """
    body: dict[str, Any] = {"model": model, "max_tokens": options.max_new_tokens,
                            "temperature": options.temperature}
    if is_chat(prompt):
        body["messages"] = [dict(m) for m in prompt]
    else:
        body["prompt"] = prompt
    if options.top_p != 1.0:
        body["top_p"] = options.top_p
    if options.top_k > 0:
        body["top_k"] = options.top_k  # a vLLM extension of the OpenAI API
    if options.stop:
        body["stop"] = list(options.stop)
    if options.seed is not None:
        body["seed"] = options.seed
    if options.grammar is not None:
        body["structured_outputs"] = structured_outputs(options.grammar)
    if documents:
        if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
            raise TypeError("documents must be a list of strings")
        body["vllm_xargs"] = {DOCUMENTS: list(documents)}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # token counts on the last event
    return body


def sse_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data`` payloads of a server-sent-event stream, up to ``[DONE]``.

    An event's ``data:`` lines are joined with newlines and dispatched at the blank line
    that ends it; comments (``:``) and other fields (``event:``, ``id:``) are skipped.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload == "[DONE]":
                    return
                yield payload
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data and "\n".join(data) != "[DONE]":  # a stream cut without its last blank line
        yield "\n".join(data)


def finish_reason(reason: str | None, stop_reason: Any = None) -> str | None:
    """OpenAI's finish reason in the local engine's words.

    vLLM reports "stop" both for the end-of-sequence token and for a stop string, and
    tells them apart with ``stop_reason`` (the stop string, else absent or null): a
    string means "stop", anything else "eos". "length" and others pass through.
    """
    if reason == "stop":
        return "stop" if isinstance(stop_reason, str) else "eos"
    return reason


def error_message(body: bytes | str) -> str:
    """The message of an error body (``{"error": {"message": ...}}`` and the like)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:ERROR_PREVIEW_CHARS] or "(empty response)"
    if isinstance(parsed, Mapping):
        error = parsed.get("error", parsed)
        if isinstance(error, Mapping):
            for key in ("message", "detail"):
                if error.get(key):
                    return str(error[key])
        elif error:
            return str(error)
    return text.strip()[:ERROR_PREVIEW_CHARS]


def usage_of(payload: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) of a response or last stream event."""
    usage = payload.get("usage") or {}
    return usage.get("prompt_tokens"), usage.get("completion_tokens")


def speculative_of(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's per-request acceptance metrics, when the server reports them."""
    metrics = payload.get("metrics") or {}
    found = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    return dict(found) if found else None


def choice_text(choice: Mapping[str, Any], chat: bool, streamed: bool) -> str:
    """The text of a choice: a chat message's or delta's content, or a completion's."""
    if not chat:
        return choice.get("text") or ""
    part = choice.get("delta" if streamed else "message") or {}
    return part.get("content") or ""


def whole_answer(payload: Mapping[str, Any], chat: bool) -> Delta:
    """A non-streamed response as one last delta."""
    choices = payload.get("choices") or []
    if not choices:
        raise ValueError("the response has no choices")
    choice = choices[0]
    prompt_tokens, completion_tokens = usage_of(payload)
    return Delta(choice_text(choice, chat, streamed=False),
                 finish_reason(choice.get("finish_reason"), choice.get("stop_reason")),
                 prompt_tokens, completion_tokens, speculative_of(payload))


class StreamAssembler:
    """Turns a stream's decoded events into deltas (see :class:`Delta`'s invariant).

    The finish reason comes with the last text event; the token counts (and metrics) on a
    later event with no choices, sent because the request asked for ``include_usage``.
    """

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.finish: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.speculative: dict[str, Any] | None = None

    def push(self, event: Mapping[str, Any]) -> str:
        """Take one event; its new text ('' if none)."""
        if "error" in event and not event.get("choices"):
            raise ValueError(error_message(json.dumps(event)))
        prompt_tokens, completion_tokens = usage_of(event)
        if prompt_tokens is not None:
            self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        self.speculative = speculative_of(event) or self.speculative
        text = ""
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            text += choice_text(choice, self.chat, streamed=True)
            if choice.get("finish_reason"):
                self.finish = finish_reason(choice["finish_reason"], choice.get("stop_reason"))
        return text

    def last(self) -> Delta:
        """The closing delta; a stream that ended without a finish reason is an error."""
        if self.finish is None:
            raise ValueError("the stream ended before the answer finished")
        return Delta("", self.finish, self.prompt_tokens, self.completion_tokens,
                     self.speculative)


# ---- the client --------------------------------------------------------------------------
class OpenAIHTTPBackend:
    """Completions from a running vLLM OpenAI-compatible server (see the module docstring).

    Thread-safe and cheap: it holds no connection (one per request). ``model`` is the
    served model name; ``None`` asks the server (``/models``) once, on first use.

    Example::

        backend = OpenAIHTTPBackend("http://127.0.0.1:8000/v1", "smollm2")
        for delta in backend.stream([{"role": "user", "content": "Where was Socrates born?"}],
                                    documents=["Socrates was born in Alopece."]):
            print(delta.text, end="")
    """

    name = "vllm-server"  # the kind of backend settings are checked against

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._model = model
        self._card: dict[str, Any] | None = None
        self._lock = threading.Lock()

    # ---- the served model ----------------------------------------------------------------
    def _model_card(self) -> dict[str, Any]:
        """The served model's ``/models`` entry (``model`` or the first one), fetched once."""
        with self._lock:
            if self._card is None:
                with self._open("GET", "models") as response:
                    cards = json.load(response).get("data") or []
                if not cards:
                    raise ServerError(None, "the server serves no model", self._url("models"))
                if self._model is None:
                    self._card = cards[0]
                else:  # a name the server does not list has no card (requests will say so)
                    self._card = next((c for c in cards if c.get("id") == self._model), {})
            return self._card

    @property
    def model_name(self) -> str:
        """The served model name requests carry."""
        if self._model is not None:
            return self._model
        return str(self._model_card()["id"])

    @property
    def served_by(self) -> str:
        """What answers report as their backend: ``"local-server"`` when the server is
        ``ngram-trie-rag serve``'s own batched engine (its ``/models`` card is owned by
        ``ngram-trie-rag``), else ``"vllm-server"``."""
        owner = self._model_card().get("owned_by")
        return "local-server" if owner == LOCAL_OWNER else self.name

    @property
    def context_window(self) -> int | None:
        """The server's ``max_model_len`` for the model, when it reports one."""
        value = self._model_card().get("max_model_len")
        return int(value) if value else None

    # ---- requests --------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return f"{self.base_url}/{path}"

    def _open(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """An open HTTP response; errors become :class:`ServerError` / ``ConnectionError``
        naming the server and, for error statuses, its own message."""
        url = self._url(path)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
            if body.get("stream"):
                headers["Accept"] = "text/event-stream"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                message = error_message(exc.read())
            raise ServerError(exc.code, message, url) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionError(f"cannot reach the server at {url}: {reason} (is "
                                  "`ngram-trie-rag serve` running there?)") from None

    def complete(self, prompt: Prompt, documents: Sequence[str] | None = None,
                 options: GenerationOptions | None = None) -> Delta:
        """Blocking: the whole answer as one last :class:`Delta`."""
        chat = is_chat(prompt)
        body = request_body(self.model_name, prompt, documents, options or GenerationOptions(),
                            stream=False)
        with self._open("POST", endpoint(prompt), body) as response:
            payload = json.load(response)
        try:
            return whole_answer(payload, chat)
        except ValueError as exc:
            raise ServerError(None, str(exc), self._url(endpoint(prompt))) from None

    def stream(self, prompt: Prompt, documents: Sequence[str] | None = None,
               options: GenerationOptions | None = None) -> Iterator[Delta]:
        """Blocking: text deltas as the server sends them, then the last delta. Closing
        the iterator early closes the connection, and vLLM aborts the request."""
        chat = is_chat(prompt)
        body = request_body(self.model_name, prompt, documents, options or GenerationOptions(),
                            stream=True)
        url = self._url(endpoint(prompt))
        assembler = StreamAssembler(chat)
        with self._open("POST", endpoint(prompt), body) as response:
            try:
                for payload in sse_data(response):
                    text = assembler.push(json.loads(payload))
                    if text:
                        yield Delta(text)
                last = assembler.last()
            except ValueError as exc:
                raise ServerError(None, str(exc), url) from None
        yield last

    async def acomplete(self, prompt: Prompt, documents: Sequence[str] | None = None,
                        options: GenerationOptions | None = None) -> Delta:
        """:meth:`complete` on the generation pool; the event loop stays free."""
        return await run_blocking(self.complete, prompt, documents, options)

    async def astream(self, prompt: Prompt, documents: Sequence[str] | None = None,
                      options: GenerationOptions | None = None) -> AsyncIterator[Delta]:
        """:meth:`stream` read on one pool worker; leaving early closes the connection."""
        async for delta in iterate_blocking(lambda: self.stream(prompt, documents, options)):
            yield delta

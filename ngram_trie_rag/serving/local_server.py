"""An OpenAI-compatible HTTP server over the local engine (``ngram-trie-rag serve
--engine local``): the same requests and responses as vLLM's server with the trie
proposer, so :class:`~.openai_http.OpenAIHTTPBackend` and the wrappers' ``base_url=``
reach either one.

Standard library only (``http.server.ThreadingHTTPServer``): one thread per connection,
each calling the *backend*, a :class:`~ngram_trie_rag.SpeculativeGenerator` (it serialises
requests on the model's lock) or a batch scheduler with the same ``stream``/``generate``
(it batches them, and refuses with ``QueueFull`` once its queue is full: HTTP 503).

Endpoints: ``GET /v1/models``, ``GET /health``, ``POST /v1/chat/completions``, ``POST
/v1/completions`` (streamed as server-sent events with ``"stream": true``). What a
request may hold is :mod:`.local_requests`'s; the response shapes :mod:`.local_responses`'.
Errors are OpenAI's ``{"error": {"message", "type", "code"}}``: 400 for a bad request
(``ValueError``/``TypeError`` from parsing or from the backend checking the input), 404
for an unknown path or model, 503 when the backend's queue is full or the server is
stopping, 500 otherwise. Every request runs as a stream, non-streamed ones included, so a
request can be ended between two steps: when its client disconnects (the next write
fails; closing the stream cancels the generation) and when the server stops.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from ..decoding.options import GenerationOptions
from ..decoding.result import GenerationResult
from . import local_responses as shapes
from .local_requests import LocalRequest, parse_request

MAX_BODY_BYTES = 32 << 20  # a request body larger than this is refused (413)
READ_TIMEOUT_S = 60.0  # a client that sends its request no faster than this is dropped
STOP_WAIT_S = 10.0  # how long stopping waits for running requests to end


class Backend(Protocol):
    """What the server calls: :class:`~ngram_trie_rag.SpeculativeGenerator`'s ``stream``
    and ``generate`` (a batch scheduler has the same)."""

    def stream(self, prompt: Any, documents: Sequence[str] | None = None,
               options: GenerationOptions | None = None, **changes: Any) -> Any: ...

    def generate(self, prompt: Any, documents: Sequence[str] | None = None,
                 options: GenerationOptions | None = None,
                 **changes: Any) -> GenerationResult: ...


class HTTPFailure(Exception):
    """An error answer: its status, OpenAI error type and message."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or KINDS.get(status, "InternalServerError")


KINDS = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
         411: "BadRequestError", 413: "BadRequestError", 500: "InternalServerError",
         503: "ServiceUnavailableError"}


def failure_of(exc: BaseException) -> HTTPFailure:
    """The HTTP error an exception from parsing or the backend becomes."""
    from .scheduler import QueueFull  # here: the scheduler imports the engine

    if isinstance(exc, HTTPFailure):
        return exc
    if isinstance(exc, QueueFull):
        return HTTPFailure(503, f"the server is busy: {exc or 'its queue is full'}; retry "
                           "later")
    if isinstance(exc, (ValueError, TypeError)):
        return HTTPFailure(400, str(exc) or type(exc).__name__)
    return HTTPFailure(500, f"{type(exc).__name__}: {exc}")


class LocalServer:
    """The server over ``backend``, listening on ``host``:``port`` (0: a free port, see
    :attr:`port`) from construction; :meth:`serve_forever` or :meth:`start` serve.

    Args:
        backend: see :class:`Backend`.
        model_name: the served model name (``/v1/models``; a request naming another is a
            404); requests may also name ``aliases``.
        context_window: reported as ``max_model_len``.
        method: the drafting method of every request (``"none"``: no drafts); ``None``:
            the backend's own.
        decode: token ids -> text, to name the stop string that ended an answer.
    """

    def __init__(self, backend: Backend, model_name: str, *, host: str = "127.0.0.1",
                 port: int = 0, context_window: int | None = None, method: str | None = None,
                 decode: Any = None, aliases: Sequence[str] = ()) -> None:
        if method is not None:
            GenerationOptions(method=method)  # a bad method fails here, not per request
        self.backend = backend
        self.model_name = model_name
        self.names = {model_name, *aliases}
        self.context_window = context_window
        self.method = method
        self.decode = decode
        self.stopping = threading.Event()
        self._running: set[threading.Thread] = set()
        self._running_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.ended = 0  # requests the server's stopping ended unfinished
        self.httpd = _HTTPServer((host, port), _Handler, self)

    # ---- where it listens -----------------------------------------------------------
    @property
    def host(self) -> str:
        return str(self.httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL clients take (``http://HOST:PORT/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    # ---- running and stopping ---------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`stop` (from another thread) or Ctrl-C, then
        stop: the socket closes, running requests end, the backend is closed."""
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def start(self) -> LocalServer:
        """Serve on a background thread (tests, the benchmark); :meth:`stop` ends it."""
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="local-server", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Stop serving (from any thread but the serving one) and close."""
        self.httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close(timeout)

    def close(self, timeout: float = STOP_WAIT_S) -> int:
        """Close the socket, end running requests (waiting up to ``timeout`` seconds for
        their threads), close the backend when it has ``close()``; the number of requests
        ended unfinished. Idempotent."""
        if self._closed:
            return 0
        self._closed = True
        self.stopping.set()
        self.httpd.server_close()
        with self._running_lock:
            running = list(self._running)
        for thread in running:
            thread.join(timeout)
        closer = getattr(self.backend, "close", None)
        if callable(closer):
            closer()
        return self.ended

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, thread: threading.Thread, running: bool) -> None:
        with self._running_lock:
            (self._running.add if running else self._running.discard)(thread)

    # ---- a request ----------------------------------------------------------------------
    def parse(self, body: Any, chat: bool) -> LocalRequest:
        request = parse_request(body, chat=chat, method=self.method)
        if request.model is not None and request.model not in self.names:
            raise HTTPFailure(404, f"The model `{request.model}` does not exist; this "
                              f"server serves `{self.model_name}`")
        return request

    def open(self, request: LocalRequest) -> Any:
        """The backend's stream for ``request`` (input errors and a full queue raise
        here, before any response is sent)."""
        if self.stopping.is_set():
            raise HTTPFailure(503, "the server is stopping")
        return self.backend.stream(request.prompt, request.documents, request.options)

    def run(self, stream: Any) -> Iterator[str]:
        """The stream's text deltas until it ends or the server stops (then it is closed
        and a 503 raised); the caller closes it when its client leaves."""
        for delta in stream:
            if self.stopping.is_set():
                stream.close()
                with self._running_lock:
                    self.ended += 1
                raise HTTPFailure(503, "the server stopped during this request")
            yield delta

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [shapes.model_card(self.model_name,
                                                             self.context_window)]}

    def finish(self, request: LocalRequest, result: GenerationResult) -> dict[str, Any]:
        return shapes.finish_fields(result, request.options.stop, self.decode)


class _HTTPServer(ThreadingHTTPServer):
    """Daemon handler threads (a stuck client never keeps the process alive), tracked by
    the :class:`LocalServer` so that stopping can wait for them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, owner: LocalServer) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        thread = threading.current_thread()
        self.owner._track(thread, True)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._track(thread, False)


class _Handler(BaseHTTPRequestHandler):
    """One connection, one request (HTTP/1.0: a streamed body ends when the connection
    closes, which every client reads)."""

    server: _HTTPServer
    timeout = READ_TIMEOUT_S
    server_version = "ngram-trie-rag"

    # ---- routing ----------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._guarded(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def _get(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            self._json(200, self.server.owner.models())
        elif path in ("/v1/chat/completions", "/v1/completions"):
            raise HTTPFailure(405, f"{path} takes POST")
        else:
            raise HTTPFailure(404, f"no such endpoint: GET {path}")

    def _post(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/completions"):
            raise HTTPFailure(404, f"no such endpoint: POST {path}")
        owner = self.server.owner
        request = owner.parse(self._body(), chat=path.endswith("chat/completions"))
        stream = owner.open(request)
        try:
            if request.stream:
                self._stream(request, stream)
            else:
                self._whole(request, stream)
        finally:
            stream.close()

    def _guarded(self, action: Any) -> None:
        """Every failure as an OpenAI error body (if no response has started)."""
        try:
            action()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client left; its stream is closed already
        except Exception as exc:  # noqa: BLE001 - every error is an answer, never a hang
            failure = failure_of(exc)
            if failure.status == 500:
                print(f"ngram-trie-rag serve: {failure.message}", file=sys.stderr)
            if getattr(self, "_started", False):
                self._event({"error": shapes.error_body(failure.status, failure.message,
                                                        failure.kind)["error"]},
                            quiet=True)
                self._event("[DONE]", quiet=True)
            else:
                self._json(failure.status, shapes.error_body(failure.status, failure.message,
                                                             failure.kind), quiet=True)

    # ---- bodies ---------------------------------------------------------------------------
    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None:
            raise HTTPFailure(411, "the request needs a Content-Length")
        try:
            size = int(length)
        except ValueError:
            raise HTTPFailure(400, f"bad Content-Length {length!r}") from None
        if size < 0 or size > MAX_BODY_BYTES:
            raise HTTPFailure(413, f"the request body must be 0 to {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(size)
        try:
            return json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            raise HTTPFailure(400, f"the request body is not valid JSON: {exc}") from None

    def _whole(self, request: LocalRequest, stream: Any) -> None:
        owner = self.server.owner
        text = "".join(owner.run(stream))
        result = stream.result
        body = shapes.whole(shapes.new_id(request.chat), owner.model_name, request.chat,
                            text, result, owner.finish(request, result))
        self._json(200, body)

    def _stream(self, request: LocalRequest, stream: Any) -> None:
        owner = self.server.owner
        request_id, chat, model = shapes.new_id(request.chat), request.chat, owner.model_name
        deltas = owner.run(stream)
        first = next(deltas, None)  # errors before the first token are still HTTP errors
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self._started = True
        if chat:
            self._event(shapes.chunk(request_id, model, chat, "", role=True))
        for delta in ([first] if first else []):
            self._event(shapes.chunk(request_id, model, chat, delta))
        for delta in deltas:
            if delta:
                self._event(shapes.chunk(request_id, model, chat, delta))
        result = stream.result
        extra = {"metrics": shapes.metrics(result)}
        self._event(shapes.chunk(request_id, model, chat, "", owner.finish(request, result),
                                 extra=extra))
        if request.include_usage:
            self._event(shapes.chunk(request_id, model, chat,
                                     extra={"usage": shapes.usage(result), **extra}))
        self._event("[DONE]")

    # ---- writing --------------------------------------------------------------------------
    def _json(self, status: int, body: Any, quiet: bool = False) -> None:
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            if not quiet:
                raise

    def _event(self, payload: Any, quiet: bool = False) -> None:
        """One server-sent event, flushed: a write to a client that left raises here,
        and the caller's ``finally`` closes the stream (cancelling the generation)."""
        data = payload if isinstance(payload, str) else json.dumps(payload)
        try:
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()
        except OSError:
            if not quiet:
                raise

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet: one line per request would drown the banner; errors print their own."""


def served_name(model: str) -> str:
    """The served model name for a model path or hub id, as ``serve`` names it for vLLM
    (the last part: ``HuggingFaceTB/SmolLM2-135M-Instruct`` -> ``SmolLM2-135M-Instruct``)."""
    return Path(model).name or model


def for_generator(backend: Backend, generator: Any, *, name: str | None = None,
                  **kwargs: Any) -> LocalServer:
    """A server over ``backend`` (the generator or a scheduler over it), named (``name``,
    else :func:`served_name`), windowed and decoding as ``generator``."""
    tokenizer = generator.tokenizer
    return LocalServer(backend, name or served_name(generator.model_name),
                       context_window=generator.context_window,
                       decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       aliases=(generator.model_name, served_name(generator.model_name)),
                       **kwargs)
